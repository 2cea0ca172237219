//! JSON field readers the row formats share: a field present (null counts as absent), strings and lists with
//! messages naming the field at fault, chat messages (`{"role", "content"}` with tool calls), a row's `tools`
//! and the tool calls of an assistant turn in the form chat templates read.

use super::formats::CHAT_ROLES;
use crate::engine::model::chat_template::ChatMessage;
use serde_json::{Map, Value};

pub(super) fn present<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// Message `i` of the list `list` (`messages`, `chosen`, ...), named so in errors.
pub(super) fn chat_message(list: &str, i: usize, m: &Value) -> Result<ChatMessage, String> {
    let m = m
        .as_object()
        .ok_or_else(|| format!("{list}[{i}] must be an object with `role` and `content`, found {}", kind(m)))?;
    let role = match present(m, "role") {
        None => return Err(format!("{list}[{i}] has no `role`")),
        Some(Value::String(r)) => r.clone(),
        Some(other) => return Err(format!("{list}[{i}].role must be a string, found {}", kind(other))),
    };
    if !CHAT_ROLES.contains(&role.as_str()) {
        return Err(format!("{list}[{i}] has unknown role `{role}`; expected one of {}", CHAT_ROLES.join(", ")));
    }
    let at = format!("{list}[{i}]");
    let tool_calls = present(m, "tool_calls").map(|v| tool_calls(&at, v)).transpose()?.filter(|c| !c.is_empty());
    if tool_calls.is_some() && role != "assistant" {
        return Err(format!("{at} ({role}) has `tool_calls`; only assistant turns call tools"));
    }
    let content = match present(m, "content") {
        None if tool_calls.is_some() => String::new(),
        None => return Err(format!("{at} ({role}) has no `content`")),
        Some(Value::String(c)) => c.clone(),
        Some(other) => return Err(format!("{at}.content must be a string, found {}", kind(other))),
    };
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id: optional_string(m, "tool_call_id", &at)?,
        name: optional_string(m, "name", &at)?,
    })
}

/// The row's `tools`: a list of tool schemas (objects), or that list as a JSON string (how parquet datasets
/// usually store it). An empty list is no tools.
pub(super) fn tools(obj: &Map<String, Value>) -> Result<Option<Vec<Value>>, String> {
    let Some(value) = present(obj, "tools") else { return Ok(None) };
    let list = json_list(value, "`tools`")?;
    for (j, tool) in list.iter().enumerate() {
        if tool_name(tool).is_none() {
            return Err(format!(
                "tools[{j}] must be a tool schema with a name ({{\"type\": \"function\", \"function\": {{\"name\", \
                 ...}}}}), found {}",
                kind(tool)
            ));
        }
    }
    Ok((!list.is_empty()).then_some(list))
}

/// The name of a tool schema (`{"function": {"name"}}` or `{"name"}`) or of a tool call.
pub fn tool_name(tool: &Value) -> Option<&str> {
    let obj = tool.as_object()?;
    let inner = obj.get("function").and_then(Value::as_object).unwrap_or(obj);
    inner.get("name").and_then(Value::as_str).filter(|n| !n.is_empty())
}

/// An assistant turn's tool calls in the form chat templates read (`{"type": "function", "function": {"name",
/// "arguments"}}`, arguments as an object when they are a JSON object written as a string). Accepts a list or
/// one call, as values or as a JSON string, each call OpenAI-style or a bare `{"name", "arguments"}`.
pub(super) fn tool_calls(at: &str, value: &Value) -> Result<Vec<Value>, String> {
    let parsed;
    let value = match value {
        Value::String(s) => {
            parsed =
                serde_json::from_str::<Value>(s).map_err(|e| format!("{at}: the tool call is not valid JSON: {e}"))?;
            &parsed
        }
        other => other,
    };
    let calls: Vec<&Value> = match value {
        Value::Array(list) => list.iter().collect(),
        Value::Object(_) => vec![value],
        other => return Err(format!("{at}.tool_calls must be a list of calls, found {}", kind(other))),
    };
    calls
        .into_iter()
        .enumerate()
        .map(|(j, call)| {
            let obj = call
                .as_object()
                .ok_or_else(|| format!("{at}.tool_calls[{j}] must be an object, found {}", kind(call)))?;
            let function = obj.get("function").and_then(Value::as_object).unwrap_or(obj);
            let name = tool_name(call).ok_or_else(|| format!("{at}.tool_calls[{j}] has no function name"))?.to_string();
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => Value::String(s.clone()),
                },
                Some(other) => other.clone(),
            };
            let mut normalised = serde_json::json!({
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            });
            if let (Some(id), Some(out)) = (obj.get("id").filter(|v| !v.is_null()), normalised.as_object_mut()) {
                out.insert("id".into(), id.clone());
            }
            Ok(normalised)
        })
        .collect()
}

/// A list, or a list written as a JSON string.
fn json_list(value: &Value, what: &str) -> Result<Vec<Value>, String> {
    match value {
        Value::Array(list) => Ok(list.clone()),
        Value::String(s) if s.trim().is_empty() => Ok(Vec::new()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Array(list)) => Ok(list),
            Ok(other) => Err(format!("{what} must be a list, found a string holding {}", kind(&other))),
            Err(e) => Err(format!("{what} is a string that is not a JSON list: {e}")),
        },
        other => Err(format!("{what} must be a list, found {}", kind(other))),
    }
}

pub(super) fn list_field<'a>(obj: &'a Map<String, Value>, name: &str, what: &str) -> Result<&'a Vec<Value>, String> {
    match present(obj, name) {
        None => Err(format!("missing field `{name}`")),
        Some(Value::Array(list)) => Ok(list),
        Some(other) => Err(format!("`{name}` must be {what}, found {}", kind(other))),
    }
}

pub(super) fn string_field(obj: &Map<String, Value>, name: &str) -> Result<String, String> {
    match present(obj, name) {
        None => Err(format!("missing field `{name}`")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("`{name}` must be a string, found {}", kind(other))),
    }
}

pub(super) fn optional_string(obj: &Map<String, Value>, name: &str, at: &str) -> Result<Option<String>, String> {
    match present(obj, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) if at == "the row" => Err(format!("`{name}` must be a string, found {}", kind(other))),
        Some(other) => Err(format!("{at}.{name} must be a string, found {}", kind(other))),
    }
}

/// "a string", "a list", ... for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// "keys `a`, `b`" (at most eight) for messages.
pub fn key_list(obj: &Map<String, Value>) -> String {
    if obj.is_empty() {
        return "an empty object".into();
    }
    let mut keys: Vec<String> = obj.keys().take(8).map(|k| format!("`{k}`")).collect();
    if obj.len() > 8 {
        keys.push(format!("and {} more", obj.len() - 8));
    }
    format!("keys {}", keys.join(", "))
}
