//! One row of each format validated into a [`Row`]: chat (`messages`, with `tools` and tool-call turns),
//! ShareGPT (`conversations`), Alpaca (`instruction` / `input` / `output`), prompt/completion, text, and
//! preference pairs (in [`super::preference_rows`]); the field readers they share are in [`super::row_fields`]. ShareGPT
//! and Alpaca rows become chat rows here, so everything after reading sees conversations. Messages name the
//! field at fault. A null field (parquet writes one for every column a row lacks) counts as absent.

use super::formats::{Conversation, DatasetFormat, Row};
use super::row_fields::{chat_message, list_field, optional_string, present, string_field, tool_calls, tools};
pub use super::row_fields::{key_list, kind, tool_name};
use crate::engine::model::chat_template::ChatMessage;
use serde_json::{Map, Value};

/// A row, or what is wrong with it.
pub type RowResult = std::result::Result<Row, String>;

/// Between an Alpaca row's `instruction` and its non-empty `input` in the user turn. LLaMA-Factory
/// (`AlpacaDatasetConverter`) and axolotl's chat-style Alpaca prompts join them with a single newline; we
/// follow the original Stanford Alpaca prompt, which sets the input apart from the instruction by a blank line
/// (`### Instruction:\n{instruction}\n\n### Input:\n{input}`), so an input that starts with a list or code does
/// not read as the instruction's last line.
pub const ALPACA_INPUT_SEPARATOR: &str = "\n\n";

/// Validate an object (its columns already mapped) as a row of `format`.
pub fn parse_as(obj: &Map<String, Value>, format: DatasetFormat) -> RowResult {
    match format {
        DatasetFormat::Chat => parse_chat(obj),
        DatasetFormat::ShareGpt => parse_sharegpt(obj),
        DatasetFormat::Alpaca => parse_alpaca(obj),
        DatasetFormat::Preference => super::preference_rows::parse_preference(obj),
        DatasetFormat::Prompts => super::prompt_rows::parse_prompts(obj),
        DatasetFormat::Completions => {
            let prompt = string_field(obj, "prompt")?;
            let completion = string_field(obj, "completion")?;
            if completion.trim().is_empty() {
                return Err("`completion` is empty, so there is nothing to train on".into());
            }
            Ok(Row::Completion { prompt, completion })
        }
        DatasetFormat::Text => {
            let text = string_field(obj, "text")?;
            if text.trim().is_empty() {
                return Err("`text` is empty".into());
            }
            Ok(Row::Text(text))
        }
    }
}

/// The formats whose required columns an object has (not null): one for a clear row, several for an
/// ambiguous one, none for a row of no known format.
pub fn formats_of(obj: &Map<String, Value>) -> Vec<DatasetFormat> {
    let prompts = super::prompt_rows::is_prompt_row(obj);
    let mut formats: Vec<DatasetFormat> = DatasetFormat::ALL
        .into_iter()
        .filter(|f| match f {
            DatasetFormat::Prompts => prompts,
            // `messages` beside an answer is a prompt to answer, not a conversation to learn.
            DatasetFormat::Chat if prompts => false,
            f => f.required_columns().iter().all(|c| present(obj, c).is_some()),
        })
        .collect();
    // A `text` column beside a structured format's columns is that row rendered (tatsu-lab/alpaca has one): the
    // structured columns say more, so they win; `--format text` still reads the text.
    if formats.len() > 1 {
        formats.retain(|f| *f != DatasetFormat::Text);
    }
    formats
}

