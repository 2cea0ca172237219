//! `--kernels wgsl`: the portable graph with our WGSL kernels (RMS norm, rotary, SwiGLU, attention, forward and
//! backward, the head's cross-entropy, the LoRA update and adapter dropout in training, and the LoRA epilogue at
//! inference) where they apply, which a Mac runs through Metal. Here the same dispatchers send CPU tensors to the
//! same kernels and launches through wgpu on Vulkan (Mesa's lavapipe in CI; `ops::metal::run`'s other route), so the
//! wiring (which op takes which kernel, with which shapes, and what comes back) is run end to end: a training step
//! records every kernel's launches (and the attention's with a sliding window and with packed rows), and 20 training
//! steps of every family, and packed runs of tiny-llama and tiny-gemma3, lose what the portable graph loses, f32 to
//! 1e-5 of the loss and f16 and bf16 to the portable run's own distance from f32. Needs the `wgpu-kernels` feature (the
//! README's test command).

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use metal_candle::engine::bench::random_batch;
use metal_candle::engine::data::Batch;
use metal_candle::engine::lora;
use metal_candle::engine::model::load_model;
use metal_candle::engine::ops::{self, metal};
use metal_candle::engine::runtime::{self, Kernels, RuntimeOptions};
use metal_candle::engine::train::{backprop, LoraSettings};

