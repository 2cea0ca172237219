//! The estimate's tests: parameters by rank and targets, memory by batch, sequence, checkpointing, quantized bases
//! and fused attention, and the warnings and one-click fixes built on them.

use super::*;

pub(crate) fn smollm_like() -> ModelShape {
    ModelShape {
        parameters: 134_515_008,
        layers: 30,
        hidden_size: 576,
        intermediate_size: 1536,
        attention_heads: 9,
        kv_heads: 3,
        head_dim: 64,
        vocab_size: 49152,
        tied_embeddings: true,
        context_length: 8192,
        dtype_bytes: 4,
        linear_shapes: vec![
            ("q_proj".into(), 576, 576),
            ("k_proj".into(), 576, 192),
            ("v_proj".into(), 576, 192),
            ("o_proj".into(), 576, 576),
            ("gate_proj".into(), 576, 1536),
            ("up_proj".into(), 576, 1536),
            ("down_proj".into(), 1536, 576),
        ],
        base_weights_bytes: None,
        fused_attention: false,
        offloads_checkpoints: false,
        defers_mlp: false,
        dequantizes_head: false,
    }
}

#[test]
fn trainable_params_follow_rank_targets_and_layers() {
    let m = smollm_like();
    let lora = LoraSettings { rank: 8, targets: "q_proj,v_proj".parse().unwrap(), ..Default::default() };
    // q: 8*(576+576) + v: 8*(576+192), 30 layers
    assert_eq!(trainable_params(&m, &lora).unwrap(), 30 * (8 * 1152 + 8 * 768));
    let last4 = LoraSettings { layers: Some(4), ..lora.clone() };
    assert_eq!(trainable_params(&m, &last4).unwrap(), 4 * (8 * 1152 + 8 * 768));
    let err = "q_proj,nope".parse::<crate::engine::lora::Targets>().unwrap_err().to_string();
    assert!(err.contains("unknown LoRA target `nope`"), "{err}");
}

#[test]
fn memory_grows_with_batch_and_sequence() {
    let m = smollm_like();
    let small = TrainConfig { batch_size: 1, seq_len: 128, ..Default::default() };
    let big = TrainConfig { batch_size: 4, seq_len: 512, ..Default::default() };
    let (a, b) = (training_memory(&m, &small), training_memory(&m, &big));
    assert_eq!(a.base_weights_bytes, b.base_weights_bytes);
    assert!(b.activations_bytes > 4 * a.activations_bytes);
    assert!(b.total_bytes() > a.total_bytes());
}

#[test]
fn the_estimate_matches_the_adapters_the_trainer_attaches() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
    let mut m = crate::engine::model::load_model(&dir, &candle_core::Device::Cpu, candle_core::DType::F32).unwrap();
    let lora = LoraSettings { rank: 4, targets: "all-linear".parse().unwrap(), layers: Some(1), ..Default::default() };
    let shape = ModelShape::of(&m.config, 4);
    let params = crate::engine::lora::attach_new_adapters(&mut m.model, &lora, 0).unwrap();
    let attached: usize = params.iter().map(|p| p.elem_count()).sum();
    assert_eq!(trainable_params(&shape, &lora).unwrap(), attached);
    // DoRA adds a magnitude per output row, and the estimate counts it (and its kept output) too.
    let dora = LoraSettings { dora: true, ..lora.clone() };
    let params = crate::engine::lora::attach_new_adapters(&mut m.model, &dora, 0).unwrap();
    let attached_dora: usize = params.iter().map(|p| p.elem_count()).sum();
    assert_eq!(trainable_params(&shape, &dora).unwrap(), attached_dora);
    assert!(attached_dora > attached);
    let memory =
        |lora: &LoraSettings| training_memory(&shape, &TrainConfig { lora: lora.clone(), ..Default::default() });
    assert!(memory(&dora).activations_bytes > memory(&lora).activations_bytes);
}