/// A row of no known format: which format it comes closest to, or that it has none of the keys.
pub fn no_format_message(obj: &Map<String, Value>) -> String {
    let partial = DatasetFormat::ALL.into_iter().find_map(|f| {
        let required = f.required_columns();
        let missing: Vec<&str> = required.iter().copied().filter(|c| present(obj, c).is_none()).collect();
        (!missing.is_empty() && missing.len() < required.len()).then(|| (f, missing))
    });
    match partial {
        Some((f, missing)) => format!(
            "missing field `{}` of the {f} format ({}); found {}",
            missing.join("`, `"),
            f.fields(),
            key_list(obj)
        ),
        None => format!(
            "no known format: expected `messages`, `conversations`, `instruction`/`output`, `chosen`/`rejected`, \
             `prompt`/`completion`, `prompt`/`answer` (or `question`/`answer`) or `text`; found {}; name the columns with --columns (for example prompt=question,completion=answer) \
             or pick the format on the dataset page",
            key_list(obj)
        ),
    }
}

fn parse_chat(obj: &Map<String, Value>) -> RowResult {
    let list = list_field(obj, "messages", "a list of {\"role\", \"content\"} objects")?;
    if list.is_empty() {
        return Err("empty conversation: `messages` is an empty list".into());
    }
    let messages =
        list.iter().enumerate().map(|(i, m)| chat_message("messages", i, m)).collect::<Result<Vec<_>, _>>()?;
    let tools = tools(obj)?;
    super::turn_order::check_turn_order(&messages, |i| format!("messages[{i}]"))?;
    finish_conversation(messages, tools)
}

/// ShareGPT's speakers (`from`) and the roles they become. `function_call` turns become assistant tool calls
/// and `observation` turns tool results, as LLaMA-Factory reads them.
const SHAREGPT_SPEAKERS: [(&str, &str); 10] = [
    ("human", "user"),
    ("user", "user"),
    ("gpt", "assistant"),
    ("assistant", "assistant"),
    ("chatgpt", "assistant"),
    ("system", "system"),
    ("function_call", "assistant"),
    ("observation", "tool"),
    ("tool", "tool"),
    ("function", "tool"),
];

fn parse_sharegpt(obj: &Map<String, Value>) -> RowResult {
    let list = list_field(obj, "conversations", "a list of {\"from\", \"value\"} objects")?;
    if list.is_empty() {
        return Err("empty conversation: `conversations` is an empty list".into());
    }
    let mut messages = Vec::with_capacity(list.len() + 1);
    if let Some(system) = optional_string(obj, "system", "the row")?.filter(|s| !s.trim().is_empty()) {
        messages.push(ChatMessage::new("system", system));
    }
    for (i, turn) in list.iter().enumerate() {
        let turn = turn.as_object().ok_or_else(|| {
            format!("conversations[{i}] must be an object with `from` and `value`, found {}", kind(turn))
        })?;
        // Some ShareGPT exports use the chat names inside `conversations`.
        let (speaker_key, value_key) = if turn.contains_key("from") { ("from", "value") } else { ("role", "content") };
        let speaker = match present(turn, speaker_key) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(format!("conversations[{i}].{speaker_key} must be a string, found {}", kind(other)))
            }
            None => return Err(format!("conversations[{i}] has no `from`")),
        };
        let role = SHAREGPT_SPEAKERS.iter().find(|(s, _)| *s == speaker).map(|(_, r)| *r).ok_or_else(|| {
            format!(
                "conversations[{i}] has unknown `from` `{speaker}`; expected human, gpt or system (or user, assistant, \
                 function_call, observation)"
            )
        })?;
        let value = match present(turn, value_key) {
            Some(Value::String(v)) => v.clone(),
            Some(other) => {
                return Err(format!("conversations[{i}].{value_key} must be a string, found {}", kind(other)))
            }
            None => return Err(format!("conversations[{i}] ({speaker}) has no `{value_key}`")),
        };
        let message = if speaker == "function_call" {
            let at = format!("conversations[{i}]");
            let calls = tool_calls(&at, &Value::String(value))?;
            ChatMessage { tool_calls: Some(calls), ..ChatMessage::new(role, "") }
        } else {
            ChatMessage::new(role, value)
        };
        if message.role == "system" && i > 0 {
            return Err(format!("conversations[{i}] is a system turn after the conversation started"));
        }
        messages.push(message);
    }
    if messages.iter().filter(|m| m.role == "system").count() > 1 {
        return Err("two system prompts: the row's `system` column and a system turn in `conversations`".into());
    }
    let tools = tools(obj)?;
    // A `system` column opens the conversation ahead of `conversations[0]`.
    let offset = usize::from(messages.len() > list.len());
    let at = |i: usize| match i.checked_sub(offset) {
        Some(turn) => format!("conversations[{turn}]"),
        None => "the `system` column".to_string(),
    };
    super::turn_order::check_turn_order(&messages, at)?;
    finish_conversation(messages, tools)
}

