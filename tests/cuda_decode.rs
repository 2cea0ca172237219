//! The fused CUDA decode kernels against the CPU: step-by-step logits of a KV-cache decode on every tiny
//! architecture, and with a quantized base, an active adapter and q/k norms; the residual add + RMS norm kernel and
//! the plain norm on it (built with `--features cuda`; skipped without a GPU). Run on a lent GPU machine.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::cuda_or_skip;
use metal_candle::engine::generate::KvCache;
use metal_candle::engine::lora;
use metal_candle::engine::model::{load_model, load_model_with, BaseQuant, LoadOptions};
use metal_candle::engine::ops;
use metal_candle::engine::sampler::argmax;
use metal_candle::engine::train::LoraSettings;

fn logits_per_step(model_dir: &str, device: &Device, dtype: DType, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let loaded = load_model(std::path::Path::new(model_dir), device, dtype).unwrap();
    decode_logits(&loaded.model, prompt, steps)
}

/// Logits after the prompt and after each of `steps` single-token decode steps through the KV cache.
fn decode_logits(
    model: &metal_candle::engine::model::transformer::Transformer,
    prompt: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let device = model.device();
    let mut cache = KvCache::new(model.config.num_layers);
    let mut out = Vec::new();
    let mut ids = prompt.to_vec();
    let mut pos = 0;
    for step in 0..=steps {
        let input = if step == 0 { ids.clone() } else { vec![*ids.last().unwrap()] };
        let t = input.len();
        let input = Tensor::from_vec(input, (1, t), device).unwrap();
        let hidden = model.forward_hidden(&input, pos, Some(&mut cache)).unwrap();
        pos += t;
        let last = hidden.narrow(1, t - 1, 1).unwrap().squeeze(1).unwrap();
        let logits: Vec<f32> =
            model.logits(&last).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        // Follow the CPU-independent argmax so both runs see the same tokens: a fixed pseudo-random walk.
        ids.push(((step * 7919 + 13) % model.config.vocab_size) as u32);
        out.push(logits);
    }
    out
}

/// The prompt both tests decode after.
const PROMPT: [u32; 5] = [281, 358, 289, 422, 348];
/// A prompt of over 8 tokens: on CUDA its prefill with a quantized base dequantizes the weights (fewer rows go
/// through Candle's kernel, which rounds them to 8 bits).
const LONG_PROMPT: [u32; 12] = [281, 358, 289, 422, 348, 300, 311, 402, 290, 377, 351, 333];

#[test]
fn fused_decode_logits_match_the_cpu_on_every_architecture() {
    let Some(cuda) = cuda_or_skip() else { return };
    let prompt = PROMPT;
    for arch in ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"] {
        let dir = format!("tests/fixtures/{arch}");
        let want = logits_per_step(&dir, &Device::Cpu, DType::F32, &prompt, 80);
        let got = logits_per_step(&dir, &cuda, DType::F32, &prompt, 80);
        let diffs = max_diffs(arch, &want, &got);
        assert!(diffs.iter().all(|d| *d < 1e-3), "{arch}: CUDA decode differs from the CPU");
    }
}

/// Per step, the largest |logit difference| (printed).
fn max_diffs(label: &str, want: &[Vec<f32>], got: &[Vec<f32>]) -> Vec<f32> {
    let diffs: Vec<f32> =
        want.iter().zip(got).map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)).collect();
    eprintln!(
        "{label}: max |logit diff| per step: {:?}",
        &diffs.iter().map(|d| format!("{d:.1e}")).collect::<Vec<_>>()
    );
    diffs
}

/// `arch` loaded on `device` with its base held as `quantize`, and rank-4 adapters on every linear whose B
/// is a fixed non-zero pattern (the same on every device), so the adapters change the logits.
fn adapted_model(arch: &str, device: &Device, quantize: BaseQuant) -> metal_candle::engine::model::LoadedModel {
    let path = format!("tests/fixtures/{arch}");
    let mut m = load_model_with(std::path::Path::new(&path), device, DType::F32, &LoadOptions { quantize }).unwrap();
    let settings = LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() };
    for p in lora::attach_new_adapters(&mut m.model, &settings, 5).unwrap() {
        let n = p.b.elem_count();
        let pattern: Vec<f32> = (0..n).map(|i| 0.2 * ((i * 37 % 101) as f32 / 101.0 - 0.5)).collect();
        p.b.set(&Tensor::from_vec(pattern, p.b.shape(), device).unwrap()).unwrap();
    }
    m
}

