//! Turning rows into token ids plus a per-token training mask: chat and completions rows go through the
//! model's chat template, and only the assistant turns (every one of them, with the end-of-turn token that
//! follows) are trained unless `train_on_prompt` says otherwise; text rows are trained in full.
//!
//! The trained character spans are found by rendering prefixes of the conversation: assistant turn `i`
//! occupies the text between `render(messages[..i], add_generation_prompt = true)` and
//! `render(messages[..=i], false)`. The full conversation is tokenized once and a token is trained when its
//! character offsets overlap a span, so tokenization matches what the model sees at inference time.
//!
//! A conversation with tools renders them through the template (`tools`, `tool_calls`, `tool` turns) after
//! [`super::tool_support`] has checked that the template really writes them.

use super::formats::{Conversation, Row};
use crate::engine::model::chat_template::{ChatMessage, ChatTemplate};
use crate::engine::model::tokenizer::TextTokenizer;
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};
use std::ops::Range;

/// One tokenized row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub input_ids: Vec<u32>,
    /// `target_mask[j]`: token `j` is a training target, predicted from position `j - 1`. Index 0 is never a
    /// target. The trainer compares logits `[.., :-1]` with ids `[.., 1:]` under mask `[.., 1:]`.
    pub target_mask: Vec<bool>,
    /// The row was longer than `max_seq_len` and lost its tail.
    pub truncated: bool,
}

impl Example {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    pub fn target_tokens(&self) -> usize {
        self.target_mask.iter().filter(|&&t| t).count()
    }

    /// What cutting this example to `max_seq_len` tokens leaves: the one rule behind the trainer's truncated
    /// and dropped rows and the dataset report's counts of them.
    pub fn cut(&self, max_seq_len: usize) -> Cut {
        Cut {
            truncated: self.truncated || self.len() > max_seq_len,
            target_tokens: self.target_mask.iter().take(max_seq_len).filter(|&&t| t).count(),
        }
    }
}

/// See [`Example::cut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The example lost its tail.
    pub truncated: bool,
    /// Training targets left within the cut.
    pub target_tokens: usize,
}

impl Cut {
    /// No target is left: the trainer drops the example.
    pub fn dropped(&self) -> bool {
        self.target_tokens == 0
    }
}

/// Everything tokenization needs from the model, plus the two options that change the result.
#[derive(Clone, Copy)]
pub struct TokenizeSpec<'a> {
    pub tokenizer: &'a TextTokenizer,
    /// `None`: chat rows use [`FALLBACK_TEMPLATE_NOTE`]'s plain format.
    pub chat_template: Option<&'a ChatTemplate>,
    /// Appended to text rows (and closes assistant turns in the fallback format).
    pub eos_token_id: Option<u32>,
    pub max_seq_len: usize,
    /// Train on every token, prompts and system messages included.
    pub train_on_prompt: bool,
}

/// What the summary says when the model has no chat template.
pub const FALLBACK_TEMPLATE_NOTE: &str = "the model has no chat template: chat and completions rows use a plain \
     fallback format (`### User\\n...\\n\\n### Assistant\\n...<eos>`); generate with the same format";

impl<'a> TokenizeSpec<'a> {
    /// The spec for a loaded model: its tokenizer, chat template and eos token (the tokenizer's own eos
    /// token if it has one, else the first of the model's stop ids).
    pub fn for_model(model: &'a LoadedModel, max_seq_len: usize, train_on_prompt: bool) -> Self {
        let eos_token_id = model
            .tokenizer
            .eos_token
            .as_deref()
            .and_then(|t| model.tokenizer.token_to_id(t))
            .or_else(|| model.eos_token_ids.first().copied());
        Self {
            tokenizer: &model.tokenizer,
            chat_template: model.chat_template.as_ref(),
            eos_token_id,
            max_seq_len,
            train_on_prompt,
        }
    }

    pub fn uses_fallback_template(&self) -> bool {
        self.chat_template.is_none()
    }

    /// The eos token as text (what TRL appends to standard-form preference completions).
    pub(super) fn eos_text(&self) -> String {
        self.tokenizer
            .eos_token
            .clone()
            .or_else(|| self.eos_token_id.and_then(|id| self.tokenizer.id_to_token(id)))
            .unwrap_or_default()
    }

