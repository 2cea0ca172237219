//! Unit tests of preference tokenization and batching (tokenizers: the byte tokenizer of `tokenize`'s tests,
//! and tiny-llama's real one).

use super::*;
use crate::engine::data::tokenize::tests::{byte_tokenizer, CHATML};
use crate::engine::model::chat_template::ChatTemplate;
use crate::engine::model::tokenizer::TextTokenizer;

fn spec<'a>(tok: &'a TextTokenizer, template: Option<&'a ChatTemplate>, max_seq_len: usize) -> TokenizeSpec<'a> {
    TokenizeSpec {
        tokenizer: tok,
        chat_template: template,
        eos_token_id: tok.token_to_id("<|im_end|>"),
        max_seq_len,
        train_on_prompt: false,
    }
}

/// The decoded text of an example with its trained part in brackets.
fn shown(tok: &TextTokenizer, e: &Example) -> String {
    let split = prompt_tokens(e);
    assert!(e.target_mask[split..].iter().all(|&t| t), "trained tokens are one stretch at the end");
    let prompt = tok.decode(&e.input_ids[..split], false).unwrap();
    let completion = tok.decode(&e.input_ids[split..], false).unwrap();
    format!("{prompt}[{completion}]")
}

fn text(s: &str) -> PreferenceTurns {
    PreferenceTurns::Text(s.into())
}

fn said(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

#[test]
fn standard_pairs_append_eos_text_once_and_train_the_completions() {
    let tok = byte_tokenizer();
    let row = PreferenceRow { prompt: text("2+2="), chosen: text("4"), rejected: text("5<|im_end|>"), tools: None };
    let (chosen, rejected) = tokenize_pair(&row, &spec(&tok, None, 64)).unwrap();
    assert_eq!(shown(&tok, &chosen), "2+2=[4<|im_end|>]");
    assert_eq!(shown(&tok, &rejected), "2+2=[5<|im_end|>]");
    assert_eq!((chosen.target_tokens(), chosen.truncated), (2, false));
}

#[test]
fn conversational_pairs_render_the_prompt_with_the_generation_prompt() {
    let tok = byte_tokenizer();
    let template = ChatTemplate::new(CHATML.into(), None, Some("<|im_end|>".into())).unwrap();
    let row = PreferenceRow {
        prompt: PreferenceTurns::Messages(vec![said("user", "2+2?")]),
        chosen: PreferenceTurns::Messages(vec![said("assistant", "4")]),
        rejected: PreferenceTurns::Messages(vec![said("assistant", "five")]),
        tools: None,
    };
    let (chosen, rejected) = tokenize_pair(&row, &spec(&tok, Some(&template), 64)).unwrap();
    let prompt = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(shown(&tok, &chosen), format!("{prompt}[4<|im_end|>\n]"));
    assert_eq!(shown(&tok, &rejected), format!("{prompt}[five<|im_end|>\n]"));
}

#[test]
fn the_prompt_is_the_common_prefix_when_the_template_rewrites_it() {
    // Like Gemma: the generation prompt alone ends differently from the rendered conversation, so the
    // completion starts where the two diverge (TRL's common_prefix_length), not after the tokenized prompt.
    let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<assistant><think>{% endif %}";
    let tok = byte_tokenizer();
    let template = ChatTemplate::new(source.into(), None, None).unwrap();
    let row = PreferenceRow {
        prompt: PreferenceTurns::Messages(vec![said("user", "q")]),
        chosen: PreferenceTurns::Messages(vec![said("assistant", "yes")]),
        rejected: PreferenceTurns::Messages(vec![said("assistant", "no")]),
        tools: None,
    };
    let (chosen, rejected) = tokenize_pair(&row, &spec(&tok, Some(&template), 64)).unwrap();
    assert_eq!(shown(&tok, &chosen), "<user>q</s><assistant>[yes</s>]");
    assert_eq!(shown(&tok, &rejected), "<user>q</s><assistant>[no</s>]");
}

#[test]
fn truncation_keeps_the_start_of_each_sequence() {
    let tok = byte_tokenizer();
    let row = PreferenceRow { prompt: text("abc"), chosen: text("defgh"), rejected: text("d"), tools: None };
    let (chosen, rejected) = tokenize_pair(&row, &spec(&tok, None, 5)).unwrap();
    assert_eq!(tok.decode(&chosen.input_ids, false).unwrap(), "abcde");
    assert_eq!(chosen.target_mask, [false, false, false, true, true]);
    assert!(chosen.truncated);
    // "d<|im_end|>" is 2 tokens: 5 in all, not cut.
    assert_eq!((rejected.len(), rejected.truncated), (5, false));
    let (filled, _) = tokenize_pair(&row, &spec(&tok, None, 3)).unwrap();
    assert!(filled.cut(3).dropped(), "a prompt that fills max_seq_len leaves nothing to train");
    assert!(tokenize_pair(&row, &spec(&tok, None, 1)).is_err());
}

#[test]
fn collate_pairs_puts_every_chosen_before_every_rejected() {
    let example = |ids: &[u32]| Example {
        input_ids: ids.to_vec(),
        target_mask: (0..ids.len()).map(|j| j > 0).collect(),
        truncated: false,
    };
    let split = PreparedSplit {
        examples: vec![example(&[1, 2]), example(&[3, 4, 5])],
        source_lines: vec![1, 2],
        rejected: Some(vec![example(&[6]), example(&[7, 8, 9, 10])]),
        prompts: None,
    };
    let batch = collate_pairs(&split, &[1, 0], 0).unwrap();
    assert_eq!((batch.batch_size, batch.seq_len), (4, 4));
    assert_eq!(batch.input_ids, [3, 4, 5, 0, 1, 2, 0, 0, 7, 8, 9, 10, 6, 0, 0, 0]);
    assert_eq!(batch.lengths, [3, 2, 4, 1]);
    assert_eq!(batch.target_tokens, 2 + 1 + 3);
    assert_eq!(split.lengths(), [2, 4]);
    let err = collate_pairs(&split, &[2], 0).unwrap_err().to_string();
    assert!(err.contains("chosen sequence 2"), "{err}");
    let sft = PreparedSplit { rejected: None, ..split };
    assert!(collate_pairs(&sft, &[0], 0).unwrap_err().to_string().contains("no preference pairs"));
}