/// Fix this process's kernels to the WGSL set and hold the tests' turn (the launch counts are the process's, so
/// the tests run one at a time); None (the test skips, saying why) without a Vulkan adapter, which CI
/// (METAL_CANDLE_REQUIRE_VULKAN=1) turns into a failure.
fn wgsl(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    runtime::init(RuntimeOptions { kernels: Kernels::Wgsl, ..RuntimeOptions::default() }).unwrap();
    assert_eq!(ops::kernels(), Kernels::Wgsl);
    match metal::vulkan::gpu() {
        Ok(_) => Some(turn),
        Err(why) if std::env::var("METAL_CANDLE_REQUIRE_VULKAN").is_ok_and(|v| v == "1") => {
            panic!("{test}: METAL_CANDLE_REQUIRE_VULKAN=1 but {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

/// How many times this process has launched the WGSL entry point `entry`.
fn launched(entry: &str) -> usize {
    metal::launch_counts().get(entry).copied().unwrap_or(0)
}

/// `got` within `1e-5` of `want`'s largest magnitude, element by element (f32 runs of the same math).
fn assert_within_1e5(what: &str, got: &Tensor, want: &Tensor) {
    let diff: f32 = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    let size: f32 = want.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    assert!(diff <= 1e-5 * size, "{what} {diff} off ({size})");
}

/// Packed rows for a (2, 32) batch: examples of 1, 10 and 21 tokens in the first row, 20 and 12 in the second, the
/// first token of each predicting nothing.
fn pack(batch: &mut Batch) {
    let mut starts = Vec::new();
    for lengths in [[1, 10, 21].as_slice(), &[20, 12]] {
        let row = starts.len();
        for len in lengths {
            starts.extend(std::iter::repeat_n((starts.len() - row) as u32, *len));
        }
    }
    for (i, &start) in starts.iter().enumerate() {
        batch.target_mask[i] = if start as usize == i % batch.seq_len { 0.0 } else { 1.0 };
    }
    batch.target_tokens = batch.target_mask.iter().filter(|m| **m > 0.0).count();
    batch.row_starts = Some(starts);
}

/// A training step of tiny-llama records every wired kernel's launches, in f32 and in bf16 (u32 words of two
/// elements in the kernels); with tiny-gemma3 (whose first layer attends through a sliding window) and with packed
/// rows, each layer's attention and rotary still go through the WGSL kernels each way.
#[test]
fn a_training_step_runs_each_wired_kernel() {
    let Some(_turn) = wgsl("a_training_step_runs_each_wired_kernel") else { return };
    let cases = [
        ("tiny-llama", false, DType::F32),
        ("tiny-llama", true, DType::F32),
        ("tiny-gemma3", false, DType::F32),
        ("tiny-gemma3", true, DType::F32),
        ("tiny-llama", false, DType::BF16),
    ];
    for (arch, packed, dtype) in cases {
        let mut m = load_model(&fixture(arch), &Device::Cpu, dtype).unwrap();
        let settings =
            LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() };
        let params = lora::attach_new_adapters(&mut m.model, &settings, 3).unwrap();
        for p in &params {
            p.b.set(&Tensor::randn(0f32, 0.2, p.b.shape(), &Device::Cpu).unwrap()).unwrap();
        }
        let before = metal::launch_counts();
        let mut batch = random_batch(m.config.vocab_size, 2, 32, 4);
        if packed {
            pack(&mut batch);
        }
        let out = backprop::loss_and_gradients_with(&m.model, &batch, 1.0 / batch.target_tokens as f64, false, false);
        assert!(out.unwrap().nll_sum.value().unwrap().is_finite());
        let after = metal::launch_counts();
        let ran = |entry: &str| after.get(entry).copied().unwrap_or(0) - before.get(entry).copied().unwrap_or(0);
        let what = format!("{arch} (packed: {packed}, {dtype:?})");
        // Two layers: the attention each way per layer, the sliding layer's and packed rows' too; q and k turned
        // and turned back, packed rows' by their batch's own table of positions.
        let mut expected = vec![("attention_fwd", 2), ("attention_bwd_dq", 2), ("attention_bwd_dkdv", 2), ("rope", 8)];
        if (arch, packed) == ("tiny-llama", false) {
            // Two norms each and the final one forward; backward the same but the first layer's input norm
            // (nothing below it trains); q and k turned and turned back; one SwiGLU each way per layer; the loss;
            // the LoRA update of each of the 14 adapted projections forward (and their input gradients back).
            expected.extend([
                ("lowrank_add", 14),
                ("rms_norm_fwd", 5),
                ("rms_norm_bwd_dx", 4),
                ("swiglu_fwd", 2),
                ("swiglu_bwd", 2),
                ("cross_entropy_fwd_bwd", 1),
            ]);
        }
        for (entry, at_least) in expected {
            assert!(ran(entry) >= at_least, "{what}: {entry} ran {} times in a step ({after:?})", ran(entry));
        }
    }
}

/// Each step's f32 loss of a `--kernels wgsl` run within 1e-5 (relative, at least absolute) of the portable run's.
fn assert_same_losses(what: &str, portable: &[f64], ours: &[f64]) {
    for (step, (a, b)) in portable.iter().zip(ours).enumerate() {
        // The loss is a mean in f32 (an ulp at 7 is 5e-7): the kernels' sums in another order move it by a few.
        assert!((a - b).abs() < 1e-5 * a.abs().max(1.0), "{what} step {}: portable {a} vs wgsl {b}", step + 1);
    }
}

#[test]
fn wgsl_training_matches_the_portable_graph_in_every_family() {
    let Some(_turn) = wgsl("wgsl_training_matches_the_portable_graph_in_every_family") else { return };
    for arch in FAMILIES {
        let (portable, ours) = (
            common::cli::family_run_losses("portable", arch, "f32"),
            common::cli::family_run_losses("wgsl", arch, "f32"),
        );
        assert_same_losses(arch, &portable, &ours);
    }
    // Packed rows (gemma3's sliding layer: a window and example starts at once), same tolerance.
    for arch in ["tiny-llama", "tiny-gemma3"] {
        let losses = |kernels| {
            let extra = ["--dropout", "0.1", "--packing", "--seq-len", "256"];
            common::cli::step_losses(kernels, arch, "f32", "assets/sample-chat", 20, &extra)
        };
        assert_same_losses(&format!("{arch} packed"), &losses("portable"), &losses("wgsl"));
    }
    // f16 and bf16: the kernels store once in the half type where the composed ops round after each op; over the
    // run the WGSL losses stay as close to the f32 run as the portable ones do (within twice their largest
    // distance, plus 1e-3).
    let arch = "tiny-llama";
    let f32_run = common::cli::family_run_losses("portable", arch, "f32");
    for dtype in ["f16", "bf16"] {
        let (portable, ours) = (
            common::cli::family_run_losses("portable", arch, dtype),
            common::cli::family_run_losses("wgsl", arch, dtype),
        );
        let farthest = |run: &[f64]| run.iter().zip(&f32_run).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        let (theirs, mine) = (farthest(&portable), farthest(&ours));
        eprintln!("{dtype} against f32, largest loss distance: portable {theirs:.2e}, wgsl {mine:.2e}");
        assert!(mine <= 2.0 * theirs + 1e-3, "{dtype}: wgsl {mine} from the f32 run, portable {theirs} ({ours:?})");
    }
}

/// At inference an adapter's update goes through the WGSL LoRA epilogue (one launch: `y + scale (x A) B`), and gives
/// the frozen product plus the update computed with Candle's own products.
#[test]
fn an_adapter_at_inference_takes_the_lora_epilogue() {
    let Some(_turn) = wgsl("an_adapter_at_inference_takes_the_lora_epilogue") else { return };
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let settings = LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() };
    for p in lora::attach_new_adapters(&mut m.model, &settings, 3).unwrap() {
        p.b.set(&Tensor::randn(0f32, 0.2, p.b.shape(), &Device::Cpu).unwrap()).unwrap();
    }
    let down = &m.model.layers[0].mlp.down_proj;
    let x = Tensor::randn(0f32, 1.0, (2, 5, down.in_features()), &Device::Cpu).unwrap();
    let before = launched("lora_epilogue");
    let y = down.forward(&x).unwrap();
    assert!(launched("lora_epilogue") > before, "no lora_epilogue launch");
    let adapter = down.active_adapter().unwrap();
    let (a, b) = adapter.matrices(DType::F32).unwrap();
    let rows = x.reshape((10, down.in_features())).unwrap();
    let w = down.weight.to_dense(DType::F32).unwrap();
    let update = (rows.matmul(&a).unwrap().matmul(&b).unwrap() * adapter.scale).unwrap();
    let expected = (rows.matmul(&w.t().unwrap()).unwrap() + update).unwrap().reshape(y.shape()).unwrap();
    assert_within_1e5("epilogue", &y, &expected);
}

/// A prefill after a cache (a chat's second turn: queries from the cache's length on) goes through the WGSL
/// attention too, and gives the logits of one forward over the whole sequence (f32, to 1e-5 of their size).
#[test]
fn a_prefill_after_a_cache_takes_the_wgsl_attention() {
    let Some(_turn) = wgsl("a_prefill_after_a_cache_takes_the_wgsl_attention") else { return };
    let m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let ids: Vec<u32> = (0..90u32).map(|i| (i * 37 + 11) % 200).collect();
    let row = |range: std::ops::Range<usize>| Tensor::new(&ids[range], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let mut cache = metal_candle::engine::generate::KvCache::new(m.model.config.num_layers);
    m.model.forward(&row(0..70), 0, Some(&mut cache)).unwrap();
    let before = launched("attention_fwd");
    let second = m.model.forward(&row(70..90), 70, Some(&mut cache)).unwrap();
    let layers = m.model.config.num_layers;
    assert_eq!(
        launched("attention_fwd") - before,
        layers,
        "one attention launch a layer for the prefill after the cache"
    );
    let whole = m.model.forward(&row(0..90), 0, None).unwrap().narrow(1, 70, 20).unwrap();
    assert_within_1e5("cached prefill against the whole forward:", &second, &whole);
}

/// Adapter dropout under wgsl multiplies by a mask the kernel draws from the seed (none drawn on the host and
/// copied over): bit for bit the product with the mask the CPU draws, for whole masks and blocks of rows, f32, f16
/// and bf16, and past the 65,535 workgroups of one grid dimension (4,097 x 4,097 elements). bf16 rows of odd width
/// stay on the portable graph (its kernels write two elements at a time), with the same bits.
#[test]
fn dropout_draws_the_cpu_mask_in_the_kernel() {
    let Some(_turn) = wgsl("dropout_draws_the_cpu_mask_in_the_kernel") else { return };
    // (seed, p, rows skipped by `rows_from`, rows, columns)
    let cases = [(7, 0.1, 0, 3, 1000), (11, 0.3, 5, 40, 37), (u64::MAX, 0.5, 2, 1, 1), (3, 0.05, 1, 4097, 4097)];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (seed, p, skipped, rows, cols) in cases {
            let dropout = ops::Dropout::new(seed, p).rows_from(skipped, cols);
            let x = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let what = format!("seed {seed}, p {p}, {rows} x {cols} after {skipped} rows, {dtype:?}");
            let before = launched("dropout_apply");
            let got = dropout.apply(&x).unwrap();
            let kernel = metal::row_fits(dtype, cols);
            assert_eq!(launched("dropout_apply"), before + usize::from(kernel), "{what}: kernel {kernel}");
            let want = (&x * dropout.mask(x.shape(), dtype, &Device::Cpu).unwrap()).unwrap();
            let (differing, all) = differing_bits(&got, &want);
            assert_eq!(differing, 0, "{what}: {differing} of {all} elements differ");
        }
    }
}