    /// The conversation through the chat template, or the fallback format without one.
    pub(super) fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        match self.chat_template {
            Some(t) => t.render_with_tools(messages, tools, add_generation_prompt),
            None => Ok(fallback_render(messages, add_generation_prompt, &self.eos_text())),
        }
    }
}

/// Prompt ids for a chat that the model should answer: the model's chat template when it has one (tokenized as
/// transformers' `apply_chat_template` does), otherwise the plain fallback format training uses. The CLI and
/// the studio's chat both call this (through [`chat_prompt`]), so a model is prompted the way it was trained.
pub fn chat_prompt_ids(model: &LoadedModel, messages: &[ChatMessage]) -> Result<Vec<u32>> {
    if model.chat_template.is_some() {
        return model.encode_chat(messages);
    }
    let text = TokenizeSpec::for_model(model, usize::MAX / 2, false).render(messages, None, true)?;
    model.encode_prompt(&text, true)
}

/// A chat prompt ready to generate from, and what the user should be told about how it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatPrompt {
    pub ids: Vec<u32>,
    /// Set when the model has no chat template, so the prompt is in the plain fallback format
    /// ([`fallback_chat_warning`]); the CLI prints it, the chat pane shows it above the reply.
    pub warning: Option<String>,
}

/// [`chat_prompt_ids`] with the warning a front end shows: the one function `generate --chat` and the chat
/// pane call, so both say the same when a model has no chat template.
pub fn chat_prompt(model: &LoadedModel, messages: &[ChatMessage]) -> Result<ChatPrompt> {
    let ids = chat_prompt_ids(model, messages)?;
    let warning = model.chat_template.is_none().then(|| fallback_chat_warning(model.source.path()));
    Ok(ChatPrompt { ids, warning })
}

/// What a chat with a model that has no chat template is told: the made-up format it is written in, who trains
/// in it, and what to do instead.
pub fn fallback_chat_warning(model: &std::path::Path) -> String {
    format!(
        "{} has no chat template (tokenizer_config.json `chat_template`, chat_template.jinja or GGUF \
         `tokenizer.chat_template`), so the chat is written in metal-candle's plain fallback format (`### User\\n\
         ...\\n\\n### Assistant\\n`): the format LoRA training uses for such a model, but not one the model itself \
         knows. Expect poor answers unless its adapter was trained by metal-candle; for the model alone, use a plain \
         prompt (generate without --chat) or a model with a chat template",
        model.display()
    )
}

/// The plain format used when a model has no chat template. Assistant turns end with the eos token so the
/// model learns to stop.
pub fn fallback_render(messages: &[ChatMessage], add_generation_prompt: bool, eos: &str) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("### ");
        out.push_str(&role_title(&m.role));
        out.push('\n');
        out.push_str(&m.content);
        if m.role == "assistant" {
            out.push_str(eos);
        }
        out.push_str("\n\n");
    }
    if add_generation_prompt {
        out.push_str("### Assistant\n");
    }
    out
}

fn role_title(role: &str) -> String {
    let mut chars = role.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Tokenize one row: ids, target mask, truncation to `max_seq_len`.
pub fn tokenize_row(row: &Row, spec: &TokenizeSpec<'_>) -> Result<Example> {
    if spec.max_seq_len < 2 {
        return Err(Error::InvalidSetting(format!(
            "max_seq_len is {}; it must be at least 2 tokens",
            spec.max_seq_len
        )));
    }
    let (mut input_ids, mut target_mask) = match row {
        Row::Text(text) => {
            let mut ids = spec.tokenizer.encode(text, true)?;
            if let Some(eos) = spec.eos_token_id {
                if ids.last() != Some(&eos) {
                    ids.push(eos);
                }
            }
            let mask = vec![true; ids.len()];
            (ids, mask)
        }
        Row::Preference(_) => return Err(Error::Data(super::formats::PREFERENCE_NOT_SFT.into())),
        Row::Prompt(_) => return Err(Error::Data(super::formats::PROMPTS_NOT_SUPERVISED.into())),
        Row::Chat(_) | Row::Completion { .. } => {
            let conversation = row.to_conversation().unwrap_or_default();
            super::tool_support::check_tool_support(&conversation, spec.chat_template)?;
            let (ids, offsets, spans) = tokenize_chat(&conversation, spec)?;
            let mask = if spec.train_on_prompt {
                vec![true; ids.len()]
            } else {
                offsets.iter().map(|&(start, end)| end > start && overlaps(&spans, start, end)).collect()
            };
            (ids, mask)
        }
    };
    if let Some(first) = target_mask.first_mut() {
        *first = false;
    }
    let truncated = input_ids.len() > spec.max_seq_len;
    input_ids.truncate(spec.max_seq_len);
    target_mask.truncate(spec.max_seq_len);
    Ok(Example { input_ids, target_mask, truncated })
}

fn overlaps(spans: &[Range<usize>], start: usize, end: usize) -> bool {
    spans.iter().any(|s| start < s.end && end > s.start)
}

type ChatTokens = (Vec<u32>, Vec<(usize, usize)>, Vec<Range<usize>>);

/// Render and tokenize a conversation: ids, each token's byte offsets in the rendered text, and the byte
/// spans of the assistant turns.
fn tokenize_chat(conversation: &Conversation, spec: &TokenizeSpec<'_>) -> Result<ChatTokens> {
    let (text, spans) = assistant_spans(conversation, spec)?;
    let encoding = encode_rendered(&text, spec)?;
    Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec(), spans))
}

