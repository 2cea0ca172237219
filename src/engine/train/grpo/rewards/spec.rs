//! `--reward SPEC`: the text form of a built-in reward. `exact-answer`, `regex=PATTERN`, `format=think-answer`
//! (or `format=REGEX`), `length=BUDGET`, each optionally followed by `@WEIGHT` (`length=200@0.5`). A trailing
//! `@...` is a weight only when it reads as a number, so a pattern may hold `@` (`regex=\w+@\w+`); a pattern that
//! itself ends in `@` and a number takes an explicit weight after it (`regex=a@1@1`).

use crate::engine::train::grpo::settings::{RewardKind, RewardSpec};

const SYNTAX: &str = "use exact-answer, regex=PATTERN, format=think-answer, format=REGEX or length=BUDGET, optionally \
                      followed by @WEIGHT (length=200@0.5); a reward program goes in --reward-program";

impl std::str::FromStr for RewardSpec {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let text = text.trim();
        let weighted = text.rsplit_once('@').and_then(|(body, w)| w.trim().parse::<f64>().ok().map(|w| (body, w)));
        let (body, weight) = match weighted {
            Some((_, weight)) if !weight.is_finite() => {
                return Err(format!("reward `{text}`: the weight {weight} is not a finite number"))
            }
            Some(pair) => pair,
            None => (text, 1.0),
        };
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name.trim(), Some(value)),
            None => (body.trim(), None),
        };
        let need = |what: &str| format!("reward `{text}`: {name} needs {what} after `=` ({name}=...); {SYNTAX}");
        let kind = match (name.replace('_', "-").as_str(), value) {
            ("exact-answer", None) => RewardKind::ExactAnswer,
            ("exact-answer", Some(_)) => return Err(format!("reward `{text}`: exact-answer takes no value; {SYNTAX}")),
            ("regex", Some(pattern)) if !pattern.is_empty() => RewardKind::Regex { pattern: pattern.into() },
            ("regex", _) => return Err(need("a pattern")),
            ("format", Some(structure)) if !structure.is_empty() => RewardKind::Format { structure: structure.into() },
            ("format", _) => return Err(need("think-answer or a regex")),
            ("length", Some(budget)) => match budget.trim().parse::<usize>() {
                Ok(budget) if budget > 0 => RewardKind::Length { budget },
                _ => {
                    return Err(format!(
                        "reward `{text}`: the length budget `{budget}` is not a whole number of tokens above 0 \
                         (length=200, say)"
                    ))
                }
            },
            ("length", None) => return Err(need("a budget in tokens")),
            ("program", _) => {
                return Err(format!("reward `{text}`: give a reward program with --reward-program \"CMD ARGS\""))
            }
            _ => return Err(format!("unknown reward `{text}`; {SYNTAX}")),
        };
        Ok(RewardSpec { kind, weight })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: RewardKind, weight: f64) -> RewardSpec {
        RewardSpec { kind, weight }
    }

    #[test]
    fn specs_parse_with_optional_weights() {
        let parse = |s: &str| s.parse::<RewardSpec>().unwrap();
        assert_eq!(parse("exact-answer"), spec(RewardKind::ExactAnswer, 1.0));
        assert_eq!(parse("exact_answer@2"), spec(RewardKind::ExactAnswer, 2.0));
        assert_eq!(parse("length=10@0.5"), spec(RewardKind::Length { budget: 10 }, 0.5));
        assert_eq!(parse("format=think-answer"), spec(RewardKind::Format { structure: "think-answer".into() }, 1.0));
        assert_eq!(parse(r"regex=\w+@\w+"), spec(RewardKind::Regex { pattern: r"\w+@\w+".into() }, 1.0));
        assert_eq!(parse("regex=a=b@-1"), spec(RewardKind::Regex { pattern: "a=b".into() }, -1.0));
        assert_eq!(parse("regex=a@1@1"), spec(RewardKind::Regex { pattern: "a@1".into() }, 1.0));
    }

    #[test]
    fn bad_specs_say_what_to_write() {
        let err = |s: &str| s.parse::<RewardSpec>().unwrap_err();
        assert!(err("bogus").contains("unknown reward `bogus`; use exact-answer"), "{}", err("bogus"));
        assert!(err("length=abc").contains("not a whole number"));
        assert!(err("length=0").contains("above 0"));
        assert!(err("length").contains("needs a budget"));
        assert!(err("regex=").contains("needs a pattern"));
        assert!(err("format").contains("think-answer"));
        assert!(err("exact-answer=3").contains("takes no value"));
        assert!(err("length=5@inf").contains("not a finite number"));
        assert!(err("program=x").contains("--reward-program"));
    }
}