/// The fused decode also runs with an active adapter, on q/k-norm families (qwen3) and with a quantized base
/// (Q8_0): CUDA against the CPU, within 1e-3 like the plain decode. With a quantized base the reference is the
/// CPU's forward over the whole sequence at once: a product of that many rows dequantizes each weight and
/// multiplies densely, while the CPU's single-row kernel would round the activations to 8 bits (as llama.cpp
/// does) and CUDA's (`ops/cuda/qgemv.rs`) keeps them, which moved these logits by up to 0.24. The prompt is then
/// longer than 8 tokens, so CUDA's prefill dequantizes too. The adapters must move the logits (measured >= 0.9
/// here), so a dropped adapter cannot pass.
#[test]
fn fused_decode_with_adapters_qk_norms_and_a_quantized_base_matches_the_cpu() {
    let Some(cuda) = cuda_or_skip() else { return };
    for (arch, quantize) in [
        ("tiny-llama", BaseQuant::None),
        ("tiny-qwen3", BaseQuant::None),
        ("tiny-llama", BaseQuant::Q8_0),
        ("tiny-qwen3", BaseQuant::Q8_0),
    ] {
        let quantized = quantize != BaseQuant::None;
        let prompt: Vec<u32> = if quantized { LONG_PROMPT.to_vec() } else { PROMPT.to_vec() };
        let cpu = adapted_model(arch, &Device::Cpu, quantize);
        let gpu = adapted_model(arch, &cuda, quantize);
        let plain = load_model_with(
            std::path::Path::new(&format!("tests/fixtures/{arch}")),
            &Device::Cpu,
            DType::F32,
            &LoadOptions { quantize },
        )
        .unwrap();
        let steps = 40;
        let want = if quantized {
            whole_sequence_logits(&cpu.model, &prompt, steps)
        } else {
            decode_logits(&cpu.model, &prompt, steps)
        };
        let got = decode_logits(&gpu.model, &prompt, steps);
        let label = format!("{arch} {quantize} + adapters");
        let diffs = max_diffs(&label, &want, &got);
        let without =
            max_diffs(&format!("{label} (CPU without adapters)"), &want, &decode_logits(&plain.model, &prompt, steps));
        for (d, adapter_effect) in diffs.iter().zip(&without) {
            assert!(*d < 1e-3, "{label}: CUDA decode differs from the CPU by {d}");
            assert!(*adapter_effect > 0.1, "{label}: the adapters move the logits by only {adapter_effect}");
        }
    }
}

/// What [`decode_logits`] returns (the logits after the prompt and after each step's token), from one forward
/// over the prompt and the tokens [`decode_logits`] feeds.
fn whole_sequence_logits(
    model: &metal_candle::engine::model::transformer::Transformer,
    prompt: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut ids = prompt.to_vec();
    ids.extend((0..steps).map(|step| ((step * 7919 + 13) % model.config.vocab_size) as u32));
    let input = Tensor::from_vec(ids.clone(), (1, ids.len()), model.device()).unwrap();
    let logits = model.forward(&input, 0, None).unwrap().to_dtype(DType::F32).unwrap().squeeze(0).unwrap();
    let rows: Vec<Vec<f32>> = logits.to_vec2().unwrap();
    rows[prompt.len() - 1..].to_vec()
}