/// Tokenize a rendered conversation. A real template writes BOS itself when the model wants one (transformers
/// tokenizes its output without special tokens); the fallback format relies on the post-processor for BOS.
pub(super) fn encode_rendered(text: &str, spec: &TokenizeSpec<'_>) -> Result<tokenizers::Encoding> {
    let add_special_tokens = spec.uses_fallback_template();
    let encoding =
        spec.tokenizer.inner().encode(text, add_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))?;
    spec.tokenizer.check_ids(encoding.get_ids())?;
    Ok(encoding)
}

/// The rendered conversation and the byte span of each assistant turn in it (content through the
/// end-of-turn marker, trailing whitespace excluded).
pub fn assistant_spans(conversation: &Conversation, spec: &TokenizeSpec<'_>) -> Result<(String, Vec<Range<usize>>)> {
    let (messages, tools) = (conversation.messages.as_slice(), conversation.tools.as_deref());
    let full = spec.render(messages, tools, false)?;
    let mut spans: Vec<Range<usize>> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        if message.role != "assistant" {
            continue;
        }
        let turn = spans.len() + 1;
        let before = match spec.render(&messages[..i], tools, true) {
            Ok(text) => text,
            // Many templates cannot render an empty conversation; a leading assistant turn starts at 0.
            Err(_) if i == 0 => String::new(),
            Err(e) => return Err(e),
        };
        let through = spec.render(&messages[..=i], tools, false)?;
        if !full.starts_with(&before) || !through.starts_with(&before) {
            return Err(inconsistent_template(turn));
        }
        let start = before.len();
        let end = if full.starts_with(&through) {
            through.len()
        } else {
            // Some templates (Qwen3's thinking blocks) render the last assistant turn differently from
            // earlier ones; find this turn's content and its closing marker in the full text instead.
            locate_turn_end(&full, start, &through[start..], &message.content)
                .ok_or_else(|| inconsistent_template(turn))?
        };
        let end = start + full[start..end].trim_end().len();
        if spans.last().is_some_and(|last| start < last.end) {
            return Err(inconsistent_template(turn));
        }
        spans.push(start..end);
    }
    Ok((full, spans))
}

fn inconsistent_template(turn: usize) -> Error {
    Error::ChatTemplate(format!(
        "cannot locate assistant turn {turn} in the rendered conversation: the chat template renders earlier \
         turns differently once later messages follow; set train_on_prompt to train on every token"
    ))
}

fn locate_turn_end(full: &str, start: usize, rendered_turn: &str, content: &str) -> Option<usize> {
    let content = content.trim();
    let (closing, from) = if content.is_empty() {
        (rendered_turn.trim_end(), start)
    } else {
        let in_turn = rendered_turn.rfind(content)?;
        let closing = rendered_turn[in_turn + content.len()..].trim_end();
        let at = start + full.get(start..)?.find(content)?;
        (closing, at + content.len())
    };
    full.get(from..)?.starts_with(closing).then_some(from + closing.len())
}

