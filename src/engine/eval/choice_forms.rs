//! The column forms a multiple-choice row may come in, each mapped onto (context, choices, gold) the way
//! lm-evaluation-harness's own task configs map them:
//!
//! - [`ChoiceForm::Plain`]: `{"context": ..., "choices": [...], "gold": i}`, taken as written.
//! - [`ChoiceForm::Arc`] (allenai/ai2_arc; lm-eval's `arc_easy` / `arc_challenge`): `question`,
//!   `choices: {text, label}`, `answerKey` -> context `"Question: {question}\nAnswer:"`, the choices' texts,
//!   gold the index of `answerKey` among the labels.
//! - [`ChoiceForm::HellaSwag`] (Rowan/hellaswag; lm-eval's `hellaswag` and its `process_docs`): context
//!   `preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())`, choices `preprocess(ending)`,
//!   gold `int(label)`.
//! - [`ChoiceForm::Mmlu`] (cais/mmlu; lm-eval's `mmlu_*` default template): `question`, `choices` (a list),
//!   `answer` (an index) -> the lettered prompt `"{question.strip()}\nA. {c0}\nB. {c1}...\nAnswer:"` with the
//!   letters " A", " B", ... as the choices; a `subject` column adds the task's description line first.
//!
//! The form is detected from a row's columns (a parquet file's schema), never guessed from values.

use crate::engine::data::rows::{key_list, kind};
use serde_json::{Map, Value};

/// How a file's rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceForm {
    Plain,
    Arc,
    HellaSwag,
    Mmlu,
}

/// One row mapped: what the model is scored on.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedRow {
    pub context: String,
    pub choices: Vec<String>,
    pub gold: usize,
}

impl ChoiceForm {
    /// In detection order: the plain form first, then the benchmarks.
    pub const ALL: [ChoiceForm; 4] = [Self::Plain, Self::Arc, Self::HellaSwag, Self::Mmlu];

    /// The columns a row of this form must have.
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            Self::Plain => &["context", "choices", "gold"],
            Self::Arc => &["question", "choices", "answerKey"],
            Self::HellaSwag => &["activity_label", "ctx_a", "ctx_b", "endings", "label"],
            Self::Mmlu => &["question", "choices", "answer"],
        }
    }

    /// What reports call the form, with how it is mapped.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Plain => "context/choices/gold rows",
            Self::Arc => "ARC columns (question, choices.text/label, answerKey), as lm-eval's arc_easy maps them",
            Self::HellaSwag => {
                "HellaSwag columns (activity_label, ctx_a, ctx_b, endings, label), preprocessed as lm-eval's \
                 hellaswag does"
            }
            Self::Mmlu => "MMLU columns (question, choices, answer), as lm-eval's mmlu lettered prompt",
        }
    }

    /// The form whose columns are all among `columns`.
    pub fn detect<'a>(columns: impl Iterator<Item = &'a str> + Clone) -> Option<Self> {
        Self::ALL.into_iter().find(|form| form.columns().iter().all(|c| columns.clone().any(|have| have == *c)))
    }

    /// Why `obj` is not a row of any form, for the first row of a file.
    pub fn no_form_message(obj: &Map<String, Value>) -> String {
        let forms: Vec<String> = Self::ALL.iter().map(|f| f.columns().join("/")).collect();
        format!(
            "not a multiple-choice row: found {}; expected the columns of one of: {}",
            key_list(obj),
            forms.join("; ")
        )
    }

    /// Map one row of this form; the message says what is wrong with it.
    pub fn map(self, obj: &Map<String, Value>) -> Result<MappedRow, String> {
        let row = match self {
            Self::Plain => MappedRow {
                context: string(obj, "context")?,
                choices: strings(field(obj, "choices")?, "choices")?,
                gold: index(field(obj, "gold")?, "gold")?,
            },
            Self::Arc => arc(obj)?,
            Self::HellaSwag => hellaswag(obj)?,
            Self::Mmlu => mmlu(obj)?,
        };
        check(&row)?;
        Ok(row)
    }
}

/// The checks every form shares: some choices, none empty, gold among them.
fn check(row: &MappedRow) -> Result<(), String> {
    if row.choices.is_empty() {
        return Err("no choices: `choices` is an empty list".into());
    }
    if let Some(i) = row.choices.iter().position(String::is_empty) {
        return Err(format!("choice {i} is empty"));
    }
    if row.gold >= row.choices.len() {
        return Err(format!(
            "gold {} is out of range: the row has {} choices (0 to {})",
            row.gold,
            row.choices.len(),
            row.choices.len() - 1
        ));
    }
    Ok(())
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a Value, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Err(format!("missing column `{name}` (found {})", key_list(obj))),
        Some(v) => Ok(v),
    }
}

