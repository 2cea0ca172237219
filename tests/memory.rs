//! Memory features end to end on the tiny fixtures: gradient checkpointing gives the losses and adapter
//! gradients of the uncheckpointed pass (dropout on, several steps, accumulation), `auto` must be decided by
//! the memory estimate before a run, the chunked head scores every position as a whole log-softmax would,
//! and the settings file and run.json carry the setting.

mod common;

use candle_core::{DType, Device, Tensor, D};
use common::*;
use metal_candle::engine::bench::random_batch;
use metal_candle::engine::estimate::{self, ModelShape};
use metal_candle::engine::generate::score;
use metal_candle::engine::lora;
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::{
    self, backprop, Checkpointing, LoraSettings, StepRunner, TrainConfig, TrainControl, TrainEvent,
};
use std::path::Path;

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

fn dropout_lora() -> LoraSettings {
    all_linear_lora(0.2)
}

#[test]
fn checkpointing_gives_the_same_loss_and_adapter_gradients_with_dropout() {
    for arch in ["tiny-llama", "tiny-qwen3"] {
        let mut m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        let params = lora::attach_new_adapters(&mut m.model, &dropout_lora(), 3).unwrap();
        for p in &params {
            p.b.set(&Tensor::randn(0f32, 0.2, p.b.shape(), &Device::Cpu).unwrap()).unwrap();
        }
        let batch = random_batch(m.config.vocab_size, 3, 24, 8);
        let scale = 1.0 / batch.target_tokens as f64;
        lora::seed_dropout(&m.model, 5, 2);
        let plain = backprop::loss_and_gradients_with(&m.model, &batch, scale, true, false).unwrap();
        let after_plain = lora::dropout_counter(&m.model);
        lora::seed_dropout(&m.model, 5, 2);
        let ckpt = backprop::loss_and_gradients_with(&m.model, &batch, scale, true, true).unwrap();
        // The next micro-batch draws its masks where it would have without checkpointing.
        assert_eq!(lora::dropout_counter(&m.model), after_plain, "{arch}");
        let (plain_nll, ckpt_nll) = (plain.nll_sum.value().unwrap(), ckpt.nll_sum.value().unwrap());
        assert!((plain_nll - ckpt_nll).abs() <= 1e-6 * plain_nll.abs(), "{arch}");
        // Dropout really is on: a pass with other masks gives another loss.
        lora::seed_dropout(&m.model, 6, 2);
        let other = backprop::loss_and_gradients_with(&m.model, &batch, scale, true, true).unwrap();
        assert!((other.nll_sum.value().unwrap() - plain_nll).abs() > 1e-4, "{arch}: dropout changed nothing");
        for p in &params {
            for var in [&p.a, &p.b] {
                let a = plain.grads.get(var.as_tensor()).unwrap();
                let b = ckpt.grads.get(var.as_tensor()).unwrap();
                let size: f32 = a.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                assert!(size > 0.0, "{arch} layer {} {}: zero gradient", p.layer, p.module);
                assert!(max_diff(a, b) <= 1e-6 * size, "{arch} layer {} {}: {}", p.layer, p.module, max_diff(a, b));
            }
        }
    }
}

/// Five optimizer steps of two micro-batches each, with and without checkpointing, from the same start.
#[test]
fn checkpointed_steps_track_uncheckpointed_steps() {
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let runner = |checkpointing: bool| {
        let mut model = base.model.clone();
        let params = lora::attach_new_adapters(&mut model, &dropout_lora(), 9).unwrap();
        let mut r = StepRunner::new(model, &params, 0.01, Some(1.0), 9).unwrap();
        r.set_checkpointing(if checkpointing { Checkpointing::On } else { Checkpointing::Off }).unwrap();
        (r, params)
    };
    let ((mut plain, plain_params), (mut ckpt, ckpt_params)) = (runner(false), runner(true));
    let vocab = base.config.vocab_size;
    for step in 0..5u64 {
        let batches = [random_batch(vocab, 2, 20, 100 + step), random_batch(vocab, 2, 20, 200 + step)];
        let (a, na) = plain.step(&batches, 1e-2).unwrap();
        let (b, nb) = ckpt.step(&batches, 1e-2).unwrap();
        assert!((a - b).abs() <= 1e-6 * a.abs(), "step {step}: loss {a} vs {b}");
        assert!((na - nb).abs() <= 1e-5 * na.abs(), "step {step}: gradient norm {na} vs {nb}");
    }
    for (p, q) in plain_params.iter().zip(&ckpt_params) {
        assert!(max_diff(p.a.as_tensor(), q.a.as_tensor()) < 1e-6);
        assert!(max_diff(p.b.as_tensor(), q.b.as_tensor()) < 1e-6);
    }
}