/// The decode attention kernel alone against a CPU computation, over caches longer than one of its chunks
/// (1,024 keys), with grouped-query heads, a sliding window and two sequences: f32 and bf16; the position given
/// as a number and read from a device tensor (as a replayed CUDA graph gives it, the host's number then wrong).
#[test]
fn decode_attention_over_long_caches_matches_the_cpu() {
    use metal_candle::engine::ops::cuda::decode::{attention, DecodeShape};
    let Some(device) = cuda_or_skip() else { return };
    let (b, heads, kv, d, cap) = (2usize, 8usize, 2usize, 64usize, 3000usize);
    let cpu = Device::Cpu;
    let qkv = Tensor::randn(0f32, 1.0, (b, 1, (heads + 2 * kv) * d), &cpu).unwrap();
    let cache = Tensor::randn(0f32, 1.0, (2, b, kv, cap, d), &cpu).unwrap();
    let angles: Vec<f32> = (0..cap * d / 2).map(|i| (i % 997) as f32 * 0.013).collect();
    let angles = Tensor::from_vec(angles, (cap, d / 2), &cpu).unwrap();
    let rope = Tensor::cat(&[angles.cos().unwrap(), angles.sin().unwrap()], 1).unwrap();
    for (pos, window) in [(2500usize, 0usize), (2500, 401), (1023, 0), (1024, 0), (7, 0)] {
        let shape = DecodeShape { heads, kv_heads: kv, head_dim: d, pos, window };
        let want = reference_decode_attention(&qkv, &cache, &rope, shape);
        let on_device = Tensor::new(&[pos as u32], &device).unwrap();
        for (dtype, tol) in [(DType::F32, 2e-5f32), (DType::BF16, 3e-2)] {
            let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&device).unwrap();
            let (qkv, cache, rope) = (on(&qkv), on(&cache), rope.to_device(&device).unwrap());
            for (host_pos, position) in [(pos, None), (3, Some(&on_device))] {
                let host_shape = DecodeShape { pos: host_pos, ..shape };
                let got = attention(&qkv, &cache, &rope, host_shape, position).unwrap();
                let got: Vec<f32> = got.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                let from = if position.is_some() { "device" } else { "host" };
                println!(
                    "decode attention pos {pos} ({from}) window {window} {dtype:?}: max error {err:.2e} of {scale:.2}"
                );
                assert!(err <= tol * scale.max(1.0), "pos {pos} ({from}) window {window} {dtype:?}: error {err}");
            }
        }
    }
}

/// Rotate each head's query (rotate-half, the table's row `pos`), scale by 1/sqrt(d), softmax over the cached
/// keys inside the window (all when it is 0) up to pos of its KV head, weight the values: (b * heads * d) values.
fn reference_decode_attention(
    qkv: &Tensor,
    cache: &Tensor,
    rope: &Tensor,
    s: metal_candle::engine::ops::cuda::decode::DecodeShape,
) -> Vec<f32> {
    let (b, d) = (qkv.dim(0).unwrap(), s.head_dim);
    let qkv: Vec<f32> = qkv.flatten_all().unwrap().to_vec1().unwrap();
    let cap = cache.dim(3).unwrap();
    let cache: Vec<f32> = cache.flatten_all().unwrap().to_vec1().unwrap();
    let rope: Vec<Vec<f32>> = rope.to_vec2().unwrap();
    let (half, width) = (d / 2, (s.heads + 2 * s.kv_heads) * d);
    let first_visible = if s.window > 0 { (s.pos + 1).saturating_sub(s.window) } else { 0 };
    let mut out = Vec::with_capacity(b * s.heads * d);
    for bi in 0..b {
        for h in 0..s.heads {
            let kvh = h / (s.heads / s.kv_heads);
            let q = &qkv[bi * width + h * d..bi * width + (h + 1) * d];
            let (c, sn) = (&rope[s.pos][..half], &rope[s.pos][half..]);
            let mut qr = vec![0f32; d];
            for i in 0..half {
                qr[i] = (q[i] * c[i] - q[i + half] * sn[i]) / (d as f32).sqrt();
                qr[i + half] = (q[i + half] * c[i] + q[i] * sn[i]) / (d as f32).sqrt();
            }
            let row = |kv_index: usize, j: usize| {
                let start = (((kv_index * b + bi) * s.kv_heads + kvh) * cap + j) * d;
                &cache[start..start + d]
            };
            let scores: Vec<f64> =
                (first_visible..=s.pos).map(|j| row(0, j).iter().zip(&qr).map(|(k, q)| (k * q) as f64).sum()).collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for e in 0..d {
                let v: f64 = (first_visible..=s.pos).zip(&weights).map(|(j, w)| w * row(1, j)[e] as f64).sum();
                out.push((v / total) as f32);
            }
        }
    }
    out
}