/// Alpaca: the user turn is `instruction`, then [`ALPACA_INPUT_SEPARATOR`] and `input` when `input` is
/// non-empty; the assistant turn is `output`; `system`, when present and non-empty, opens the conversation.
fn parse_alpaca(obj: &Map<String, Value>) -> RowResult {
    let instruction = string_field(obj, "instruction")?;
    let input = optional_string(obj, "input", "the row")?.unwrap_or_default();
    let output = string_field(obj, "output")?;
    if output.trim().is_empty() {
        return Err("`output` is empty, so there is nothing to train on".into());
    }
    let user = match (instruction.trim().is_empty(), input.trim().is_empty()) {
        (true, true) => return Err("`instruction` is empty (and there is no `input`)".into()),
        (false, true) => instruction,
        (true, false) => input,
        (false, false) => format!("{instruction}{ALPACA_INPUT_SEPARATOR}{input}"),
    };
    let mut messages = Vec::with_capacity(3);
    if let Some(system) = optional_string(obj, "system", "the row")?.filter(|s| !s.trim().is_empty()) {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", user));
    messages.push(ChatMessage::new("assistant", output));
    Ok(Row::Chat(messages.into()))
}

fn finish_conversation(messages: Vec<ChatMessage>, tools: Option<Vec<Value>>) -> RowResult {
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err("the conversation has no assistant message, so there is nothing to train on".into());
    }
    Ok(Row::Chat(Conversation { messages, tools }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(format: DatasetFormat, v: Value) -> RowResult {
        parse_as(v.as_object().unwrap(), format)
    }

    fn chat(row: RowResult) -> Conversation {
        match row {
            Ok(Row::Chat(c)) => c,
            other => panic!("expected a chat row, got {other:?}"),
        }
    }

    fn turns(c: &Conversation) -> Vec<(String, String)> {
        c.messages.iter().map(|m| (m.role.clone(), m.content.clone())).collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn alpaca_joins_instruction_and_input_with_a_blank_line() {
        let row = json!({"instruction": "Sum these", "input": "1 2", "output": "3", "system": "Be exact."});
        let c = chat(parse(DatasetFormat::Alpaca, row));
        assert_eq!(turns(&c), pairs(&[("system", "Be exact."), ("user", "Sum these\n\n1 2"), ("assistant", "3")]));
        let no_input = json!({"instruction": "Hi", "input": "", "output": "Hello", "system": null});
        assert_eq!(
            turns(&chat(parse(DatasetFormat::Alpaca, no_input))),
            pairs(&[("user", "Hi"), ("assistant", "Hello")])
        );
        let err = parse(DatasetFormat::Alpaca, json!({"instruction": "x", "output": " "})).unwrap_err();
        assert!(err.contains("`output` is empty"), "{err}");
        let err = parse(DatasetFormat::Alpaca, json!({"instruction": "x", "input": 3, "output": "y"})).unwrap_err();
        assert!(err.contains("`input` must be a string, found a number"), "{err}");
    }

    #[test]
    fn sharegpt_speakers_become_roles() {
        let row = json!({"system": "Terse.", "conversations": [
            {"from": "human", "value": "Weather?"},
            {"from": "function_call", "value": "{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}"},
            {"from": "observation", "value": "rain"},
            {"from": "gpt", "value": "Rain."}
        ]});
        let c = chat(parse(DatasetFormat::ShareGpt, row));
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        let call = &c.messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call, &json!({"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}));
        let role_content =
            json!({"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]});
        assert_eq!(
            turns(&chat(parse(DatasetFormat::ShareGpt, role_content))),
            pairs(&[("user", "a"), ("assistant", "b")])
        );
        let err =
            parse(DatasetFormat::ShareGpt, json!({"conversations": [{"from": "bot", "value": "x"}]})).unwrap_err();
        assert!(err.contains("conversations[0] has unknown `from` `bot`"), "{err}");
        let err =
            parse(DatasetFormat::ShareGpt, json!({"conversations": [{"from": "human", "value": "x"}]})).unwrap_err();
        assert!(err.contains("no assistant message"), "{err}");
    }

    #[test]
    fn chat_rows_take_tools_and_tool_turns() {
        let row = json!({
            "tools": "[{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": {}}}]",
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
                {"role": "tool", "content": "4", "tool_call_id": "c1", "name": "add"},
                {"role": "assistant", "content": "4", "tool_calls": null}
            ]
        });
        let c = chat(parse(DatasetFormat::Chat, row));
        assert!(c.uses_tools());
        assert_eq!(c.tools.as_ref().map(Vec::len), Some(1));
        let call = &c.messages[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call["function"]["arguments"], json!({"a": 2, "b": 2}));
        assert_eq!(call["id"], "c1");
        assert_eq!((c.messages[1].content.as_str(), c.messages[2].tool_call_id.as_deref()), ("", Some("c1")));
        assert_eq!(c.messages[3].tool_calls, None);

        let bad = [
            (
                json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}),
                "only assistant turns call tools",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}),
                "messages[0].tool_calls[0] has no function name",
            ),
            (
                json!({"tools": [1], "messages": [{"role": "assistant", "content": "x"}]}),
                "tools[0] must be a tool schema",
            ),
            (json!({"tools": "not json", "messages": [{"role": "assistant", "content": "x"}]}), "not a JSON list"),
        ];
        for (row, expected) in bad {
            let err = parse(DatasetFormat::Chat, row).unwrap_err();
            assert!(err.contains(expected), "{expected}: {err}");
        }
    }

    #[test]
    fn formats_of_a_row_and_rows_of_no_format() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(formats_of(&obj(json!({"messages": [], "prompt": "p"}))), vec![DatasetFormat::Chat]);
        assert_eq!(
            formats_of(&obj(json!({"instruction": "i", "output": "o", "text": "t"}))),
            vec![DatasetFormat::Alpaca]
        );
        assert_eq!(
            formats_of(&obj(json!({"instruction": "i", "output": "o", "prompt": "p", "completion": "c"}))),
            vec![DatasetFormat::Alpaca, DatasetFormat::Completions]
        );
        assert_eq!(formats_of(&obj(json!({"text": null}))), vec![]);
        let gsm8k = obj(json!({"question": "q", "answer": "a"}));
        assert_eq!(formats_of(&gsm8k), vec![DatasetFormat::Prompts]);
        assert_eq!(formats_of(&obj(json!({"messages": [], "answer": "a"}))), vec![DatasetFormat::Prompts]);
        assert_eq!(formats_of(&obj(json!({"prompt": "p", "text": "t"}))), vec![DatasetFormat::Prompts]);
        let m = no_format_message(&obj(json!({"prompt": "p"})));
        assert!(m.contains("missing field `completion` of the completions format"), "{m}");
        let m = no_format_message(&obj(json!({"query": "q", "reply": "a"})));
        assert!(m.contains("no known format") && m.contains("`query`, `reply`") && m.contains("--columns"), "{m}");
    }
}