fn tiny_config(out: &Path, name: &str, checkpointing: Checkpointing) -> TrainConfig {
    TrainConfig {
        model: fixture("tiny-llama"),
        data: Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat"),
        out: out.to_path_buf(),
        run_name: Some(name.into()),
        lora: dropout_lora(),
        iters: Some(4),
        epochs: None,
        batch_size: 2,
        seq_len: 64,
        lr: 5e-3,
        warmup: Some(1),
        val_every: 0,
        save_every: 0,
        checkpointing,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    }
}

fn step_losses(events: &[TrainEvent]) -> Vec<f64> {
    events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Step { loss, .. } => Some(*loss),
            _ => None,
        })
        .collect()
}

#[test]
fn a_checkpointed_run_records_the_setting_and_auto_is_decided_by_the_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let mut losses = Vec::new();
    for (name, c) in [("off", Checkpointing::Off), ("on", Checkpointing::On)] {
        let mut events = Vec::new();
        let cfg = tiny_config(dir.path(), name, c);
        let run_dir = train::run_training(&cfg, &base, &TrainControl::default(), &mut |e| events.push(e)).unwrap();
        let run_json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run_dir.join("run.json")).unwrap()).unwrap();
        assert_eq!(run_json["config"]["checkpointing"], name, "{run_json}");
        losses.push(step_losses(&events));
    }
    assert_eq!(losses[0].len(), 4);
    for (a, b) in losses[0].iter().zip(&losses[1]) {
        assert!((a - b).abs() <= 1e-6 * a.abs(), "{:?} vs {:?}", losses[0], losses[1]);
    }
    // `auto` reaching the trainer undecided is refused, naming the setting.
    let auto = tiny_config(dir.path(), "auto", Checkpointing::Auto);
    let err = train::run_training(&auto, &base, &TrainControl::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("checkpointing `auto`"), "{err}");
    // The estimate decides it: on when the run does not fit the budget without it, off when it does.
    let shape = ModelShape::of_model(&base.model);
    let need = estimate::training_memory_with(&shape, &auto, false).total_bytes();
    for (budget, expected) in [(need, Checkpointing::Off), (need - 1, Checkpointing::On)] {
        let mut cfg = auto.clone();
        let note = estimate::resolve_checkpointing(&shape, &mut cfg, Some(budget), "RAM").unwrap();
        assert_eq!(cfg.checkpointing, expected, "{note}");
    }
}

/// A checkpointed layer's recompute defers its MLP to the backward, which runs it over blocks of rows (at long
/// context a few thousand at a time): with dropout on and blocks that cut the rows unevenly, the same input gradient
/// and adapter gradients as the MLP forward and backward over all rows at once.
#[test]
fn the_deferred_mlp_backward_over_blocks_of_rows_equals_the_whole_one() {
    for arch in ["tiny-llama", "tiny-gemma3", "tiny-phi3"] {
        let mut m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        let params = random_adapters(&mut m.model, &dropout_lora(), 4);
        let mlp = &m.model.layers[1].mlp;
        let hidden = m.config.hidden_size;
        let rows = 23;
        let x = Tensor::randn(0f32, 1.0, (rows, hidden), &Device::Cpu).unwrap();
        let d_out = Tensor::randn(0f32, 1.0, (rows, hidden), &Device::Cpu).unwrap();
        let ctx = m.model.sequence_context(1, rows, true, None).unwrap();
        let run = |deferred: bool, block_rows: usize| {
            lora::seed_dropout(&m.model, 3, 1);
            let mut grads = metal_candle::engine::model::Gradients::default();
            let tape = if deferred { mlp.defer(&x, &ctx) } else { mlp.forward_train(&x, &ctx).unwrap().1 };
            let d_in = mlp.backward_in_blocks(&tape, &d_out, &mut grads, block_rows).unwrap();
            (d_in, grads)
        };
        let (whole_d_in, whole) = run(false, rows);
        for block_rows in [5, 1, rows] {
            let (d_in, blocks) = run(true, block_rows);
            let size: f32 = whole_d_in.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
            assert!(max_diff(&d_in, &whole_d_in) <= 1e-5 * size, "{arch} blocks of {block_rows}: input gradient");
            for p in params
                .iter()
                .filter(|p| p.layer == 1 && ["gate_proj", "up_proj", "down_proj", "gate_up_proj"].contains(&p.module))
            {
                for var in [&p.a, &p.b] {
                    let (a, b) = (whole.get(var.as_tensor()).unwrap(), blocks.get(var.as_tensor()).unwrap());
                    let size: f32 = a.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                    assert!(size > 0.0, "{arch} {}: zero gradient", p.module);
                    assert!(
                        max_diff(a, b) <= 1e-5 * size,
                        "{arch} blocks of {block_rows} {}: {}",
                        p.module,
                        max_diff(a, b)
                    );
                }
            }
        }
        // Dropout really is on: other masks give another input gradient.
        lora::seed_dropout(&m.model, 4, 1);
        let mut grads = metal_candle::engine::model::Gradients::default();
        let other = mlp.backward(&mlp.defer(&x, &ctx), &d_out, &mut grads).unwrap();
        assert!(max_diff(&other, &whole_d_in) > 1e-4, "{arch}: dropout changed nothing");
    }
}