/// Logits after the prompt and after each of `steps` decode steps taken through [`DecodeSteps`] (with or
/// without CUDA graphs), on the same fixed walk of ids as [`decode_logits`]; and how many steps replayed a
/// graph. `positions`: the positions the steps are told the generation reaches.
fn stepped_logits(
    model: &metal_candle::engine::model::transformer::Transformer,
    graphs: bool,
    steps: usize,
    positions: usize,
) -> (Vec<Vec<f32>>, usize) {
    use metal_candle::engine::model::decode_graph::DecodeSteps;
    let mut decoder = DecodeSteps::new(model, positions, graphs);
    let mut cache = KvCache::new(model.config.num_layers);
    let (mut ids, mut out) = (PROMPT.to_vec(), Vec::new());
    for step in 0..=steps {
        let logits = decoder.next_logits(model, &ids, &mut cache).unwrap();
        out.push(logits.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        ids.push(((step * 7919 + 13) % model.config.vocab_size) as u32);
    }
    assert_eq!(cache.len(), PROMPT.len() + steps, "the cache counts every decoded position");
    if let Some(why) = decoder.fallback() {
        eprintln!("graph capture fell back: {why}");
    }
    (out, decoder.replays())
}

/// A copy of a fixture with a sliding window of `window` positions (none of the fused-decode fixtures has one).
fn with_sliding_window(arch: &str, window: usize) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("metal-candle-{arch}-window-{window}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(format!("tests/fixtures/{arch}")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let config = dir.join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json["sliding_window"] = serde_json::json!(window);
    std::fs::write(&config, json.to_string()).unwrap();
    dir
}

/// Decoding by replaying a captured CUDA graph gives the logits (so the ids) of launching every op from the
/// host: plain, q/k-norm and sliding-window families, f32 and bf16, with active adapters and a quantized base;
/// 80 steps past a cache of 64 positions, so the graph is dropped and captured again once the cache fills. The
/// graph must actually be used (every step after the first two of each capture replays it), except where the
/// model's step reads back to the host (a quantized embedding), where it must not be.
#[test]
fn graph_decode_matches_eager_decode() {
    let Some(cuda) = cuda_or_skip() else { return };
    let window_dir = with_sliding_window("tiny-mistral", 16);
    let load = |dir: &std::path::Path, dtype| load_model(dir, &cuda, dtype).unwrap();
    let fixture = |arch: &str| std::path::PathBuf::from(format!("tests/fixtures/{arch}"));
    let cases: Vec<(String, metal_candle::engine::model::LoadedModel)> = vec![
        ("tiny-llama f32".into(), load(&fixture("tiny-llama"), DType::F32)),
        ("tiny-llama bf16".into(), load(&fixture("tiny-llama"), DType::BF16)),
        ("tiny-qwen3 f32".into(), load(&fixture("tiny-qwen3"), DType::F32)),
        ("tiny-mistral window 16 f32".into(), load(&window_dir, DType::F32)),
        ("tiny-llama + adapters f32".into(), adapted_model("tiny-llama", &cuda, BaseQuant::None)),
        ("tiny-qwen3 Q8_0 + adapters f32".into(), adapted_model("tiny-qwen3", &cuda, BaseQuant::Q8_0)),
    ];
    let steps = 80;
    for (label, loaded) in &cases {
        let model = &loaded.model;
        let (eager, none) = stepped_logits(model, false, steps, 12);
        let (graphed, replays) = stepped_logits(model, true, steps, 12);
        assert_eq!(none, 0, "{label}: graphs were off");
        let diffs = max_diffs(&format!("{label}: graph vs eager"), &eager, &graphed);
        let scale = eager.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
        let tol = if model.dtype() == DType::BF16 { 1e-2 } else { 1e-5 } * scale.max(1.0);
        assert!(diffs.iter().all(|d| *d <= tol), "{label}: graph decode differs from eager by more than {tol}");
        let same_ids = eager.iter().zip(&graphed).filter(|(a, b)| argmax(a) == argmax(b)).count();
        println!(
            "{label}: {replays} of {steps} steps replayed a graph; greedy ids equal at {same_ids} of {} steps",
            eager.len()
        );
        assert_eq!(same_ids, eager.len(), "{label}: the greedy ids differ");
        if model.decode_step_stays_on_device() {
            // Two captures (at positions 7 and 65), each after one warm-up step: 80 - 2 warm-ups - the first step.
            assert!(replays >= steps - 3, "{label}: only {replays} of {steps} steps replayed a graph");
        } else {
            assert_eq!(replays, 0, "{label}: a step that reads back to the host was captured");
        }
    }
    // The sliding window, whose start the kernels now compute from the device position, against the CPU.
    let cpu = load_model(&window_dir, &Device::Cpu, DType::F32).unwrap();
    let (want, _) = stepped_logits(&cpu.model, false, steps, 12);
    let (got, _) = stepped_logits(&cases[3].1.model, true, steps, 12);
    let diffs = max_diffs("tiny-mistral window 16: graph vs CPU", &want, &got);
    assert!(diffs.iter().all(|d| *d < 1e-3), "sliding-window graph decode differs from the CPU");
    let _ = std::fs::remove_dir_all(window_dir);
}

/// The single-row product kernel (`ops/cuda/gemv.rs`, taken by `frozen_matmul_t` for one row) against an f64
/// CPU product: row counts that are not a multiple of the block's eight, lengths with a tail after the
/// unrolled loop, the Llama-3.2-1B projection shapes, and an input at an odd offset (cuBLAS then).
#[test]
fn single_row_products_match_the_cpu() {
    let Some(device) = cuda_or_skip() else { return };
    for (n, k) in [(1usize, 8usize), (13, 72), (1000, 2312), (3072, 2048), (2048, 8192)] {
        let x = Tensor::randn(0f32, 1.0, (1, k + 1), &Device::Cpu).unwrap();
        let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
        for offset in [0usize, 1] {
            let x = x.narrow(1, offset, k).unwrap();
            let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            let ws: Vec<Vec<f32>> = w.to_vec2().unwrap();
            let want: Vec<f64> =
                ws.iter().map(|row| row.iter().zip(&xs).map(|(a, b)| *a as f64 * *b as f64).sum()).collect();
            for (dtype, tol) in [(DType::F32, 1e-5f64), (DType::BF16, 2e-2)] {
                let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&device).unwrap();
                let got = metal_candle::engine::ops::frozen_matmul_t(&on(&x), &on(&w)).unwrap();
                let got: Vec<f32> = got.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                // bf16 rounds the operands: compare with the scale of a row's sum of |products|.
                let scale = (k as f64).sqrt();
                let err = want.iter().zip(&got).map(|(a, b)| (a - *b as f64).abs()).fold(0f64, f64::max);
                println!("gemv {n} x {k} offset {offset} {dtype:?}: max error {err:.2e} (scale {scale:.0})");
                assert!(err <= tol * scale, "gemv {n} x {k} offset {offset} {dtype:?}: error {err}");
            }
        }
        // The MLP's down_proj with the SwiGLU done while the row is staged: what SwiGLU then the product give.
        let gate_up = Tensor::randn(0f32, 1.0, (1, 1, 2 * k), &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&device).unwrap();
            let (gu, w) = (on(&gate_up), on(&w));
            let fused = metal_candle::engine::ops::swiglu_matmul_t(&gu, &w).unwrap().expect("the kernel takes the row");
            let gated = metal_candle::engine::ops::cuda::decode::silu_mul_halves(&gu).unwrap();
            let composed = metal_candle::engine::ops::frozen_matmul_t(&gated, &w).unwrap();
            assert_eq!(fused.dims(), &[1, 1, n]);
            let diff = (fused.to_dtype(DType::F32).unwrap() - composed.to_dtype(DType::F32).unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            println!("swiglu gemv {n} x {k} {dtype:?}: max difference to SwiGLU then the product {diff:.2e}");
            assert!(diff <= 1e-6 * (k as f32).sqrt(), "swiglu gemv {n} x {k} {dtype:?}: differs by {diff}");
        }
    }
}

