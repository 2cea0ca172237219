//! One GRPO prompt row validated into a [`PromptRow`], and the rule that finds such rows ([`is_prompt_row`]).
//! The forms read:
//!
//! - `{"prompt": "...", "answer": ...}`: TRL's standard prompt-only form (the text is tokenized as it is);
//! - `{"prompt": [messages], "answer": ...}`: TRL's conversational form (rendered with the generation prompt);
//! - `{"messages": [...], "answer": ...}`: the messages are the prompt;
//! - gsm8k's `{"question", "answer"}` and MATH's `{"problem", "solution"}`: the question becomes the user's turn
//!   (so an instruct model is asked through its chat template), the answer is kept whole (the exact-answer reward
//!   reads what follows `####` or the last `\boxed{}`).
//!
//! `answer` is optional (format, length and program rewards need none); a number is kept as its text. `tools`
//! pass to the template in the conversational forms. Choices: a message prompt must end with a user (or tool)
//! turn, as TRL's `apply_chat_template` requires of a prompt it adds the generation prompt to; one that ends with
//! an assistant turn is refused rather than continued, so a whole conversation is never mistaken for a prompt.

use super::formats::{PreferenceTurns, PromptRow, Row};
use super::row_fields::{chat_message, kind, present, tools};
use crate::engine::model::chat_template::ChatMessage;
use serde_json::{Map, Value};

/// Columns that make a row a completion, a pair or an Alpaca row, never a prompt.
const NOT_PROMPT_COLUMNS: [&str; 4] = ["completion", "chosen", "rejected", "output"];
/// Where a row's prompt may be: `prompt` itself, then the columns that stand for it.
pub const PROMPT_COLUMNS: [&str; 4] = ["prompt", "messages", "question", "problem"];
/// Where a row's reference answer may be.
pub const ANSWER_COLUMNS: [&str; 2] = ["answer", "solution"];

/// Whether a row (its columns mapped) is a GRPO prompt: no completion, pair or Alpaca output, and either a
/// `prompt` (with no `messages`) or one of `messages`/`question`/`problem` beside an `answer`/`solution`.
/// `{"messages": [...]}` without an answer stays a chat row.
pub fn is_prompt_row(obj: &Map<String, Value>) -> bool {
    let has = |c: &&str| present(obj, c).is_some();
    if NOT_PROMPT_COLUMNS.iter().any(has) {
        return false;
    }
    (has(&"prompt") && !has(&"messages")) || (PROMPT_COLUMNS.iter().any(has) && ANSWER_COLUMNS.iter().any(has))
}

/// Validate a prompt row (its columns already mapped).
pub fn parse_prompts(obj: &Map<String, Value>) -> std::result::Result<Row, String> {
    let sources: Vec<&str> = PROMPT_COLUMNS.into_iter().filter(|c| present(obj, c).is_some()).collect();
    let source = match sources.as_slice() {
        [one] => *one,
        [] => return Err("missing field `prompt` (or `messages`, `question`, `problem`) of the prompts format".into()),
        several => {
            return Err(format!(
                "the prompt is in more than one column (`{}`); keep one, or read one as the prompt with --columns \
                 prompt=COLUMN",
                several.join("`, `")
            ))
        }
    };
    let prompt = prompt_of(obj, source)?;
    let answer = answer_of(obj)?;
    let tools = tools(obj)?;
    if tools.is_some() && !prompt.is_messages() {
        return Err(
            "`tools` needs the conversational form (the prompt as messages); a text prompt has no template".into()
        );
    }
    Ok(Row::Prompt(PromptRow { prompt, answer, tools }))
}

/// The prompt from `source`: text stays text under `prompt`; a question or problem becomes the user's turn.
fn prompt_of(obj: &Map<String, Value>, source: &str) -> std::result::Result<PreferenceTurns, String> {
    let value = present(obj, source).unwrap_or(&Value::Null);
    match (source, value) {
        (_, Value::String(text)) if text.trim().is_empty() => {
            Err(format!("`{source}` is empty, so there is nothing to answer"))
        }
        ("prompt", Value::String(text)) => Ok(PreferenceTurns::Text(text.clone())),
        ("question" | "problem", Value::String(text)) => {
            Ok(PreferenceTurns::Messages(vec![ChatMessage::new("user", text.clone())]))
        }
        ("prompt" | "messages", Value::Array(list)) => {
            let messages =
                list.iter().enumerate().map(|(i, m)| chat_message(source, i, m)).collect::<Result<Vec<_>, _>>()?;
            check_prompt_turns(source, &messages)?;
            Ok(PreferenceTurns::Messages(messages))
        }
        ("prompt", other) => Err(format!(
            "`prompt` must be a string or a list of {{\"role\", \"content\"}} messages, found {}",
            kind(other)
        )),
        ("messages", other) => {
            Err(format!("`messages` must be a list of {{\"role\", \"content\"}} messages, found {}", kind(other)))
        }
        (_, other) => Err(format!("`{source}` must be a string, found {}", kind(other))),
    }
}

