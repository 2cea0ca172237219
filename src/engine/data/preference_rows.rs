//! One preference row validated into a [`PreferenceRow`], as TRL's `DPOTrainer` reads them: the standard form
//! (`prompt`, `chosen`, `rejected` as strings) and the conversational one (`chosen` / `rejected` as message
//! lists, `prompt` messages optional, `tools` optional). A row without `prompt` has its shared beginning taken
//! out as the prompt ([`extract_prompt`], TRL's `extract_prompt`). Messages name the field at fault.
//!
//! Choices: a row whose chosen and rejected are the same is an error (it holds no preference, and DPO's loss
//! for it is a constant); a row that mixes text and message lists is an error.

use super::formats::{PreferenceRow, PreferenceTurns, Row};
use super::row_fields::{chat_message, kind, present, tools};
use crate::engine::model::chat_template::ChatMessage;
use serde_json::{Map, Value};

/// Validate a preference row (its columns already mapped).
pub fn parse_preference(obj: &Map<String, Value>) -> std::result::Result<Row, String> {
    let chosen = turns(obj, "chosen")?.ok_or("missing field `chosen`")?;
    let rejected = turns(obj, "rejected")?.ok_or("missing field `rejected`")?;
    let prompt = turns(obj, "prompt")?;
    let forms = [Some(&chosen), Some(&rejected), prompt.as_ref()];
    let messages = forms.iter().flatten().filter(|t| t.is_messages()).count();
    if messages > 0 && messages < forms.iter().flatten().count() {
        let describe = |name: &str, t: Option<&PreferenceTurns>| {
            t.map(|t| format!("`{name}` is {}", if t.is_messages() { "a message list" } else { "a string" }))
        };
        let each: Vec<String> = [("prompt", prompt.as_ref()), ("chosen", Some(&chosen)), ("rejected", Some(&rejected))]
            .into_iter()
            .filter_map(|(n, t)| describe(n, t))
            .collect();
        return Err(format!(
            "mixed forms: {}; write all of them as strings (standard form) or all as message lists (conversational)",
            each.join(", ")
        ));
    }
    let tools = tools(obj)?;
    if tools.is_some() && messages == 0 {
        return Err("`tools` needs the conversational form (message lists); the standard form has no template".into());
    }
    if chosen == rejected {
        return Err("`chosen` and `rejected` are the same, so the row holds no preference".into());
    }
    let (prompt, chosen, rejected) = match prompt {
        Some(prompt) => (prompt, chosen, rejected),
        None => extract_prompt(chosen, rejected),
    };
    for (name, side) in [("chosen", &chosen), ("rejected", &rejected)] {
        check_side(name, &prompt, side)?;
    }
    Ok(Row::Preference(PreferenceRow { prompt, chosen, rejected, tools }))
}

/// A field as text or messages; `None` when absent.
fn turns(obj: &Map<String, Value>, name: &str) -> std::result::Result<Option<PreferenceTurns>, String> {
    match present(obj, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(PreferenceTurns::Text(s.clone()))),
        Some(Value::Array(list)) => {
            let messages =
                list.iter().enumerate().map(|(i, m)| chat_message(name, i, m)).collect::<Result<Vec<_>, _>>()?;
            Ok(Some(PreferenceTurns::Messages(messages)))
        }
        Some(other) => Err(format!(
            "`{name}` must be a string or a list of {{\"role\", \"content\"}} messages, found {}",
            kind(other)
        )),
    }
}

/// A completion must hold something to train on: non-blank text, or messages with an assistant turn whose
/// order after the prompt is one a chat template accepts.
fn check_side(name: &str, prompt: &PreferenceTurns, side: &PreferenceTurns) -> std::result::Result<(), String> {
    match (prompt, side) {
        (_, PreferenceTurns::Text(text)) if text.trim().is_empty() => {
            Err(format!("`{name}` is empty after the prompt, so there is nothing to compare"))
        }
        (PreferenceTurns::Messages(prompt), PreferenceTurns::Messages(turns)) => {
            if !turns.iter().any(|m| m.role == "assistant") {
                return Err(format!(
                    "`{name}` has no assistant message after the prompt ({} prompt messages), so there is nothing \
                     to compare",
                    prompt.len()
                ));
            }
            let all: Vec<ChatMessage> = prompt.iter().chain(turns).cloned().collect();
            let at = |i: usize| match i.checked_sub(prompt.len()) {
                Some(j) => format!("{name}[{j}]"),
                None => format!("prompt[{i}]"),
            };
            super::turn_order::check_turn_order(&all, at)
        }
        _ => Ok(()),
    }
}