/// End to end: greedy `generate` on CUDA (a captured graph, the single-row kernels, the argmax on the GPU)
/// gives the CPU's ids on tiny llama and qwen3, f32, and replays the graph for every token after the second.
#[test]
fn greedy_generation_on_cuda_matches_the_cpu() {
    use metal_candle::engine::generate::{generate, GenerateRequest};
    use metal_candle::engine::sampler::SamplingParams;
    let Some(cuda) = cuda_or_skip() else { return };
    for arch in ["tiny-llama", "tiny-qwen3"] {
        let dir = format!("tests/fixtures/{arch}");
        let req = GenerateRequest {
            prompt_ids: PROMPT.to_vec(),
            max_new_tokens: 40,
            sampling: SamplingParams::greedy(),
            eos_token_ids: vec![],
            ignore_eos: true,
            stop_strings: vec![],
        };
        let run = |device: &Device| {
            let m = load_model(std::path::Path::new(&dir), device, DType::F32).unwrap();
            generate(&m.model, &m.tokenizer, &req, &mut |_| true).unwrap()
        };
        let (cpu, gpu) = (run(&Device::Cpu), run(&cuda));
        println!("{arch}: {} of {} tokens replayed a graph", gpu.graph_replays, gpu.generated_ids.len());
        assert_eq!(gpu.generated_ids, cpu.generated_ids, "{arch}: greedy ids differ between CUDA and the CPU");
        // 40 tokens: the first from the prefill, the second from the warm-up step, the other 38 from the graph.
        assert_eq!(gpu.graph_replays, 40 - 2, "{arch}: every step after the warm-up replays the graph");
        assert!(gpu.graph_fallback.is_none(), "{arch}: {:?}", gpu.graph_fallback);
    }
}

