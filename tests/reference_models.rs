//! Our transformer against Hugging Face transformers: per-token log-probs, greedy continuations, chat
//! templates (each family's published one: Gemma 3, Phi-4-mini, SmolLM3, Granite 3.3, OLMo 2; ChatML for the
//! rest) and detokenization for tiny random llama / mistral / qwen2 / qwen3 / gemma3 / olmo2 / phi3 /
//! smollm3 / granite models
//! (fixtures from scripts/make_fixtures.py).

mod common;

use candle_core::{DType, Device};
use common::*;
use metal_candle::engine::generate::score;
use metal_candle::engine::model::chat_template::{ChatMessage, DateTime};
use metal_candle::engine::model::load_model;

/// tiny-phi3: fused qkv/gate_up, partial rotary and LongRoPE with an original context of 16 tokens, which
/// the 44-token score text crosses (long factors) and the greedy run crosses mid-way (short factors in the
/// cached prompt, long ones after). tiny-smollm3: layer 0 without rope. tiny-granite: all four multipliers.
const ARCHS: [&str; 9] = FAMILIES;

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
        let mut m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        let chat = &expected(arch)["chat"];
        // transformers rendered `strftime_now` on this day; ours must print the same date for it.
        if let Some(today) = chat["today"].as_str() {
            let today = DateTime::parse_date(today).unwrap();
            m.chat_template = m.chat_template.take().map(|t| t.with_today(today));
        }
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
        // A role the template refuses raises its message; templates that take any role render it.
        if let Some(invalid) = chat.get("invalid_role") {
            let err = m.render_chat(&messages(&invalid["messages"]), true).unwrap_err().to_string();
            assert!(err.contains(invalid["error"].as_str().unwrap()), "{arch}: {err}");
        } else {
            let unknown = &chat["unknown_role"];
            let rendered = m.render_chat(&messages(&unknown["messages"]), true).unwrap();
            assert_eq!(rendered, unknown["rendered"].as_str().unwrap(), "{arch}: unknown role");
        }
        for case in chat["extra"].as_array().into_iter().flatten() {
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let rendered = m.render_chat(&messages(&case["messages"]), gen).unwrap();
            assert_eq!(rendered, case["rendered"].as_str().unwrap(), "{arch}: {}", case["messages"]);
        }
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

/// A multimodal gemma3 folder (config with `text_config`, the language model's weights under either
/// transformers layout, a vision tower and projector beside them), built from tiny-gemma3: its text tower
/// loads with tiny-gemma3's log-probs, the notice names the ignored tensors, and the merged export of it is a
/// text-only gemma3_text folder.
#[test]
fn multimodal_gemma3_folders_load_their_text_tower() {
    let base = fixture("tiny-gemma3");
    let text_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("config.json")).unwrap()).unwrap();
    let tensors = candle_core::safetensors::load(base.join("model.safetensors"), &Device::Cpu).unwrap();
    let exp = expected("tiny-gemma3");
    for (text_prefix, vision_prefix) in [("language_model.model.", ""), ("model.language_model.", "model.")] {
        let dir = tempfile::tempdir().unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"] {
            std::fs::copy(base.join(f), dir.path().join(f)).unwrap();
        }
        let config = serde_json::json!({
            "model_type": "gemma3",
            "architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": text_config,
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8},
            "mm_tokens_per_image": 4,
            "eos_token_id": [513, 516],
        });
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let mut stored: std::collections::HashMap<String, candle_core::Tensor> = tensors
            .iter()
            .map(|(name, t)| (format!("{text_prefix}{}", name.strip_prefix("model.").unwrap()), t.clone()))
            .collect();
        let dummy = candle_core::Tensor::zeros((8, 3, 2, 2), DType::F32, &Device::Cpu).unwrap();
        stored.insert(format!("{vision_prefix}vision_tower.vision_model.embeddings.patch_embedding.weight"), dummy);
        let projector = candle_core::Tensor::zeros((8, 64), DType::F32, &Device::Cpu).unwrap();
        stored.insert(format!("{vision_prefix}multi_modal_projector.mm_input_projection_weight"), projector);
        candle_core::safetensors::save(&stored, dir.path().join("model.safetensors")).unwrap();

        let m = load_model(dir.path(), &Device::Cpu, DType::F32).unwrap();
        assert!(m.config.multimodal, "{text_prefix}");
        assert!(m.notes.iter().any(|n| n.contains("vision tower") && n.contains("(2 tensors)")), "{:?}", m.notes);
        let ids = common::ids(&exp["score"]["ids"]);
        let diff = max_abs_diff(&score(&m.model, &ids).unwrap(), &floats(&exp["score"]["token_logprobs"]));
        assert!(diff < 1e-4, "{text_prefix}: max |logprob diff| = {diff}");

        // An adapter (non-zero B) merged into the multimodal base: a text-only gemma3_text folder.
        let ckpt = dir.path().join("adapter");
        std::fs::create_dir(&ckpt).unwrap();
        let mut tuned = load_model(dir.path(), &Device::Cpu, DType::F32).unwrap();
        let settings = metal_candle::engine::train::LoraSettings {
            rank: 2,
            alpha: 4.0,
            targets: "all-linear".parse().unwrap(),
            ..Default::default()
        };
        let params = metal_candle::engine::lora::attach_new_adapters(&mut tuned.model, &settings, 1).unwrap();
        for p in &params {
            p.b.set(&candle_core::Tensor::randn(0f32, 0.2, p.b.shape(), &Device::Cpu).unwrap()).unwrap();
        }
        let tuned_lp = score(&tuned.model, &ids).unwrap();
        use metal_candle::engine::checkpoint::{save_peft_adapter, PeftAdapterConfig};
        let adapter_config =
            PeftAdapterConfig::for_settings(&settings, tuned.config.num_layers, &dir.path().to_string_lossy()).unwrap();
        save_peft_adapter(&ckpt, &params, &adapter_config).unwrap();
        // Beside the base model, not inside it: an export never writes into its base.
        let out_dir = tempfile::tempdir().unwrap();
        let out = out_dir.path().join("merged");
        use metal_candle::engine::export::{export, ExportFormat};
        export(&ckpt, ExportFormat::Merged, &out, dir.path()).unwrap();
        let merged: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(merged["model_type"], "gemma3_text");
        assert_eq!(merged["eos_token_id"], serde_json::json!([513, 516]));
        let names = candle_core::safetensors::load(out.join("model.safetensors"), &Device::Cpu).unwrap();
        let mut names: Vec<_> = names.into_keys().collect();
        names.sort();
        let mut want: Vec<_> = tensors.keys().cloned().collect();
        want.sort();
        assert_eq!(names, want, "{text_prefix}: the merged export holds the text model's tensors, text-only names");
        let m = load_model(&out, &Device::Cpu, DType::F32).unwrap();
        let tuned_lp: Vec<f64> = tuned_lp.iter().map(|&x| x as f64).collect();
        let diff = max_abs_diff(&score(&m.model, &ids).unwrap(), &tuned_lp);
        assert!(diff < 1e-4, "{text_prefix}: merged export vs the adapter unmerged: max |logprob diff| = {diff}");
    }
}