/// The MLP's training tape keeps gate and up, not their product (down_proj's input, made again in the backward):
/// two (rows x intermediate) tensors where three were kept, as the memory estimate counts them; and the layer's
/// tape keeps no normed block input.
#[test]
fn training_tapes_keep_no_input_the_backward_can_make_again() {
    for arch in ["tiny-llama", "tiny-phi3"] {
        let mut m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        random_adapters(&mut m.model, &all_linear_lora(0.0), 4);
        let mlp = &m.model.layers[0].mlp;
        let rows = 7;
        let x = Tensor::randn(0f32, 1.0, (rows, m.config.hidden_size), &Device::Cpu).unwrap();
        let ctx = m.model.sequence_context(1, rows, true, None).unwrap();
        let (_, tape) = mlp.forward_train(&x, &ctx).unwrap();
        assert_eq!(tape.intermediate_bytes(), 2 * rows * m.config.intermediate_size * 4, "{arch}");
        assert_eq!(mlp.defer(&x, &ctx).intermediate_bytes(), 0, "{arch}: a deferred tape keeps none");
        // The layer's tape lets the normed inputs of q|k|v and gate|up go (the backward makes them again from the
        // residuals it keeps); a checkpointed recompute's tape, read at once, keeps them.
        let layer = &m.model.layers[0];
        assert!(layer.forward_train(&x, None, &ctx).unwrap().2.remakes_normed_inputs(), "{arch}");
        assert!(!layer.recompute(&x, None, &ctx).unwrap().remakes_normed_inputs(), "{arch}");
    }
}

#[test]
fn the_settings_file_takes_checkpointing_and_refuses_a_bad_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(&path, "checkpointing = \"auto\"\n").unwrap();
    assert_eq!(TrainConfig::from_toml_file(&path).unwrap().checkpointing, Checkpointing::Auto);
    std::fs::write(&path, "checkpointing = \"sometimes\"\n").unwrap();
    let err = TrainConfig::from_toml_file(&path).unwrap_err().to_string();
    assert!(err.contains("run.toml") && err.contains("sometimes"), "{err}");
    assert_eq!("on".parse::<Checkpointing>().unwrap(), Checkpointing::On);
    assert_eq!("offload".parse::<Checkpointing>().unwrap(), Checkpointing::Offload);
    std::fs::write(&path, "checkpointing = \"offload\"\n").unwrap();
    assert_eq!(TrainConfig::from_toml_file(&path).unwrap().checkpointing, Checkpointing::Offload);
    assert!("yes".parse::<Checkpointing>().unwrap_err().contains("on, off, offload or auto"));
}

/// Scoring runs the head over chunks of 128 positions: 200 positions make two chunks, and every
/// log-probability equals a log-softmax over the whole logits tensor.
#[test]
fn chunked_scoring_matches_a_whole_log_softmax() {
    for arch in ["tiny-llama", "tiny-qwen2"] {
        let m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
        let ids: Vec<u32> = (0..200u32).map(|i| (i * 37 + 11) % m.config.vocab_size as u32).collect();
        let ours = score(&m.model, &ids).unwrap();
        let input = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let logits = m.model.forward(&input, 0, None).unwrap().squeeze(0).unwrap();
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        let targets = Tensor::new(&ids[1..], &Device::Cpu).unwrap().unsqueeze(1).unwrap();
        let whole: Vec<f32> = log_probs
            .narrow(0, 0, ids.len() - 1)
            .unwrap()
            .gather(&targets, 1)
            .unwrap()
            .squeeze(1)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(ours.len(), whole.len());
        let worst = ours.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{arch}: {worst}");
    }
}
