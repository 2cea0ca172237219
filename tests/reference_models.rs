//! Our transformer against Hugging Face transformers: per-token log-probs, greedy continuations, chat
//! templates and detokenization for tiny random llama / mistral / qwen2 / qwen3 / phi3 / smollm3 / granite models
//! (fixtures from scripts/make_fixtures.py).

mod common;

use candle_core::{DType, Device};
use common::*;
use metal_candle::engine::generate::score;
use metal_candle::engine::model::chat_template::ChatMessage;
use metal_candle::engine::model::load_model;

/// tiny-phi3: fused qkv/gate_up, partial rotary and LongRoPE with an original context of 16 tokens, which
/// the 44-token score text crosses (long factors) and the greedy run crosses mid-way (short factors in the
/// cached prompt, long ones after). tiny-smollm3: layer 0 without rope. tiny-granite: all four multipliers.
const ARCHS: [&str; 7] =
    ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-phi3", "tiny-smollm3", "tiny-granite"];

fn messages(v: &serde_json::Value) -> Vec<ChatMessage> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn logprobs_match_transformers_for_every_architecture() {
    for arch in ARCHS {
        let m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        let exp = expected(arch);
        let text = exp["score"]["text"].as_str().unwrap();
        let ids = m.tokenizer.encode(text, true).unwrap();
        assert_eq!(ids, common::ids(&exp["score"]["ids"]), "{arch}: token ids differ");
        let lp = score(&m.model, &ids).unwrap();
        let diff = max_abs_diff(&lp, &floats(&exp["score"]["token_logprobs"]));
        assert!(diff < 1e-4, "{arch}: max |logprob diff| = {diff}");
    }
}

#[test]
fn greedy_continuations_match_transformers() {
    for arch in ARCHS {
        let m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        let g = &expected(arch)["greedy"];
        assert_eq!(common::greedy_ids(&m, g), common::ids(&g["generated_ids"]), "{arch}: greedy ids differ");
    }
}

#[test]
fn chat_templates_render_like_transformers() {
    for arch in ARCHS {
        let m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        let chat = &expected(arch)["chat"];
        let msgs = messages(&chat["messages"]);
        assert_eq!(m.render_chat(&msgs, true).unwrap(), chat["rendered"].as_str().unwrap(), "{arch}");
        assert_eq!(
            m.render_chat(&msgs, false).unwrap(),
            chat["rendered_no_generation_prompt"].as_str().unwrap(),
            "{arch}"
        );
        let multi = &chat["multi_turn"];
        assert_eq!(
            m.render_chat(&messages(&multi["messages"]), true).unwrap(),
            multi["rendered"].as_str().unwrap(),
            "{arch}: multi-turn"
        );
        assert_eq!(m.encode_chat(&msgs).unwrap(), ids(&chat["ids"]), "{arch}: chat ids");
        let invalid = &chat["invalid_role"];
        let err = m.render_chat(&messages(&invalid["messages"]), true).unwrap_err().to_string();
        assert!(err.contains(invalid["error"].as_str().unwrap()), "{arch}: {err}");
    }
}

#[test]
fn streaming_detokenization_never_splits_characters() {
    let m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let check = &expected("tiny-llama")["decode_check"];
    let mut decoder = metal_candle::engine::model::tokenizer::StreamDecoder::new(&m.tokenizer);
    let mut text = String::new();
    for id in ids(&check["ids"]) {
        if let Some(piece) = decoder.push(id).unwrap() {
            assert!(!piece.contains('\u{FFFD}'), "piece {piece:?} holds a broken character");
            text.push_str(&piece);
        }
    }
    if let Some(rest) = decoder.finish().unwrap() {
        text.push_str(&rest);
    }
    assert_eq!(text, check["text_skip_special"].as_str().unwrap());
}

#[test]
fn eos_ids_come_from_generation_config_lists() {
    // tiny-qwen2's generation_config.json lists two eos ids.
    let m = load_model(&fixture("tiny-qwen2"), &Device::Cpu, DType::F32).unwrap();
    let gen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-qwen2").join("generation_config.json")).unwrap())
            .unwrap();
    if let Some(list) = gen["eos_token_id"].as_array() {
        for id in list {
            assert!(m.eos_token_ids.contains(&(id.as_u64().unwrap() as u32)), "{:?}", m.eos_token_ids);
        }
    }
}
