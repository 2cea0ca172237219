use super::*;

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn tokenizer() -> TextTokenizer {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama/tokenizer.json");
    TextTokenizer::new(TextTokenizer::from_file(&path).unwrap(), None, Some("<|im_end|>".into()))
}

fn facts<'a>(tok: &'a TextTokenizer, template: Option<&'a ChatTemplate>, stop: &'a [u32]) -> StopFacts<'a> {
    StopFacts {
        tokenizer: tok,
        chat_template: template,
        stop_ids: stop,
        declared: vec![("config.json".into(), vec![2]), ("the tokenizer's eos_token".into(), vec![2])],
    }
}

#[test]
fn a_template_that_closes_turns_with_the_stop_token_passes() {
    let tok = tokenizer();
    let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
    let (warnings, eot) = check_model(&facts(&tok, Some(&template), &[2]));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(eot, Some(2));
}

#[test]
fn a_template_that_forgets_the_end_token_is_reported() {
    let tok = tokenizer();
    let forgetful = CHATML.replace("<|im_end|>", "");
    let template = ChatTemplate::new(forgetful, None, None).unwrap();
    let (warnings, eot) = check_model(&facts(&tok, Some(&template), &[2]));
    assert_eq!(eot, None);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].check, StopCheck::Template);
    assert!(warnings[0].message.contains("does not end an assistant turn"), "{}", warnings[0]);
}

#[test]
fn a_template_that_drops_a_message_is_reported() {
    let tok = tokenizer();
    let dropping = CHATML.replace("{{ m.content }}", "{% if m.role == 'user' %}{{ m.content }}{% endif %}");
    let template = ChatTemplate::new(dropping, None, None).unwrap();
    let (warnings, _) = check_model(&facts(&tok, Some(&template), &[2]));
    assert!(warnings.iter().any(|w| w.message.contains("drops or reorders the assistant")), "{warnings:?}");
}

#[test]
fn mismatched_eos_ids_are_reported() {
    let tok = tokenizer();
    let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
    let mut f = facts(&tok, Some(&template), &[2]);
    f.declared = vec![("config.json".into(), vec![0]), ("generation_config.json".into(), vec![0])];
    let (warnings, _) = check_model(&f);
    assert!(warnings.iter().any(|w| w.check == StopCheck::Agreement && w.message.contains("none of")), "{warnings:?}");

    f.declared.push(("the tokenizer's eos_token".into(), vec![2]));
    let (warnings, _) = check_model(&f);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].message.contains("eos_token <|im_end|> (2) is not among"), "{}", warnings[0]);
}

#[test]
fn rows_without_a_final_stop_token_are_counted() {
    let ex = |ids: Vec<u32>, truncated: bool| Example {
        target_mask: ids.iter().map(|_| true).collect(),
        input_ids: ids,
        truncated,
    };
    let rows = [ex(vec![5, 6, 2], false), ex(vec![5, 6, 7], false), ex(vec![5, 6, 7], true)];
    let warning = check_rows(&rows, &[2]).unwrap();
    assert!(warning.message.starts_with("1 of 2 training rows"), "{warning}");
    assert!(check_rows(&rows[..1], &[2]).is_none());
}

#[test]
fn an_export_that_misses_the_end_of_turn_token_is_reported() {
    let tok = tokenizer();
    let f = facts(&tok, None, &[2]);
    let good = "FROM ./model.gguf\nPARAMETER stop \"<|im_end|>\"\n";
    assert!(check_export(&f, Some(2), &[2], Some(good)).is_empty());
    let warnings = check_export(&f, Some(2), &[0], Some("FROM ./model.gguf\n"));
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].message.contains("do not include the end-of-turn token <|im_end|> (2)"), "{}", warnings[0]);
    assert!(warnings[1].message.contains("PARAMETER stop \"<|im_end|>\""), "{}", warnings[1]);
}
