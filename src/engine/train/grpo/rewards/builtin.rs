//! The built-in rewards, compiled once from their specs: exact-answer, regex, format and length. Each scores one
//! completion without I/O.

use super::answer::{answers_match, extract_answer, reference_answer};
use crate::engine::{Error, Result};
use regex::Regex;

/// The format preset for `<think>...</think>` then `<answer>...</answer>` (dot matches newline).
pub const THINK_ANSWER: &str = "think-answer";
const THINK_ANSWER_PATTERN: &str = r"(?s)\A<think>.*?</think>\s*<answer>.*?</answer>\z";

/// A built-in reward, ready to score.
#[derive(Debug, Clone)]
pub enum Builtin {
    /// 1 when the completion's extracted answer equals the row's (see `answer.rs`), else 0.
    ExactAnswer,
    /// 1 when the pattern matches anywhere in the completion, else 0.
    Regex(Regex),
    /// 1 when the pattern (anchored at both ends) matches the whole trimmed completion, else 0.
    Format(Regex),
    /// 0 up to `budget` tokens, then -(tokens - budget) / budget, floored at -1.
    Length { budget: usize },
}

impl Builtin {
    /// Compile a regex reward's pattern; `name` and `flag` say which reward a bad pattern belongs to.
    pub fn regex(pattern: &str, name: &str, flag: &str) -> Result<Self> {
        if pattern.is_empty() {
            return Err(Error::InvalidSetting(format!(
                "reward {name} ({flag}): the pattern is empty; give one, e.g. regex=\\d+"
            )));
        }
        Ok(Self::Regex(compile(pattern, name, flag)?))
    }

    /// Resolve a format reward: the `think-answer` preset, or a regex the whole trimmed completion must match.
    pub fn format(structure: &str, name: &str, flag: &str) -> Result<Self> {
        if structure.is_empty() {
            return Err(Error::InvalidSetting(format!(
                "reward {name} ({flag}): the structure is empty; use format={THINK_ANSWER} or format=REGEX"
            )));
        }
        let pattern = if structure == THINK_ANSWER {
            THINK_ANSWER_PATTERN.to_string()
        } else {
            // Anchored so the pattern must cover the whole completion, whatever anchors it has itself.
            format!(r"\A(?:{structure})\z")
        };
        Ok(Self::Format(compile(&pattern, name, flag)?))
    }

    /// A length reward; a budget of 0 tokens is refused.
    pub fn length(budget: usize, name: &str, flag: &str) -> Result<Self> {
        if budget == 0 {
            return Err(Error::InvalidSetting(format!(
                "reward {name} ({flag}): the length budget is 0 tokens; it must be at least 1 (length=200, say)"
            )));
        }
        Ok(Self::Length { budget })
    }

    /// The reward of one completion. `answer` is the row's answer (exact-answer only).
    pub fn score(&self, completion: &str, completion_tokens: usize, answer: Option<&str>) -> f64 {
        let hit = |yes: bool| if yes { 1.0 } else { 0.0 };
        match self {
            Self::ExactAnswer => {
                let reference = answer.and_then(reference_answer);
                let got = extract_answer(completion);
                hit(matches!((got, reference), (Some(g), Some(r)) if answers_match(&g, &r)))
            }
            Self::Regex(re) => hit(re.is_match(completion)),
            Self::Format(re) => hit(re.is_match(completion.trim())),
            Self::Length { budget } => {
                let over = completion_tokens.saturating_sub(*budget) as f64;
                (-over / *budget as f64).max(-1.0)
            }
        }
    }
}

fn compile(pattern: &str, name: &str, flag: &str) -> Result<Regex> {
    Regex::new(pattern).map_err(|e| {
        Error::InvalidSetting(format!("reward {name} ({flag}): the pattern `{pattern}` is not a valid regex: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAG: &str = "--reward";

    #[test]
    fn exact_answer_scores_one_only_on_the_same_answer() {
        let r = Builtin::ExactAnswer;
        assert_eq!(r.score("so \\boxed{1234}", 5, Some("steps...\n#### 1,234")), 1.0);
        assert_eq!(r.score("The answer is 7.", 5, Some("7")), 1.0);
        assert_eq!(r.score("The answer is 8.", 5, Some("7")), 0.0);
        assert_eq!(r.score("no idea", 5, Some("7")), 0.0);
        assert_eq!(r.score("7", 1, None), 0.0);
        assert_eq!(r.score("<answer>Paris</answer>", 1, Some("paris")), 1.0);
    }

    #[test]
    fn regex_searches_and_format_matches_the_whole_completion() {
        let re = Builtin::regex(r"\d+", "regex", FLAG).unwrap();
        assert_eq!(re.score("abc 12 def", 3, None), 1.0);
        assert_eq!(re.score("abc", 1, None), 0.0);
        let think = Builtin::format(THINK_ANSWER, "format", FLAG).unwrap();
        assert_eq!(think.score("  <think>a\nb</think>\n\n<answer>4</answer>\n", 9, None), 1.0);
        assert_eq!(think.score("<think>a</think><answer>4</answer> trailing", 9, None), 0.0);
        assert_eq!(think.score("<answer>4</answer>", 9, None), 0.0);
        let custom = Builtin::format(r"\d+", "format", FLAG).unwrap();
        assert_eq!(custom.score(" 42 ", 1, None), 1.0);
        assert_eq!(custom.score("42 apples", 2, None), 0.0);
        let alternation = Builtin::format("yes|no", "format", FLAG).unwrap();
        assert_eq!(alternation.score("yes or no", 3, None), 0.0);
    }

    #[test]
    fn length_is_zero_within_budget_then_falls_to_minus_one() {
        let r = Builtin::length(10, "length", FLAG).unwrap();
        assert_eq!(r.score("", 0, None), 0.0);
        assert_eq!(r.score("", 10, None), 0.0);
        assert_eq!(r.score("", 15, None), -0.5);
        assert_eq!(r.score("", 20, None), -1.0);
        assert_eq!(r.score("", 500, None), -1.0);
    }

    #[test]
    fn bad_settings_name_the_reward_and_flag() {
        let err = Builtin::regex("(", "regex_2", FLAG).unwrap_err().to_string();
        assert!(err.contains("regex_2") && err.contains("--reward") && err.contains("not a valid regex"), "{err}");
        assert!(Builtin::regex("", "regex", FLAG).is_err());
        assert!(Builtin::format("", "format", FLAG).is_err());
        assert!(Builtin::length(0, "length", FLAG).unwrap_err().to_string().contains("at least 1"));
    }
}