fn string(obj: &Map<String, Value>, name: &str) -> Result<String, String> {
    match field(obj, name)? {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!("`{name}` must be a string, found {}", kind(other))),
    }
}

fn strings(value: &Value, name: &str) -> Result<Vec<String>, String> {
    let Value::Array(items) = value else { return Err(format!("`{name}` must be a list, found {}", kind(value))) };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(format!("{name}[{i}] must be a string, found {}", kind(other))),
        })
        .collect()
}

/// A whole non-negative number, or a string of one (HellaSwag's `label` is "0".."3").
fn index(value: &Value, name: &str) -> Result<usize, String> {
    let parsed = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) if !s.trim().is_empty() => s.trim().parse::<u64>().ok(),
        Value::String(_) => {
            return Err(format!("`{name}` is empty: the row has no answer (a test split without labels?)"))
        }
        _ => None,
    };
    parsed
        .map(|n| n as usize)
        .ok_or_else(|| format!("`{name}` must be a whole number of at least 0, found {}", describe(value)))
}

fn describe(value: &Value) -> String {
    match value {
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("\"{s}\""),
        other => kind(other).into(),
    }
}

fn arc(obj: &Map<String, Value>) -> Result<MappedRow, String> {
    let question = string(obj, "question")?;
    let choices = field(obj, "choices")?;
    let Value::Object(choices) = choices else {
        return Err(format!("`choices` must be an object with `text` and `label` lists, found {}", kind(choices)));
    };
    let text = strings(field(choices, "text").map_err(|e| format!("choices: {e}"))?, "choices.text")?;
    let labels = strings(field(choices, "label").map_err(|e| format!("choices: {e}"))?, "choices.label")?;
    let key = string(obj, "answerKey")?;
    if labels.len() != text.len() {
        return Err(format!("choices.text has {} entries but choices.label {}", text.len(), labels.len()));
    }
    let gold = labels
        .iter()
        .position(|l| *l == key)
        .ok_or_else(|| format!("answerKey \"{key}\" is not among the labels {labels:?}"))?;
    Ok(MappedRow { context: format!("Question: {question}\nAnswer:"), choices: text, gold })
}

fn hellaswag(obj: &Map<String, Value>) -> Result<MappedRow, String> {
    let ctx = format!("{} {}", string(obj, "ctx_a")?, capitalize(&string(obj, "ctx_b")?));
    let context = preprocess(&format!("{}: {ctx}", string(obj, "activity_label")?));
    let choices = strings(field(obj, "endings")?, "endings")?.iter().map(|e| preprocess(e)).collect();
    Ok(MappedRow { context, choices, gold: index(field(obj, "label")?, "label")? })
}

fn mmlu(obj: &Map<String, Value>) -> Result<MappedRow, String> {
    let question = string(obj, "question")?;
    let options = strings(field(obj, "choices")?, "choices")?;
    if options.len() > 26 {
        return Err(format!("{} choices: the lettered prompt has letters A to Z only", options.len()));
    }
    let letters: Vec<String> = (b'A'..).take(options.len()).map(|b| char::from(b).to_string()).collect();
    let mut context = String::new();
    if let Some(Value::String(subject)) = obj.get("subject").filter(|s| s.as_str().is_some_and(|s| !s.is_empty())) {
        // lm-eval's mmlu_{subject} task description, before the question.
        let subject = subject.split('_').collect::<Vec<_>>().join(" ");
        context.push_str(&format!("The following are multiple choice questions (with answers) about {subject}.\n\n"));
    }
    context.push_str(py_strip(&question));
    for (letter, option) in letters.iter().zip(&options) {
        context.push_str(&format!("\n{letter}. {option}"));
    }
    context.push_str("\nAnswer:");
    Ok(MappedRow { context, choices: letters, gold: index(field(obj, "answer")?, "answer")? })
}

/// Python's `str.strip()`: Unicode whitespace off both ends.
fn py_strip(s: &str) -> &str {
    s.trim_matches(char::is_whitespace)
}

/// Python's `str.capitalize()`: the first character upper case, the rest lower case.
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars.flat_map(char::to_lowercase)).collect(),
        None => String::new(),
    }
}

