//! The automatic scores of a generated answer against its reference (`--task generate`), each 0 or 1 per row
//! except token F1; a target's metric is the mean over rows.
//!
//! - `exact_match`: the answer equals the reference after trimming whitespace at both ends (case counts).
//! - `contains`: the trimmed reference occurs in the answer (case counts; an empty reference never scores).
//! - `regex`: only with `--regex R`: the answer matches R anywhere (Rust `regex` syntax; anchor with `^...$`).
//! - `token_f1`: SQuAD's token F1. Both texts are normalized: lowercased, ASCII punctuation removed, the
//!   articles "a", "an", "the" removed as words, and split on whitespace. With `common` the number of tokens the
//!   two share (counted with multiplicity), precision = common / answer tokens, recall = common / reference
//!   tokens, F1 = 2 * precision * recall / (precision + recall); 0 when nothing is shared, and 1 when both sides
//!   normalize to no tokens at all (0 when only one does).

use crate::engine::{Error, Result};
use regex::Regex;
use std::collections::HashMap;

/// Scores answers; built once per evaluation, so a bad regex is refused before anything runs.
#[derive(Debug, Clone)]
pub struct Scorer {
    regex: Option<Regex>,
}

impl Scorer {
    /// A scorer with the user's regex (refused here when it does not compile, naming the problem).
    pub fn new(regex: Option<&str>) -> Result<Self> {
        let regex = regex
            .map(|r| {
                Regex::new(r).map_err(|e| Error::InvalidSetting(format!("--regex `{r}` is not a valid regex: {e}")))
            })
            .transpose()?;
        Ok(Self { regex })
    }

    /// The metric names [`Self::score`] returns, in order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = vec!["exact_match", "contains"];
        if self.regex.is_some() {
            names.push("regex");
        }
        names.push("token_f1");
        names
    }

    /// Each metric of [`Self::names`] for one answer.
    pub fn score(&self, answer: &str, reference: &str) -> Vec<(&'static str, f64)> {
        let mut scores = vec![
            ("exact_match", f64::from(u8::from(exact_match(answer, reference)))),
            ("contains", f64::from(u8::from(contains(answer, reference)))),
        ];
        if let Some(regex) = &self.regex {
            scores.push(("regex", f64::from(u8::from(regex.is_match(answer)))));
        }
        scores.push(("token_f1", token_f1(answer, reference)));
        scores
    }
}

/// The answer equals the reference once both are trimmed.
pub fn exact_match(answer: &str, reference: &str) -> bool {
    answer.trim() == reference.trim()
}

/// The trimmed, non-empty reference occurs in the answer.
pub fn contains(answer: &str, reference: &str) -> bool {
    let reference = reference.trim();
    !reference.is_empty() && answer.contains(reference)
}

/// SQuAD's normalization: lowercase, no ASCII punctuation, no articles, whitespace-split tokens.
pub fn normalized_tokens(text: &str) -> Vec<String> {
    let cleaned: String = text.to_lowercase().chars().filter(|c| !c.is_ascii_punctuation()).collect();
    cleaned.split_whitespace().filter(|w| !matches!(*w, "a" | "an" | "the")).map(str::to_string).collect()
}

/// SQuAD's token F1 (see the module docs).
pub fn token_f1(answer: &str, reference: &str) -> f64 {
    let (predicted, gold) = (normalized_tokens(answer), normalized_tokens(reference));
    if predicted.is_empty() || gold.is_empty() {
        return f64::from(u8::from(predicted.is_empty() && gold.is_empty()));
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for token in &gold {
        *counts.entry(token).or_default() += 1;
    }
    let mut common = 0usize;
    for token in &predicted {
        if let Some(n) = counts.get_mut(token.as_str()).filter(|n| **n > 0) {
            *n -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / predicted.len() as f64;
    let recall = common as f64 / gold.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_match_trims_but_keeps_case() {
        assert!(exact_match(" 42\n", "42"));
        assert!(!exact_match("42.", "42"));
        assert!(!exact_match("Paris", "paris"));
        assert!(exact_match("", "  "));
    }

    #[test]
    fn contains_needs_a_reference() {
        assert!(contains("The answer is 42.", " 42 "));
        assert!(!contains("The answer is 4", "42"));
        assert!(!contains("anything", "   "));
    }

    #[test]
    fn token_f1_is_squads() {
        assert_eq!(token_f1("The Eiffel Tower!", "eiffel tower"), 1.0);
        // answer: [paris, is, capital] vs [paris]: precision 1/3, recall 1 -> 0.5
        assert!((token_f1("Paris is the capital", "Paris") - 0.5).abs() < 1e-12);
        // Repeated tokens count once per occurrence in the reference.
        assert!((token_f1("a b b", "b c") - 0.5).abs() < 1e-12);
        assert_eq!(token_f1("", "the"), 1.0, "both normalize to nothing");
        assert_eq!(token_f1("", "x"), 0.0);
        assert_eq!(token_f1("x", "y"), 0.0);
        assert_eq!(normalized_tokens("An apple, THE pear."), vec!["apple", "pear"]);
    }

    #[test]
    fn the_regex_scores_matches_and_a_bad_one_is_refused() {
        let scorer = Scorer::new(Some(r"^\s*\d+\s*$")).unwrap();
        assert_eq!(scorer.names(), vec!["exact_match", "contains", "regex", "token_f1"]);
        let scores = scorer.score(" 42 ", "41");
        assert_eq!(scores[2], ("regex", 1.0));
        assert_eq!(scores[0], ("exact_match", 0.0));
        assert_eq!(scorer.score("about 42", "42")[2], ("regex", 0.0));
        let err = Scorer::new(Some("(unclosed")).unwrap_err().to_string();
        assert!(err.contains("--regex `(unclosed`") && err.contains("not a valid regex"), "{err}");
        assert_eq!(Scorer::new(None).unwrap().names(), vec!["exact_match", "contains", "token_f1"]);
    }
}