/// Token pieces of a row with their trained flag, for colouring in the studio. Pieces concatenate to the
/// decoded text; a piece is empty when its token completes no character yet (the character goes to the
/// token that completes it). Special tokens are shown.
pub fn preview_row(row: &Row, spec: &TokenizeSpec<'_>) -> Result<Vec<(String, bool)>> {
    let example = tokenize_row(row, spec)?;
    preview_example(&example, spec.tokenizer)
}

/// [`preview_row`] for an already tokenized example.
pub fn preview_example(example: &Example, tokenizer: &TextTokenizer) -> Result<Vec<(String, bool)>> {
    let ids = &example.input_ids;
    let mut pieces = Vec::with_capacity(ids.len());
    // Decode a short window before each token so byte-level pieces and leading-space rules come out as in
    // the full text; `pending` holds tokens that ended inside a multi-byte character.
    let mut pending_from: usize = 0;
    for j in 0..ids.len() {
        let window = pending_from.saturating_sub(4);
        let prefix = tokenizer.decode(&ids[window..pending_from], false)?;
        let text = tokenizer.decode(&ids[window..=j], false)?;
        let piece = if text.ends_with('\u{FFFD}') && j + 1 < ids.len() {
            String::new()
        } else if let Some(rest) = text.strip_prefix(prefix.as_str()) {
            pending_from = j + 1;
            rest.to_string()
        } else {
            pending_from = j + 1;
            tokenizer.decode(&ids[j..=j], false)?
        };
        pieces.push((piece, example.target_mask.get(j).copied().unwrap_or(false)));
    }
    Ok(pieces)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::model::chat_template::find_template_source;
    use std::path::Path;

    pub(crate) const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// A byte-level BPE tokenizer with no merges (one token per byte) and ChatML specials: offsets are
    /// exact, so masks can be checked character by character.
    pub(crate) fn byte_tokenizer() -> TextTokenizer {
        let mut alphabet: Vec<char> =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet().into_iter().collect();
        alphabet.sort_unstable();
        let vocab: serde_json::Map<String, serde_json::Value> =
            alphabet.iter().enumerate().map(|(i, c)| (c.to_string(), serde_json::json!(i))).collect();
        let n = alphabet.len();
        let added: Vec<serde_json::Value> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            .iter()
            .enumerate()
            .map(|(k, t)| {
                serde_json::json!({"id": n + k, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}
        });
        let inner: tokenizers::Tokenizer = serde_json::from_value(json).unwrap();
        TextTokenizer::new(inner, None, Some("<|im_end|>".into()))
    }

    fn spec<'a>(tok: &'a TextTokenizer, template: Option<&'a ChatTemplate>) -> TokenizeSpec<'a> {
        TokenizeSpec {
            tokenizer: tok,
            chat_template: template,
            eos_token_id: tok.token_to_id("<|im_end|>"),
            max_seq_len: 4096,
            train_on_prompt: false,
        }
    }

    fn two_turns() -> Row {
        Row::Chat(
            vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi"),
                ChatMessage::new("assistant", "Hello!"),
                ChatMessage::new("user", "Bye"),
                ChatMessage::new("assistant", "Ciao é"),
            ]
            .into(),
        )
    }

    /// The trained text, with untrained stretches collapsed to `|`.
    fn trained_text(pieces: &[(String, bool)]) -> String {
        let mut out = String::new();
        let mut last = true;
        for (piece, trained) in pieces {
            if *trained {
                out.push_str(piece);
            } else if last {
                out.push('|');
            }
            last = *trained;
        }
        out
    }

    fn check_chatml_masking(tok: &TextTokenizer, template: &ChatTemplate) {
        let s = spec(tok, Some(template));
        let example = tokenize_row(&two_turns(), &s).unwrap();
        assert!(!example.target_mask[0]);
        assert!(!example.truncated);
        let pieces = preview_example(&example, tok).unwrap();
        let decoded: String = pieces.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(decoded, tok.decode(&example.input_ids, false).unwrap());
        // Both assistant turns, each with its <|im_end|>; nothing of the system or user turns, nor the
        // `<|im_start|>assistant\n` header, nor the newline after <|im_end|>.
        assert_eq!(trained_text(&pieces), "|Hello!<|im_end|>|Ciao é<|im_end|>|");
        let im_end = tok.token_to_id("<|im_end|>").unwrap();
        let trained_im_ends =
            example.input_ids.iter().zip(&example.target_mask).filter(|(&id, &t)| id == im_end && t).count();
        assert_eq!(trained_im_ends, 2);

        let all = tokenize_row(&two_turns(), &TokenizeSpec { train_on_prompt: true, ..s }).unwrap();
        assert_eq!(all.target_tokens(), all.len() - 1);
    }

    #[test]
    fn chatml_masks_every_assistant_turn_and_its_end_marker() {
        let tok = byte_tokenizer();
        let template = ChatTemplate::new(CHATML.into(), None, Some("<|im_end|>".into())).unwrap();
        check_chatml_masking(&tok, &template);
    }

    #[test]
    fn chatml_masking_with_the_tiny_llama_fixture() {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
        let Ok(inner) = TextTokenizer::from_file(&folder.join("tokenizer.json")) else {
            eprintln!("skipped: tests/fixtures/tiny-llama/tokenizer.json is absent (run scripts/make_fixtures.py)");
            return;
        };
        let config: serde_json::Value = crate::engine::error::read_json(&folder.join("tokenizer_config.json")).unwrap();
        let source = find_template_source(&folder, Some(&config)).unwrap().unwrap();
        let tok = TextTokenizer::new(inner, None, Some("<|im_end|>".into()));
        let template = ChatTemplate::new(source, None, Some("<|im_end|>".into())).unwrap();
        check_chatml_masking(&tok, &template);
    }

    #[test]
    fn completions_become_a_user_assistant_exchange() {
        let tok = byte_tokenizer();
        let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let row = Row::Completion { prompt: "2+2=".into(), completion: "4".into() };
        let pieces = preview_row(&row, &spec(&tok, Some(&template))).unwrap();
        assert_eq!(trained_text(&pieces), "|4<|im_end|>|");
        let decoded: String = pieces.iter().map(|(p, _)| p.as_str()).collect();
        assert!(decoded.starts_with("<|im_start|>user\n2+2=<|im_end|>"), "{decoded}");
    }

    #[test]
    fn text_rows_train_everything_and_end_with_eos() {
        let tok = byte_tokenizer();
        let s = spec(&tok, None);
        let example = tokenize_row(&Row::Text("abc".into()), &s).unwrap();
        assert_eq!(example.len(), 4);
        assert_eq!(example.input_ids.last().copied(), s.eos_token_id);
        assert_eq!(example.target_mask, vec![false, true, true, true]);
    }

    #[test]
    fn without_a_template_the_fallback_format_trains_the_replies() {
        let tok = byte_tokenizer();
        let pieces = preview_row(&two_turns(), &spec(&tok, None)).unwrap();
        assert_eq!(trained_text(&pieces), "|Hello!<|im_end|>|Ciao é<|im_end|>|");
        let decoded: String = pieces.iter().map(|(p, _)| p.as_str()).collect();
        assert!(decoded.starts_with("### System\nBe brief.\n\n### User\nHi\n\n### Assistant\nHello!"), "{decoded}");
    }

    #[test]
    fn templates_that_rewrite_earlier_turns_still_mask_correctly() {
        // Like Qwen3: only the last assistant turn gets an (empty) thinking block.
        let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}<think></think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let tok = byte_tokenizer();
        let template = ChatTemplate::new(source.into(), None, None).unwrap();
        let pieces = preview_row(&two_turns(), &spec(&tok, Some(&template))).unwrap();
        assert_eq!(trained_text(&pieces), "|Hello!<|im_end|>|<think></think>Ciao é<|im_end|>|");
    }

    #[test]
    fn truncation_cuts_the_tail_and_says_so() {
        let tok = byte_tokenizer();
        let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let s = TokenizeSpec { max_seq_len: 10, ..spec(&tok, Some(&template)) };
        let example = tokenize_row(&two_turns(), &s).unwrap();
        assert!(example.truncated);
        assert_eq!((example.input_ids.len(), example.target_mask.len()), (10, 10));
        assert_eq!(example.target_tokens(), 0, "the first reply starts after 10 tokens");
        let too_small = TokenizeSpec { max_seq_len: 1, ..s };
        assert!(tokenize_row(&two_turns(), &too_small).is_err());
    }
}