/// lm-eval hellaswag's `preprocess`: strip; " [title]" -> ". "; drop `[...]` (shortest, within a line); each
/// double space once to one.
pub fn preprocess(text: &str) -> String {
    let text = py_strip(text).replace(" [title]", ". ");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        // `.` in Python's regex does not match a newline: a `[` whose `]` lies beyond the line end stays.
        match rest[open..].find([']', '\n']) {
            Some(end) if rest[open + end..].starts_with(']') => {
                out.push_str(&rest[..open]);
                rest = &rest[open + end + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out.replace("  ", " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn forms_are_detected_from_columns() {
        let detect = |cols: &[&str]| ChoiceForm::detect(cols.iter().copied());
        assert_eq!(detect(&["gold", "choices", "context", "id"]), Some(ChoiceForm::Plain));
        assert_eq!(detect(&["id", "question", "choices", "answerKey"]), Some(ChoiceForm::Arc));
        assert_eq!(
            detect(&["ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split", "label"]),
            Some(ChoiceForm::HellaSwag)
        );
        assert_eq!(detect(&["question", "subject", "choices", "answer"]), Some(ChoiceForm::Mmlu));
        assert_eq!(detect(&["question", "choices"]), None);
        let message = ChoiceForm::no_form_message(&obj(json!({"question": "q"})));
        assert!(message.contains("found keys `question`") && message.contains("context/choices/gold"), "{message}");
    }

    #[test]
    fn arc_rows_map_as_lm_eval_arc_easy() {
        let row = obj(json!({"id": "x", "question": "Which is a gas?",
            "choices": {"text": ["ice", "steam", "rock"], "label": ["A", "B", "C"]}, "answerKey": "B"}));
        let mapped = ChoiceForm::Arc.map(&row).unwrap();
        assert_eq!(mapped.context, "Question: Which is a gas?\nAnswer:");
        assert_eq!((mapped.choices, mapped.gold), (vec!["ice".to_string(), "steam".into(), "rock".into()], 1));
        let mut bad = row.clone();
        bad.insert("answerKey".into(), json!("4"));
        assert!(ChoiceForm::Arc.map(&bad).unwrap_err().contains("answerKey \"4\" is not among the labels"));
    }

    #[test]
    fn hellaswag_rows_are_preprocessed_as_lm_eval_does() {
        let row = obj(json!({"activity_label": "Home and Garden", "ctx_a": "A man [header] walks in.",
            "ctx_b": "THEN he", "endings": [" sits down [step] now. ", "runs  away"], "label": "1"}));
        let mapped = ChoiceForm::HellaSwag.map(&row).unwrap();
        // capitalize() lowers the rest; [header] and [step] go; double spaces become one.
        assert_eq!(mapped.context, "Home and Garden: A man walks in. Then he");
        assert_eq!(mapped.choices, vec!["sits down now.".to_string(), "runs away".into()]);
        assert_eq!(mapped.gold, 1);
        assert_eq!(preprocess("How to cook [title] Boil water. [step] Stir."), "How to cook. Boil water. Stir.");
        assert_eq!(preprocess("a [b\n] c"), "a [b\n] c");
        let mut unlabeled = row.clone();
        unlabeled.insert("label".into(), json!(""));
        assert!(ChoiceForm::HellaSwag.map(&unlabeled).unwrap_err().contains("`label` is empty"));
    }

    #[test]
    fn mmlu_rows_get_the_lettered_prompt() {
        let row = obj(json!({"question": " What is 2+2? ", "subject": "high_school_math",
            "choices": ["3", "4", "5", "6"], "answer": 1}));
        let mapped = ChoiceForm::Mmlu.map(&row).unwrap();
        assert_eq!(
            mapped.context,
            "The following are multiple choice questions (with answers) about high school math.\n\n\
             What is 2+2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:"
        );
        assert_eq!((mapped.choices.join(""), mapped.gold), ("ABCD".to_string(), 1));
    }

    #[test]
    fn bad_rows_say_what_is_wrong() {
        let cases = [
            (
                json!({"context": "c", "choices": ["a", "b"], "gold": 2}),
                "gold 2 is out of range: the row has 2 choices",
            ),
            (json!({"context": "c", "choices": ["a", ""], "gold": 0}), "choice 1 is empty"),
            (json!({"context": "c", "choices": [], "gold": 0}), "no choices"),
            (json!({"context": "c", "choices": ["a"]}), "missing column `gold`"),
            (json!({"context": "c", "choices": ["a"], "gold": -1}), "whole number of at least 0, found -1"),
            (json!({"context": "c", "choices": "a", "gold": 0}), "`choices` must be a list, found a string"),
            (json!({"context": 3, "choices": ["a"], "gold": 0}), "`context` must be a string"),
        ];
        for (row, expected) in cases {
            let err = ChoiceForm::Plain.map(&obj(row.clone())).unwrap_err();
            assert!(err.contains(expected), "{row}: {err}");
        }
    }
}
