//! Answer extraction and comparison for the exact-answer reward: which part of a completion is its final answer,
//! and when two answers are the same.
//!
//! The answer is the content of the last `\boxed{...}` (balanced braces), else the first non-empty line after the
//! last `####`, else the content of the last `<answer>...</answer>`, else the first number (integers, decimals,
//! negative, with thousands commas). Two answers are equal when both read as the same number (`42`, `42.0`, `42.`,
//! `1,234` and `1234`), or else as trimmed text without a trailing period, ignoring case.

use regex::Regex;
use std::sync::OnceLock;

/// A number as written in text: `-1,234.5`, `42`, `.5`, `-3.25`. Thousands commas only in groups of three.
fn number_pattern() -> &'static Regex {
    static NUMBER: OnceLock<Regex> = OnceLock::new();
    NUMBER.get_or_init(|| {
        Regex::new(r"-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)").expect("a fixed, valid pattern")
    })
}

/// The completion's final answer by the rules in the module doc; `None` when it has no marker and no number.
pub fn extract_answer(text: &str) -> Option<String> {
    if let Some(boxed) = last_boxed(text) {
        return Some(boxed.trim().to_string());
    }
    if let Some(at) = text.rfind("####") {
        let after = &text[at + 4..];
        if let Some(line) = after.lines().map(str::trim).find(|l| !l.is_empty()) {
            return Some(line.to_string());
        }
    }
    if let Some(tagged) = last_answer_tag(text) {
        return Some(tagged.trim().to_string());
    }
    number_pattern().find(text).map(|m| m.as_str().to_string())
}

/// The row's reference answer, read the same way as a completion's; a reference without a marker or a number
/// (`Paris`) is its whole trimmed text. `None` when the answer is blank.
pub fn reference_answer(answer: &str) -> Option<String> {
    if answer.trim().is_empty() {
        return None;
    }
    extract_answer(answer).or_else(|| Some(answer.trim().to_string())).filter(|a| !normalise_text(a).is_empty())
}

/// Whether two extracted answers are the same: as numbers when both are numbers, else as text.
pub fn answers_match(a: &str, b: &str) -> bool {
    match (as_number(a), as_number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => normalise_text(a) == normalise_text(b),
    }
}

/// The answer as a number, when the whole (trimmed, trailing period dropped) text is one: `42.`, `-3.5`, `1,234`.
fn as_number(answer: &str) -> Option<f64> {
    let text = answer.trim().trim_end_matches('.');
    let whole = number_pattern().find(text).filter(|m| m.start() == 0 && m.end() == text.len())?;
    whole.as_str().replace(',', "").parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Trimmed, lower case, without trailing periods.
fn normalise_text(answer: &str) -> String {
    answer.trim().trim_end_matches('.').trim_end().to_lowercase()
}

/// The content of the last `\boxed{...}` whose braces balance.
fn last_boxed(text: &str) -> Option<&str> {
    const OPEN: &str = "\\boxed{";
    let mut found = None;
    let mut from = 0;
    while let Some(at) = text[from..].find(OPEN) {
        let start = from + at + OPEN.len();
        if let Some(len) = balanced_len(&text[start..]) {
            found = Some(&text[start..start + len]);
        }
        from = start;
    }
    found
}

/// The length of `text` up to the `}` that closes an already-open brace, if it is there.
fn balanced_len(text: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The content of the last complete `<answer>...</answer>`.
fn last_answer_tag(text: &str) -> Option<&str> {
    let close = text.rfind("</answer>")?;
    let open = text[..close].rfind("<answer>")?;
    Some(&text[open + "<answer>".len()..close])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_extracted_by_the_documented_rules() {
        let table: &[(&str, Option<&str>)] = &[
            ("so \\boxed{42}", Some("42")),
            ("\\boxed{1} then \\boxed{\\frac{1}{2}}", Some("\\frac{1}{2}")),
            ("unclosed \\boxed{7", Some("7")),
            ("She sold 48 + 24 = 72 clips.\n#### 1,234", Some("1,234")),
            ("#### 42\nHope this helps", Some("42")),
            ("The answer is 7.", Some("7")),
            ("-3.5", Some("-3.5")),
            ("<think>3 and 4</think> <answer>12</answer>", Some("12")),
            ("first 3 then 5", Some("3")),
            ("a total of 2,500 dollars", Some("2,500")),
            ("no number here", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(extract_answer(text).as_deref(), *want, "{text:?}");
        }
    }

    #[test]
    fn numbers_compare_as_numbers_and_text_without_case_or_period() {
        assert!(answers_match("42", "42.0"));
        assert!(answers_match("42.", "42"));
        assert!(answers_match("1,234", "1234"));
        assert!(answers_match("-3.50", "-3.5"));
        assert!(!answers_match("42", "43"));
        assert!(!answers_match("12", "1,2"));
        assert!(answers_match(" Paris. ", "paris"));
        assert!(!answers_match("Paris", "Lyon"));
    }

    #[test]
    fn reference_answers_are_read_like_completions() {
        assert_eq!(reference_answer("Natalia sold 48/2 = 24 clips.\n#### 1,234").as_deref(), Some("1,234"));
        assert_eq!(reference_answer("72").as_deref(), Some("72"));
        assert_eq!(reference_answer("Paris").as_deref(), Some("Paris"));
        assert_eq!(reference_answer("   "), None);
        assert_eq!(reference_answer("."), None);
    }
}