/// The GPU argmax of greedy sampling against the CPU's `sampler::argmax`: lengths around its block sizes and
/// past its grid (a grid-stride share), a tie (the first index wins), NaN (never wins), all -inf (index 0).
#[test]
fn gpu_argmax_matches_the_cpu() {
    use metal_candle::engine::{ops::cuda::decode::argmax, sampler};
    let Some(device) = cuda_or_skip() else { return };
    for n in [1usize, 7, 4096, 4097, 128_256, 1_500_000] {
        let mut values: Vec<f32> = Tensor::randn(0f32, 1.0, n, &Device::Cpu).unwrap().to_vec1().unwrap();
        let mut cases = vec![values.clone()];
        if n > 10 {
            let top = sampler::argmax(&values) as usize;
            values[n / 3] = values[top];
            values[n - 1] = values[top];
            values[1] = f32::NAN;
            cases.push(values.clone());
            cases.push(vec![f32::NEG_INFINITY; n]);
        }
        for case in cases {
            let want = sampler::argmax(&case);
            let got = argmax(&Tensor::from_vec(case, n, &device).unwrap()).unwrap();
            assert_eq!(got, want, "argmax of {n} values");
        }
    }
}

/// The add + norm kernel against the CPU, and the plain norm of the sum it returned (what gradient checkpointing
/// recomputes from a saved layer input) giving exactly its normed rows: row widths on the kernel's 16-byte path
/// (2048), beyond the chunks a thread keeps in registers (9216), and off it (100), in f32 and bf16.
#[test]
fn rms_norm_of_a_fused_sum_repeats_its_bits_and_both_match_the_cpu() {
    let Some(gpu) = cuda_or_skip() else { return };
    for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::BF16, 1e-2)] {
        for cols in [2048usize, 9216, 100] {
            let x = Tensor::randn(0f32, 1.0, (5, cols), &Device::Cpu).unwrap();
            let delta = Tensor::randn(0f32, 0.5, (5, cols), &Device::Cpu).unwrap();
            let weight = Tensor::randn(1f32, 0.2, cols, &Device::Cpu).unwrap();
            let on_gpu = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            let (sum, normed) = ops::add_rms_norm(&on_gpu(&x), &on_gpu(&delta), &on_gpu(&weight), 1e-5).unwrap();
            let again = ops::rms_norm(&sum, &on_gpu(&weight), 1e-5).unwrap();
            let bits = |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(bits(&normed), bits(&again), "{dtype:?} x {cols}: the norm of the sum differs");
            let sum_cpu = sum.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
            let want = ops::rms_norm(&sum_cpu, &weight, 1e-5).unwrap();
            let got = normed.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
            let largest = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let err = (want - got).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() / largest;
            assert!(err < tolerance, "{dtype:?} x {cols}: relative error {err} against the CPU");
        }
    }
}