/// TRL's `extract_prompt`: the prompt is the longest shared beginning of `chosen` and `rejected` (characters of
/// text, whole messages of message lists), less a space it ends with; the two keep what follows. As in TRL,
/// when one is a beginning of the other, the prompt stops one item short of the shorter. Unlike TRL, a pair
/// that differs from its first character has an empty prompt (TRL's index -1 would cut the last character).
pub fn extract_prompt(
    chosen: PreferenceTurns,
    rejected: PreferenceTurns,
) -> (PreferenceTurns, PreferenceTurns, PreferenceTurns) {
    match (chosen, rejected) {
        (PreferenceTurns::Text(chosen), PreferenceTurns::Text(rejected)) => {
            let (c, r): (Vec<char>, Vec<char>) = (chosen.chars().collect(), rejected.chars().collect());
            let at = split_point(&c, &r, |x| *x == ' ');
            let byte = |s: &str, n: usize| s.char_indices().nth(n).map_or(s.len(), |(b, _)| b);
            let (cb, rb) = (byte(&chosen, at), byte(&rejected, at));
            (
                PreferenceTurns::Text(chosen[..cb].to_string()),
                PreferenceTurns::Text(chosen[cb..].to_string()),
                PreferenceTurns::Text(rejected[rb..].to_string()),
            )
        }
        (PreferenceTurns::Messages(chosen), PreferenceTurns::Messages(rejected)) => {
            let at = split_point(&chosen, &rejected, |_| false);
            (
                PreferenceTurns::Messages(chosen[..at].to_vec()),
                PreferenceTurns::Messages(chosen[at..].to_vec()),
                PreferenceTurns::Messages(rejected[at..].to_vec()),
            )
        }
        // Mixed forms are refused before extraction; keep them whole with an empty prompt.
        (chosen, rejected) => (PreferenceTurns::Text(String::new()), chosen, rejected),
    }
}

/// Where TRL's loop stops: the first differing index (one back when the item before it is a space), else the
/// last index of the shorter list.
fn split_point<T: PartialEq>(chosen: &[T], rejected: &[T], is_space: impl Fn(&T) -> bool) -> usize {
    let shortest = chosen.len().min(rejected.len());
    match (0..shortest).find(|&i| chosen[i] != rejected[i]) {
        Some(i) if i > 0 && is_space(&chosen[i - 1]) => i - 1,
        Some(i) => i,
        None => shortest.saturating_sub(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> std::result::Result<PreferenceRow, String> {
        match parse_preference(v.as_object().unwrap())? {
            Row::Preference(p) => Ok(p),
            other => panic!("not a preference row: {other:?}"),
        }
    }

    fn text(s: &str) -> PreferenceTurns {
        PreferenceTurns::Text(s.into())
    }

    fn msgs(list: &[(&str, &str)]) -> PreferenceTurns {
        PreferenceTurns::Messages(list.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect())
    }

    #[test]
    fn standard_rows_keep_their_prompt_or_extract_it_as_trl_does() {
        let row = parse(json!({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."})).unwrap();
        assert_eq!((row.prompt, row.chosen, row.rejected), (text("The sky is"), text(" blue."), text(" green.")));
        // TRL: the shared beginning, less the space before the first difference.
        let row = parse(json!({"chosen": "The sky is blue.", "rejected": "The sky is green."})).unwrap();
        assert_eq!((row.prompt, row.chosen, row.rejected), (text("The sky is"), text(" blue."), text(" green.")));
        let row = parse(json!({"chosen": "Ünï 1", "rejected": "Ünï 2"})).unwrap();
        assert_eq!((row.prompt, row.chosen, row.rejected), (text("Ünï"), text(" 1"), text(" 2")));
        // One a beginning of the other: TRL stops one character short of the shorter.
        let row = parse(json!({"chosen": "abc", "rejected": "abcd"})).unwrap();
        assert_eq!((row.prompt, row.chosen, row.rejected), (text("ab"), text("c"), text("cd")));
    }

    #[test]
    fn conversational_rows_extract_whole_messages() {
        let row = parse(json!({
            "chosen": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
            "rejected": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}]
        }))
        .unwrap();
        assert_eq!(row.prompt, msgs(&[("user", "2+2?")]));
        assert_eq!((row.chosen, row.rejected), (msgs(&[("assistant", "4")]), msgs(&[("assistant", "5")])));
        let explicit = parse(json!({
            "prompt": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2+2?"}],
            "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}],
            "tools": []
        }))
        .unwrap();
        assert_eq!(explicit.prompt, msgs(&[("system", "Be exact."), ("user", "2+2?")]));
        assert_eq!(explicit.tools, None);
    }

    #[test]
    fn bad_rows_say_what_is_wrong() {
        let a = json!([{"role": "assistant", "content": "4"}]);
        let cases = [
            (json!({"chosen": "x"}), "missing field `rejected`"),
            (json!({"chosen": 3, "rejected": "y"}), "`chosen` must be a string or a list"),
            (
                json!({"prompt": "p", "chosen": a, "rejected": "y"}),
                "mixed forms: `prompt` is a string, `chosen` is a message list",
            ),
            (json!({"prompt": "p", "chosen": "same", "rejected": "same"}), "are the same"),
            (json!({"prompt": "p", "chosen": "  ", "rejected": "y"}), "`chosen` is empty"),
            (json!({"prompt": "p", "chosen": "a", "rejected": "b", "tools": [{"name": "f"}]}), "`tools` needs"),
            (
                json!({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "x"}], "rejected": a}),
                "`chosen` has no assistant message",
            ),
            (
                json!({"chosen": [{"role": "robot", "content": "q"}], "rejected": a}),
                "chosen[0] has unknown role `robot`",
            ),
        ];
        for (row, expected) in cases {
            let err = parse(row.clone()).unwrap_err();
            assert!(err.contains(expected), "{row}: {err}");
        }
    }
}