#[test]
fn a_quantized_base_costs_bytes_by_type_and_is_proposed_when_dense_does_not_fit() {
    let m = smollm_like();
    let dense = base_weights_bytes_with(&m, BaseQuant::None);
    assert_eq!(dense, m.parameters as u64 * 4);
    let q8 = base_weights_bytes_with(&m, BaseQuant::Q8_0);
    let q4k = base_weights_bytes_with(&m, BaseQuant::Q4K);
    assert!(q4k < q8 && q8 < dense, "{q4k} {q8} {dense}");
    // 576-wide rows fit no Q4_K block: those projections fall back to Q5_0 (0.6875 bytes a weight).
    let linear: usize = m.linear_shapes.iter().map(|(_, i, o)| i * o).sum::<usize>() * m.layers;
    let expected_linear =
        30.0 * (576.0 * (576.0 * 2.0 + 192.0 * 2.0 + 1536.0 * 2.0) * 0.6875 + 1536.0 * 576.0 * 0.5625);
    // The tied 49152 x 576 vocabulary matrix: Q6_K does not fit 576-wide rows, so Q8_0 (1.0625 bytes).
    let vocab = m.vocab_size * m.hidden_size;
    let expected = (m.parameters - linear - vocab) as f64 * 4.0 + expected_linear + vocab as f64 * 1.0625;
    assert_eq!(q4k, expected as u64);
    let cfg = TrainConfig { batch_size: 1, seq_len: 128, ..TrainConfig::default() };
    let need = training_memory(&m, &cfg).total_bytes();
    assert!(quantization_that_fits(&m, &cfg, Some(need)).is_none(), "fits already");
    let (q, est) = quantization_that_fits(&m, &cfg, Some(need * 3 / 4)).unwrap();
    assert!(est.total_bytes() <= need * 3 / 4 && q != BaseQuant::None, "{q}");
    assert!(quantization_that_fits(&m, &cfg, Some(need / 20)).is_none(), "nothing fits");
}

#[test]
fn a_run_larger_than_the_budget_is_warned_about() {
    let m = smollm_like();
    let cfg = TrainConfig { batch_size: 64, seq_len: 2048, ..TrainConfig::default() };
    let est = training_memory(&m, &cfg);
    assert!(memory_warning(&m, &cfg, None, "RAM").is_none(), "unknown budget: no warning");
    assert!(memory_warning(&m, &cfg, Some(est.total_bytes()), "RAM").is_none());
    let warning = memory_warning(&m, &cfg, Some(est.total_bytes() / 2), "this machine's RAM").unwrap();
    assert!(warning.contains("this machine's RAM") && warning.contains("checkpointing"), "{warning}");
}