/// A message prompt: turns in an order templates accept, ending where the assistant answers next.
fn check_prompt_turns(source: &str, messages: &[ChatMessage]) -> std::result::Result<(), String> {
    let Some(last) = messages.last() else {
        return Err(format!("`{source}` is an empty list, so there is nothing to answer"));
    };
    super::turn_order::check_turn_order(messages, |i| format!("{source}[{i}]"))?;
    let at = messages.len() - 1;
    match last.role.as_str() {
        "user" | "tool" => Ok(()),
        "assistant" => Err(format!(
            "{source}[{at}] (assistant) ends the prompt: GRPO samples the assistant's reply, so the prompt must end \
             with a user (or tool) turn; put the reference reply in `answer`, or train on whole conversations with \
             --format chat and --method sft"
        )),
        role => Err(format!("{source}[{at}] ({role}) ends the prompt: add the user's turn the model answers")),
    }
}

/// `answer` or `solution` as text (a number as written); `None` when neither is there.
fn answer_of(obj: &Map<String, Value>) -> std::result::Result<Option<String>, String> {
    let found: Vec<&str> = ANSWER_COLUMNS.into_iter().filter(|c| present(obj, c).is_some()).collect();
    let name = match found.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        _ => return Err("the row has both `answer` and `solution`; keep one as the reference answer".into()),
    };
    match present(obj, name).unwrap_or(&Value::Null) {
        Value::String(s) if s.trim().is_empty() => {
            Err(format!("`{name}` is empty; leave it out (or null) for a row without a reference answer"))
        }
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        other => Err(format!("`{name}` must be a string or a number, found {}", kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> std::result::Result<PromptRow, String> {
        match parse_prompts(v.as_object().unwrap())? {
            Row::Prompt(p) => Ok(p),
            other => panic!("not a prompt row: {other:?}"),
        }
    }

    fn user(text: &str) -> PreferenceTurns {
        PreferenceTurns::Messages(vec![ChatMessage::new("user", text)])
    }

    #[test]
    fn every_form_reads_its_prompt_and_answer() {
        let row = parse(json!({"prompt": "2+2=", "answer": "4"})).unwrap();
        assert_eq!((row.prompt, row.answer), (PreferenceTurns::Text("2+2=".into()), Some("4".into())));
        let row = parse(json!({"prompt": [{"role": "user", "content": "2+2?"}], "answer": 4})).unwrap();
        assert_eq!((row.prompt, row.answer), (user("2+2?"), Some("4".into())));
        let row = parse(json!({"messages": [{"role": "system", "content": "Be exact."},
            {"role": "user", "content": "2+2?"}], "answer": 4.5}))
        .unwrap();
        assert_eq!(row.answer.as_deref(), Some("4.5"));
        assert!(matches!(row.prompt, PreferenceTurns::Messages(ref m) if m.len() == 2));
        let row = parse(json!({"question": "Tom has 3 apples...", "answer": "He has 5.\n#### 5"})).unwrap();
        assert_eq!((row.prompt, row.answer.as_deref()), (user("Tom has 3 apples..."), Some("He has 5.\n#### 5")));
        let row = parse(json!({"problem": "Find x.", "solution": "x = \\boxed{2}", "level": "Level 1"})).unwrap();
        assert_eq!((row.prompt, row.answer.as_deref()), (user("Find x."), Some("x = \\boxed{2}")));
        let row = parse(json!({"prompt": "Write a haiku.", "answer": null})).unwrap();
        assert_eq!(row.answer, None, "the answer is optional");
    }

    #[test]
    fn detection_prefers_prompts_only_without_completions() {
        let is = |v: Value| is_prompt_row(v.as_object().unwrap());
        assert!(is(json!({"prompt": "p"})));
        assert!(is(json!({"question": "q", "answer": "a"})));
        assert!(is(json!({"messages": [], "answer": "a"})));
        assert!(is(json!({"problem": "q", "solution": "a"})));
        assert!(!is(json!({"messages": []})), "a conversation without an answer is chat");
        assert!(!is(json!({"messages": [], "prompt": "p"})));
        assert!(!is(json!({"question": "q"})));
        assert!(!is(json!({"prompt": "p", "completion": "c"})));
        assert!(!is(json!({"prompt": "p", "chosen": "c", "rejected": "r", "answer": "a"})));
        assert!(!is(json!({"instruction": "i", "output": "o", "answer": "a"})));
    }

    #[test]
    fn bad_rows_say_what_is_wrong() {
        let cases = [
            (json!({"answer": "4"}), "missing field `prompt`"),
            (json!({"prompt": "  ", "answer": "4"}), "`prompt` is empty"),
            (json!({"prompt": 3}), "`prompt` must be a string or a list"),
            (json!({"question": "q", "prompt": "p"}), "more than one column (`prompt`, `question`)"),
            (json!({"prompt": "p", "answer": ""}), "`answer` is empty"),
            (json!({"prompt": "p", "answer": [1]}), "`answer` must be a string or a number, found a list"),
            (json!({"question": "q", "answer": "a", "solution": "b"}), "both `answer` and `solution`"),
            (json!({"messages": [], "answer": "a"}), "`messages` is an empty list"),
            (
                json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "4"}],
                    "answer": "4"}),
                "messages[1] (assistant) ends the prompt",
            ),
            (json!({"prompt": [{"role": "system", "content": "s"}]}), "prompt[0] (system) ends the prompt"),
            (json!({"prompt": [{"role": "robot", "content": "q"}]}), "prompt[0] has unknown role `robot`"),
            (json!({"prompt": "p", "tools": [{"name": "f"}]}), "`tools` needs the conversational form"),
        ];
        for (row, expected) in cases {
            let err = parse(row.clone()).unwrap_err();
            assert!(err.contains(expected), "{row}: {err}");
        }
    }
}
