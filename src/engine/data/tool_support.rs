//! Whether the model's chat template can render a conversation's tool parts. Many templates know nothing of
//! tools and drop them without a word (`tools` never read, `tool_calls` never written); training on such a
//! render would teach the model replies to calls it never saw. So a row that uses tools is rendered with and
//! without each tool part, and a part that leaves no trace makes the row an error saying which part; a
//! template that refuses a `tool` turn (`raise_exception`) fails the row with its own message.

use super::formats::Conversation;
use crate::engine::model::chat_template::ChatTemplate;
use crate::engine::{Error, Result};

/// `Ok` when the conversation uses no tools, or `template` writes every tool part of it.
pub fn check_tool_support(conversation: &Conversation, template: Option<&ChatTemplate>) -> Result<()> {
    if !conversation.uses_tools() {
        return Ok(());
    }
    let Some(template) = template else {
        return Err(Error::ChatTemplate(
            "this row uses tools (`tools`, `tool_calls` or a `tool` turn) but the model has no chat template to \
             render them; use a model whose chat template supports tools, or leave the tool parts out"
                .into(),
        ));
    };
    let unsupported = |what: String| {
        Error::ChatTemplate(format!(
            "{} cannot render this row's tools: {what}; use a model whose chat template supports tools, or leave \
             the tool parts out",
            template.origin
        ))
    };
    let messages = &conversation.messages;
    let tools = conversation.tools.as_deref().filter(|t| !t.is_empty());
    let full = template.render_with_tools(messages, tools, false)?;
    if tools.is_some() && template.render_with_tools(messages, None, false)? == full {
        return Err(unsupported("it ignores `tools` (the row renders the same without them)".into()));
    }
    for (i, message) in messages.iter().enumerate() {
        let turn = i + 1;
        if message.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
            let mut without = messages.clone();
            without[i].tool_calls = None;
            // A template may refuse an assistant turn with neither content nor calls: that is a trace too.
            if template.render_with_tools(&without, tools, false).is_ok_and(|text| text == full) {
                return Err(unsupported(format!("turn {turn} (assistant)'s `tool_calls` leave no trace in the text")));
            }
        }
        let content = message.content.trim();
        if message.role == "tool" && !content.is_empty() && !full.contains(content) {
            return Err(unsupported(format!("turn {turn} (tool) is dropped from the text")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::formats::Row;
    use crate::engine::data::tokenize::tests::{byte_tokenizer, CHATML};
    use crate::engine::data::tokenize::{preview_row, TokenizeSpec};
    use crate::engine::model::chat_template::ChatMessage;
    use serde_json::json;

    /// ChatML with Qwen2.5-style tools: a `<tools>` block in the system turn, `<tool_call>` in assistant turns
    /// and `tool` turns as user-side `<tool_response>`.
    const TOOLS_CHATML: &str = "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{% endif %}{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    fn tool_conversation() -> Conversation {
        let call = json!({"type": "function", "function": {"name": "add", "arguments": {"a": 2}}});
        Conversation {
            messages: vec![
                ChatMessage::new("user", "2+2?"),
                ChatMessage { tool_calls: Some(vec![call]), ..ChatMessage::new("assistant", "") },
                ChatMessage { tool_call_id: Some("c1".into()), ..ChatMessage::new("tool", "4") },
                ChatMessage::new("assistant", "It is 4."),
            ],
            tools: Some(vec![json!({"type": "function", "function": {"name": "add"}})]),
        }
    }

    #[test]
    fn a_template_with_tools_renders_and_trains_the_call_and_the_reply() {
        let template = ChatTemplate::new(TOOLS_CHATML.into(), None, None).unwrap();
        check_tool_support(&tool_conversation(), Some(&template)).unwrap();
        let tok = byte_tokenizer();
        let spec = TokenizeSpec {
            tokenizer: &tok,
            chat_template: Some(&template),
            eos_token_id: tok.token_to_id("<|im_end|>"),
            max_seq_len: 4096,
            train_on_prompt: false,
        };
        let pieces = preview_row(&Row::Chat(tool_conversation()), &spec).unwrap();
        let trained: String = pieces.iter().filter(|(_, t)| *t).map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            trained,
            "<tool_call>{\"arguments\":{\"a\":2},\"name\":\"add\"}</tool_call><|im_end|>It is 4.<|im_end|>"
        );
        let text: String = pieces.iter().map(|(p, _)| p.as_str()).collect();
        assert!(text.starts_with("<|im_start|>system\n<tools>{\"function\":{\"name\":\"add\"}"), "{text}");
        assert!(text.contains("<tool_response>4</tool_response>"), "{text}");
    }

    #[test]
    fn templates_without_tools_give_a_clear_error() {
        // Plain ChatML renders a `tool` turn as any other role but never reads `tools` or `tool_calls`.
        let plain = ChatTemplate::new(CHATML.into(), None, None).unwrap().with_origin("m/tokenizer_config.json");
        let err = check_tool_support(&tool_conversation(), Some(&plain)).unwrap_err().to_string();
        assert!(err.contains("m/tokenizer_config.json cannot render this row's tools: it ignores `tools`"), "{err}");
        let no_tools = Conversation { tools: None, ..tool_conversation() };
        let err = check_tool_support(&no_tools, Some(&plain)).unwrap_err().to_string();
        assert!(err.contains("turn 2 (assistant)'s `tool_calls` leave no trace"), "{err}");
        let err = check_tool_support(&tool_conversation(), None).unwrap_err().to_string();
        assert!(err.contains("no chat template"), "{err}");
        let strict = "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('roles must be user or assistant') }}{% endif %}{{ m.content }}{% endfor %}";
        let strict = ChatTemplate::new(strict.into(), None, None).unwrap();
        let only_tool_turn = Conversation {
            tools: None,
            messages: vec![ChatMessage::new("tool", "4"), ChatMessage::new("assistant", "4")],
        };
        let err = check_tool_support(&only_tool_turn, Some(&strict)).unwrap_err().to_string();
        assert!(err.contains("roles must be user or assistant"), "{err}");
        assert!(check_tool_support(&vec![ChatMessage::new("assistant", "x")].into(), None).is_ok());
    }
}
