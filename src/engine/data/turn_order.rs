//! The order of a conversation's turns, checked when a chat or ShareGPT row is read: an optional system turn
//! first, then user and assistant turns alternating, starting with a user turn; `tool` results only right after
//! an assistant turn that calls tools (several in a row for several calls), answered by the next assistant turn;
//! and no empty assistant reply (one with neither text nor tool calls). Chat templates render such rows without
//! a word, or raise half-way through, and training on them teaches the model turns it will never see in use
//! (two replies in a row, answering itself) or to reply with nothing; so the row is refused with the turn at fault
//! and what is expected (and skipped with the rest under `skip_invalid_rows`).

use crate::engine::model::chat_template::ChatMessage;

/// What a conversation's turns must look like, for messages.
pub const EXPECTED_ORDER: &str = "expected: an optional system turn first, then user and assistant turns \
     alternating (starting with user); tool results only right after an assistant turn with `tool_calls`, before \
     the next assistant turn";

/// An assistant turn that calls tools (its results may follow).
fn calls_tools(m: &ChatMessage) -> bool {
    m.role == "assistant" && m.tool_calls.as_ref().is_some_and(|c| !c.is_empty())
}

/// `Err` naming the first turn out of order (by `at(i)`, e.g. "messages[3]") and what is expected.
pub fn check_turn_order(messages: &[ChatMessage], at: impl Fn(usize) -> String) -> Result<(), String> {
    let mut previous: Option<&ChatMessage> = None;
    for (i, m) in messages.iter().enumerate() {
        let here = format!("{} ({})", at(i), m.role);
        let fault = match (previous.map(|p| p.role.as_str()), m.role.as_str()) {
            (None, "user") | (Some("system"), "user") | (Some("assistant"), "user") => None,
            (Some("user"), "assistant") | (Some("tool"), "assistant") => None,
            (Some("tool"), "tool") => None,
            (Some(_), "tool") if previous.is_some_and(|p| calls_tools(p)) => None,
            (None, "system") => None,
            (Some(_), "system") => Some("is a system turn after the conversation started".to_string()),
            (None, _) | (Some("system"), _) => Some("comes before any user turn".to_string()),
            (Some("user"), "user") => Some(format!(
                "follows another user turn ({}); merge the two, or put the assistant's reply between them",
                at(i - 1)
            )),
            (Some("assistant"), "assistant") => Some(format!(
                "follows another assistant turn ({}) with no user turn or tool results between them",
                at(i - 1)
            )),
            (Some("tool"), _) => Some("follows tool results instead of the assistant's answer to them".to_string()),
            (Some(_), "tool") => {
                Some("is a tool result that does not follow an assistant turn with `tool_calls`".to_string())
            }
            (Some(_), _) => Some("is out of order".to_string()),
        };
        if let Some(fault) = fault {
            return Err(format!("{here} {fault}; {EXPECTED_ORDER}"));
        }
        if m.role == "assistant" && m.content.trim().is_empty() && !calls_tools(m) {
            return Err(format!(
                "{here} is an empty reply, which would teach the model to answer with nothing; write the reply, or \
                 leave the row out"
            ));
        }
        previous = Some(m);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(roles: &[(&str, &str)]) -> Vec<ChatMessage> {
        roles.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
    }

    fn check(roles: &[(&str, &str)]) -> Result<(), String> {
        check_turn_order(&turns(roles), |i| format!("messages[{i}]"))
    }

    #[test]
    fn alternating_turns_pass_and_tool_results_follow_their_call() {
        check(&[("system", "s"), ("user", "q"), ("assistant", "a"), ("user", "q2"), ("assistant", "a2")]).unwrap();
        check(&[("user", "q"), ("assistant", "a"), ("user", "trailing")]).unwrap();
        let call = serde_json::json!({"type": "function", "function": {"name": "f", "arguments": {}}});
        let mut with_tools =
            turns(&[("user", "q"), ("assistant", ""), ("tool", "1"), ("tool", "2"), ("assistant", "a")]);
        with_tools[1].tool_calls = Some(vec![call]);
        check_turn_order(&with_tools, |i| format!("messages[{i}]")).unwrap();
    }

    #[test]
    fn turns_out_of_order_and_empty_replies_are_named() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("assistant", "a"), ("user", "q")], "messages[0] (assistant) comes before any user turn"),
            (&[("user", "q"), ("user", "q"), ("assistant", "a")], "messages[1] (user) follows another user turn"),
            (&[("user", "q"), ("assistant", "a"), ("assistant", "b")], "messages[2] (assistant) follows another"),
            (&[("user", "q"), ("system", "s"), ("assistant", "a")], "messages[1] (system) is a system turn after"),
            (&[("user", "q"), ("tool", "4"), ("assistant", "a")], "messages[1] (tool) is a tool result that does not"),
            (&[("user", "q"), ("assistant", "  \n")], "messages[1] (assistant) is an empty reply"),
            (
                &[("user", "q"), ("assistant", ""), ("user", "q"), ("assistant", "a")],
                "messages[1] (assistant) is an empty",
            ),
        ];
        for (roles, words) in cases {
            let err = check(roles).unwrap_err();
            assert!(err.contains(words), "{roles:?}: {err}");
        }
        assert!(check(&[("assistant", "a"), ("user", "q")]).unwrap_err().contains("expected: an optional system turn"));
    }
}