/// Llama-3.2-1B's shape in bf16.
fn llama_1b_bf16(fused_attention: bool) -> ModelShape {
    let (h, kv, i) = (2048, 512, 8192);
    ModelShape {
        parameters: 1_235_814_400,
        layers: 16,
        hidden_size: h,
        intermediate_size: i,
        attention_heads: 32,
        kv_heads: 8,
        head_dim: 64,
        vocab_size: 128_256,
        tied_embeddings: true,
        context_length: 131_072,
        dtype_bytes: 2,
        linear_shapes: [("q_proj", h, h), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", h, h)]
            .into_iter()
            .chain([("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)])
            .map(|(n, a, b)| (n.to_string(), a, b))
            .collect(),
        base_weights_bytes: None,
        fused_attention,
        offloads_checkpoints: false,
        defers_mlp: false,
        dequantizes_head: false,
    }
}

#[test]
fn fused_attention_keeps_no_quadratic_scores_and_auto_checkpointing_sees_it() {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let cfg = TrainConfig { batch_size: 1, seq_len: 4096, ..TrainConfig::default() };
    let (composed, fused) = (llama_1b_bf16(false), llama_1b_bf16(true));
    let (c, f) = (training_memory(&composed, &cfg), training_memory(&fused, &cfg));
    // 16 layers x 32 heads x 4096^2 probabilities in bf16 alone are 16 GiB.
    assert!(gib(c.total_bytes()) > 30.0, "{c:?}");
    // Measured on an H100 for this run (q,v, rank 8): 7.3 GB on the whole device, CUDA context included.
    assert!((5.0..10.0).contains(&gib(f.total_bytes())), "{f:?}");
    // Twice the tokens: the fused run's activations double, the composed run's more than triple.
    let long = TrainConfig { seq_len: 8192, ..cfg.clone() };
    let (c2, f2) = (training_memory(&composed, &long), training_memory(&fused, &long));
    assert!(f2.activations_bytes <= 2 * f.activations_bytes + (1 << 20), "{f:?} {f2:?}");
    assert!(c2.activations_bytes > 3 * c.activations_bytes, "{c:?} {c2:?}");
    // On a 24 GiB card, auto leaves checkpointing off for the fused run and turns it on for the composed one.
    let auto = TrainConfig { checkpointing: Checkpointing::Auto, ..cfg };
    assert!(!checkpointing_decision(&fused, &auto, Some(24 << 30), "GPU memory").enabled);
    assert!(checkpointing_decision(&composed, &auto, Some(24 << 30), "GPU memory").enabled);
}

#[test]
fn offloaded_checkpoints_leave_the_device_only_where_the_device_offloads() {
    let cfg = TrainConfig { batch_size: 1, seq_len: 32768, checkpointing: Checkpointing::On, ..TrainConfig::default() };
    let offload = TrainConfig { checkpointing: Checkpointing::Offload, ..cfg.clone() };
    let resident = llama_1b_bf16(true);
    let cuda = ModelShape { offloads_checkpoints: true, ..llama_1b_bf16(true) };
    let on = training_memory(&cuda, &cfg);
    // The CPU (or a Mac) keeps them where they were: offload is on there.
    assert_eq!(training_memory(&resident, &offload), training_memory(&resident, &cfg));
    // On CUDA two layers' inputs stay (the one recomputed, the next on its way back), not all 16.
    let off_device = training_memory(&cuda, &offload);
    let input_bytes = 32768 * 2048 * 2;
    assert_eq!(on.activations_bytes - off_device.activations_bytes, (16 - 2) * input_bytes);
    assert!(off_device.checkpointing);
    assert!(checkpointing_decision(&cuda, &offload, Some(1), "GPU memory").enabled);
    // auto offloads where the kept inputs alone would not fit; the fix for a run set to on is to offload.
    let auto = TrainConfig { checkpointing: Checkpointing::Auto, ..cfg.clone() };
    let between = (on.total_bytes() + off_device.total_bytes()) / 2;
    let decision = checkpointing_decision(&cuda, &auto, Some(between), "GPU memory");
    assert_eq!(decision.setting(), Checkpointing::Offload, "{}", decision.reason);
    assert_eq!(run_memory(&cuda, &auto, Some(between), "GPU memory"), off_device);
    assert_eq!(checkpointing_decision(&cuda, &auto, Some(on.total_bytes()), "GPU memory").setting(), Checkpointing::On);
    assert_eq!(checkpointing_decision(&resident, &auto, Some(between), "GPU memory").setting(), Checkpointing::On);
    assert_eq!(memory_fix(&cuda, &cfg, Some(between), "GPU memory").unwrap().0, MemoryFix::OffloadCheckpoints);
    let elsewhere = memory_fix(&resident, &cfg, Some(between), "GPU memory").map(|f| f.0);
    assert_ne!(elsewhere, Some(MemoryFix::OffloadCheckpoints), "only where the device offloads");
}

#[test]
fn a_deferred_mlp_leaves_the_recomputed_layer_without_its_mlp_activations() {
    let cfg = TrainConfig { batch_size: 1, seq_len: 65536, checkpointing: Checkpointing::On, ..TrainConfig::default() };
    let (kept, deferred) = (llama_1b_bf16(true), ModelShape { defers_mlp: true, ..llama_1b_bf16(true) });
    let (k, d) = (training_memory(&kept, &cfg), training_memory(&deferred, &cfg));
    let per_row = 8192 * 2;
    // gate and up (down's input is never kept) leave the recomputed tape.
    assert_eq!(k.activations_bytes - d.activations_bytes, 65536 * 2 * per_row);
    // The backward's six (rows x intermediate) tensors exist for one block of 16,384 rows, not three for all rows.
    assert_eq!(k.transient_bytes - d.transient_bytes, (3 * 65536 - 6 * 16384) * per_row);
    // Without checkpointing nothing is deferred.
    let off = TrainConfig { checkpointing: Checkpointing::Off, ..cfg };
    assert_eq!(training_memory(&kept, &off), training_memory(&deferred, &off));
}

#[test]
fn checkpointing_keeps_one_layer_and_auto_turns_it_on_only_when_the_run_does_not_fit() {
    let m = smollm_like();
    let cfg = TrainConfig { batch_size: 4, seq_len: 512, ..TrainConfig::default() };
    let (off, on) = (training_memory_with(&m, &cfg, false), training_memory_with(&m, &cfg, true));
    assert!(on.activations_bytes * 5 < off.activations_bytes, "{on:?} {off:?}");
    assert_eq!(on.base_weights_bytes, off.base_weights_bytes);
    let auto = TrainConfig { checkpointing: Checkpointing::Auto, ..cfg.clone() };
    let need = off.total_bytes();
    assert!(!checkpointing_decision(&m, &auto, Some(need), "RAM").enabled);
    assert!(!checkpointing_decision(&m, &auto, None, "RAM").enabled);
    let tight = checkpointing_decision(&m, &auto, Some(need - 1), "RAM");
    assert!(tight.enabled && tight.reason.contains("auto: on"), "{tight:?}");
    let mut resolved = auto.clone();
    let note = resolve_checkpointing(&m, &mut resolved, Some(need - 1), "RAM").unwrap();
    assert_eq!(resolved.checkpointing, Checkpointing::On, "{note}");
    // The offered fix is checkpointing when that fits, else a smaller batch.
    let budget = Some(on.total_bytes());
    assert_eq!(memory_fix(&m, &cfg, budget, "RAM").unwrap().0, MemoryFix::Checkpointing);
    let ckpt = TrainConfig { checkpointing: Checkpointing::On, ..cfg.clone() };
    let (fix, est) = memory_fix(&m, &ckpt, Some(on.total_bytes() - 1), "RAM").unwrap();
    assert!(matches!(fix, MemoryFix::BatchSize(2)), "{fix:?}");
    assert!(est.total_bytes() < on.total_bytes());
}

/// Short rows: batch 64 x sequence 2048 over rows of at most ~100 tokens is estimated at the padded length the
/// batches really have, so it fits where the full-length estimate asked for hundreds of GiB and advised a batch
/// of 2; the note says which length it assumed, and a dataset's rows never make the estimate exceed seq_len.
#[test]
fn the_estimate_pads_batches_to_the_datasets_longest_row() {
    let m = smollm_like();
    let config = TrainConfig { batch_size: 64, seq_len: 2048, ..Default::default() };
    let full = training_memory(&m, &config).total_bytes();
    let padded = training_memory(&m, &padded_to_data(&config, Some(91))).total_bytes();
    assert!(full > 50 * padded, "{full} vs {padded}");
    let budget = Some(padded + (padded / 2));
    assert!(memory_warning(&m, &config, budget, "RAM").is_some_and(|w| w.contains("batch size")));
    let short = padded_to_data(&config, Some(91));
    assert_eq!(memory_warning(&m, &short, budget, "RAM"), None, "a batch that fits is not shrunk");
    assert_eq!(memory_fix(&m, &short, budget, "RAM"), None);
    assert_eq!(padded_to_data(&config, Some(5000)).seq_len, 2048, "rows are cut at seq_len");
    assert_eq!(padded_to_data(&config, None).seq_len, 2048);
    assert!(padding_assumption(&config, Some(91)).contains("longest row, 91 tokens"));
    assert!(padding_assumption(&config, None).contains("full sequence length 2048"));
    let packed = TrainConfig { packing: true, ..config.clone() };
    assert!(padding_assumption(&packed, Some(2000)).contains("fullest packed row, 2000 tokens"));
}

/// With packing the rows a run pads to are packs: the dataset report's lengths packed as the trainer packs them.
#[test]
fn packed_rows_are_what_the_estimate_and_the_epoch_count_read() {
    let stats =
        crate::engine::data::TokenStats { lengths: vec![91, 40, 300, 30, 60], max_seq_len: 256, ..Default::default() };
    assert_eq!(stats.training_rows(256, false), vec![91, 40, 256, 30, 60], "cut at the sequence length");
    assert_eq!(stats.training_rows(256, false).into_iter().max(), Some(256));
    let packed = stats.training_rows(128, true);
    assert_eq!(packed.iter().sum::<usize>(), 91 + 40 + 128 + 30 + 60, "every token once");
    assert_eq!(packed.len(), 3, "{packed:?}");
    assert_eq!(packed.into_iter().max(), Some(128));
}

/// The plan reads the run's own dataset: the sample chat rows are far shorter than seq_len 1024, so the
/// estimate note names their longest row and `auto` checkpointing is decided on it.
#[test]
fn a_run_plan_uses_the_dataset_rows_it_will_train_on() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = crate::engine::model::load_model(
        &root.join("tests/fixtures/tiny-llama"),
        &candle_core::Device::Cpu,
        candle_core::DType::F32,
    )
    .unwrap();
    let mut config = TrainConfig { data: root.join("assets/sample-chat"), seq_len: 256, ..Default::default() };
    let longest = longest_train_row(&config, &model).unwrap().unwrap();
    assert!(longest > 10 && longest < 256, "{longest}");
    let plan = plan_run_memory(&mut config, &model);
    assert!(plan.notes.iter().any(|n| n.contains(&format!("longest row, {longest} tokens"))), "{:?}", plan.notes);
    assert_ne!(config.checkpointing, crate::engine::train::config::Checkpointing::Auto, "auto is decided");
}

#[test]
fn grpo_counts_completions_and_generation_caches() {
    let model = smollm_like();
    let sft = TrainConfig { batch_size: 2, seq_len: 64, ..TrainConfig::default() };
    let mut grpo = TrainConfig { method: crate::engine::train::Method::Grpo, ..sft.clone() };
    grpo.grpo.num_generations = 4;
    grpo.grpo.max_new_tokens = 64;
    let (a, b) = (training_memory(&model, &sft), training_memory(&model, &grpo));
    // Four completions per prompt, each a prompt and a completion: 8x the tokens.
    assert!(b.activations_bytes >= 7 * a.activations_bytes, "{a:?} {b:?}");
    assert!(b.generation_bytes > 0 && a.generation_bytes == 0);
}

/// An offloading run parks each trained layer's input and attention result in host memory while both fit the
/// pinning budget, else the inputs only; the note says which before the run; where the device does not offload there
/// is nothing to say.
#[test]
fn the_offload_note_says_what_host_memory_holds() {
    let cfg = TrainConfig {
        batch_size: 1,
        seq_len: 262_144,
        checkpointing: Checkpointing::Offload,
        ..TrainConfig::default()
    };
    let offloading = ModelShape { offloads_checkpoints: true, ..llama_1b_bf16(true) };
    let parked = OffloadedLayers::of(&offloading, &cfg);
    assert_eq!(parked.layers, 16);
    assert_eq!(parked.input_bytes, 262_144 * 2048 * 2);
    assert_eq!(parked.attention_bytes, 262_144 * (32 * 64 * 2 + 32 * 4));
    // 16 GiB of inputs, 32.5 GiB with the attention results.
    assert!(!parked.parks_attention(Some(20 << 30)));
    assert!(parked.parks_attention(Some(40 << 30)));
    assert!(parked.parks_attention(None), "an unknown budget keeps the pass's default");
    assert!(offload_host_note(&offloading, &cfg).is_some_and(|n| n.starts_with("offload: ")));
    assert_eq!(offload_host_note(&llama_1b_bf16(true), &cfg), None, "this device does not offload");
    let on = TrainConfig { checkpointing: Checkpointing::On, ..cfg };
    assert_eq!(offload_host_note(&offloading, &on), None);
}

/// A quantized head whose loss runs the CUDA kernel holds a dense copy during the head phase: one block of its rows
/// (2^24 elements: 8,192 rows at 2,048 wide) up to one chunk of 1,024 rows, the whole vocabulary past it.
#[test]
fn a_head_dequantized_for_the_loss_is_counted() {
    let composed = llama_1b_bf16(true);
    let kernel = ModelShape { dequantizes_head: true, ..llama_1b_bf16(true) };
    for (batch_size, seq_len, rows) in [(1, 1024, 8192), (4, 1024, 128_256), (1, 8192, 128_256)] {
        let cfg = TrainConfig { batch_size, seq_len, ..TrainConfig::default() };
        let (a, b) = (training_memory(&composed, &cfg), training_memory(&kernel, &cfg));
        assert_eq!(b.logits_bytes - a.logits_bytes, rows * 2048 * 2, "{batch_size} x {seq_len}");
    }
}
