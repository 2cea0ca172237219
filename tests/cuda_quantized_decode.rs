//! A quantized base on CUDA: our single-row kernels for Q4_K, Q6_K and Q8_0 weights (`ops::quantized_gemv_joined`,
//! `ops/cuda/qgemv.rs`) and the row lookup of a quantized vocabulary (`ops::quantized_rows_on_device`) against
//! Candle's CPU dequantization, whole weights made dense for the many-row products (`ops/cuda/dequantize.rs`)
//! against Candle's CUDA dequantize and cast, and a whole model's decode steps with a
//! quantized base against its own forward over the whole sequence (which dequantizes each weight and multiplies
//! densely), replayed from a captured CUDA graph.
//! Built with `--features cuda`; skipped without a GPU. Run on a lent GPU machine.
#![cfg(feature = "cuda")]

mod common;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use common::{cuda_or_skip, differing_bits};
use metal_candle::engine::generate::KvCache;
use metal_candle::engine::model::{load_model_with, BaseQuant, LoadOptions};
use metal_candle::engine::ops;
use metal_candle::engine::sampler::argmax;

const TYPES: [GgmlDType; 3] = [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0];

/// Random (rows, k) weights with a spread of row scales and offsets (Q4_K's mins then matter), quantized to
/// `qtype` on the CPU and on `device` (the same bytes: quantization runs on the host).
fn weight(rows: usize, k: usize, qtype: GgmlDType, device: &Device, seed: u64) -> (QTensor, QTensor) {
    let base = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu).unwrap();
    let scale: Vec<f32> = (0..rows).map(|r| 0.02 * (1.0 + ((r as u64 * 7 + seed) % 13) as f32)).collect();
    let offset: Vec<f32> = (0..rows).map(|r| 0.01 * (((r as u64 * 5 + seed) % 9) as f32 - 4.0)).collect();
    let scale = Tensor::from_vec(scale, (rows, 1), &Device::Cpu).unwrap();
    let offset = Tensor::from_vec(offset, (rows, 1), &Device::Cpu).unwrap();
    let dense = base.broadcast_mul(&scale).unwrap().broadcast_add(&offset).unwrap();
    (ops::quantize_rows(&dense, qtype, &Device::Cpu).unwrap(), ops::quantize_rows(&dense, qtype, device).unwrap())
}

/// The weights dequantized on the CPU by Candle, as f64 rows.
fn dequantized(weights: &[&QTensor]) -> Vec<Vec<f64>> {
    weights
        .iter()
        .flat_map(|w| {
            let dense = ops::dequantize(w, &Device::Cpu, DType::F32).unwrap().to_dtype(DType::F64).unwrap();
            dense.to_vec2::<f64>().unwrap()
        })
        .collect()
}

/// One row against weights split into several tensors (q|k|v-like, so one launch spans three), row counts that
/// are not a multiple of a block's 16 rows, row lengths that leave a warp's last step partly idle, enough rows
/// (16,400) for the launch shape of an MLP's gate|up, f32 and bf16.
///
/// Tolerance, derived: the kernel and the reference use the same dequantized weights; the kernel sums in f32
/// in another order and splits each block's scale and offset out of the sum (for Q4_K, d sc sum(x q) -
/// dmin m sum(x)). Each of the k terms it adds has magnitude at most 2 M |x_i| (M = the largest |w|: a block's
/// positive and offset parts are each at most twice it), so the f32 sums are within k u 2 M sum|x| of the exact
/// one (u = 2^-24, the standard bound on recursive summation), doubled for the two sums the offset split makes.
/// A bf16 result adds one rounding, 2^-8 |y|. Q4_K's tensor-core kernel (qgemv_mma.cuh, bf16 only) sums
/// x (128 + q) over each 32-weight sub-block and takes 128 sum(x) off after: terms of at most 143 |x_i| times the
/// sub-block's d sc (at most M / 7.5, as a block's codes span 0..15), so its sums are within 32 u 143 M / 7.5 sum|x|
/// < 2^-14 M sum|x|: inside the bound from k = 256. Any misread weight would be off by about M |x_i| / 2 or more:
/// over 100 times this bound at k <= 4096.
#[test]
fn quantized_single_row_products_match_the_dequantized_product() {
    let Some(cuda) = cuda_or_skip() else { return };
    for qtype in TYPES {
        let shapes = [
            (vec![40usize, 8, 8], 256usize),
            (vec![96, 32, 32], 1536),
            (vec![64, 16, 16], 4096),
            (vec![16400, 8], 256),
        ];
        for (parts, k) in shapes {
            let pairs: Vec<(QTensor, QTensor)> =
                parts.iter().enumerate().map(|(i, &n)| weight(n, k, qtype, &cuda, i as u64)).collect();
            let cpu: Vec<&QTensor> = pairs.iter().map(|p| &p.0).collect();
            let gpu: Vec<&QTensor> = pairs.iter().map(|p| &p.1).collect();
            let rows = dequantized(&cpu);
            let m = rows.iter().flatten().fold(0f64, |a, v| a.max(v.abs()));
            let x = Tensor::randn(0f32, 1.0, (1, k), &Device::Cpu).unwrap();
            // bf16 twice: the FMA kernel, and Q4_K's tensor-core kernel (the default; other types ignore it).
            for (dtype, tensor_cores) in [(DType::F32, false), (DType::BF16, false), (DType::BF16, true)] {
                let x = x.to_dtype(dtype).unwrap();
                let xs: Vec<f64> = x.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let want: Vec<f64> = rows.iter().map(|r| r.iter().zip(&xs).map(|(a, b)| a * b).sum()).collect();
                let got = ops::quantized_gemv_joined_with(&x.to_device(&cuda).unwrap(), &gpu, tensor_cores)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{qtype:?} {k}: the kernel does not take the weights"));
                assert_eq!(got.dims(), &[1, parts.iter().sum::<usize>()]);
                assert_eq!(got.dtype(), dtype);
                let got: Vec<f32> = got.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let sum_x: f64 = xs.iter().map(|v| v.abs()).sum();
                let bound = 4.0 * k as f64 * 2f64.powi(-24) * 2.0 * m * sum_x;
                let mut worst = 0f64;
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    let rounding = if dtype == DType::BF16 { 2f64.powi(-8) * w.abs() } else { 0.0 };
                    let err = (w - *g as f64).abs();
                    worst = worst.max(err / (bound + rounding));
                    assert!(
                        err <= bound + rounding,
                        "{qtype:?} k {k} {dtype:?} tensor cores {tensor_cores} row {i}: {g} against {w}"
                    );
                }
                println!(
                    "{qtype:?} rows {parts:?} k {k} {dtype:?} tensor cores {tensor_cores}: worst error {worst:.3} of \
                     the bound {bound:.2e}"
                );
            }
            // Candle's own CUDA product of one of the weights (it rounds the row to 8 bits): the same values to
            // within that rounding, so both read the blocks alike.
            let x = Tensor::randn(0f32, 1.0, (1, k), &cuda).unwrap();
            let ours = ops::quantized_gemv_joined(&x, &gpu[..1]).unwrap().unwrap();
            let candle = x.apply_op1_no_bwd(gpu[0]).unwrap();
            let rel = ((ours - &candle).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap()
                / candle.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap())
            .sqrt();
            println!("{qtype:?} k {k}: relative difference to Candle's 8-bit-row kernel {rel:.2e}");
            assert!(rel < 2e-2, "{qtype:?} k {k}: Candle's kernel gives other values (relative {rel})");
        }
    }
}

/// Rows of quantized weights looked up by ids on the device (the embedding of a quantized vocabulary in a
/// captured decode step) equal Candle's dequantized rows (exactly in f32: the same products, once rounded);
/// an id past the rows gives zeros.
#[test]
fn quantized_rows_looked_up_on_the_device_equal_the_dequantized_rows() {
    let Some(cuda) = cuda_or_skip() else { return };
    for qtype in TYPES {
        let pairs: Vec<(QTensor, QTensor)> = (0..3).map(|i| weight(50, 512, qtype, &cuda, i)).collect();
        let cpu: Vec<&QTensor> = pairs.iter().map(|p| &p.0).collect();
        let gpu: Vec<&QTensor> = pairs.iter().map(|p| &p.1).collect();
        let rows = dequantized(&cpu);
        let ids = [0u32, 49, 50, 149, 77, 150, 1_000_000];
        for dtype in [DType::F32, DType::BF16] {
            let got = ops::quantized_rows_on_device(&gpu, &Tensor::new(&ids, &cuda).unwrap(), dtype)
                .unwrap()
                .expect("the kernel takes the weights");
            assert_eq!(got.dims(), &[ids.len(), 512]);
            let got: Vec<Vec<f32>> = got.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
            for (id, row) in ids.iter().zip(&got) {
                let want = rows.get(*id as usize);
                for (j, g) in row.iter().enumerate() {
                    let w = want.map_or(0.0, |r| r[j]);
                    let tol = if dtype == DType::BF16 { 2f64.powi(-8) * w.abs() } else { 1e-6 * w.abs() };
                    assert!((w - *g as f64).abs() <= tol, "{qtype:?} {dtype:?} id {id} weight {j}: {g} against {w}");
                }
            }
        }
    }
}

/// A whole quantized weight made dense on the GPU (`ops::dequantize` on CUDA, our one-launch kernel,
/// `ops/cuda/dequantize.rs`) equals Candle's CUDA dequantize followed by its cast bit for bit, in f32, bf16 and
/// f16: the kernel repeats Candle's arithmetic and rounds each f32 value once. A weight of 2 x 256 (fewer values
/// than one block of threads covers) and one of 300 x 4,096.
#[test]
fn whole_weights_dequantized_on_the_device_equal_candles_dequantize_and_cast() {
    let Some(cuda) = cuda_or_skip() else { return };
    for qtype in TYPES {
        for (rows, k) in [(2, 256), (300, 4096)] {
            let (_, w) = weight(rows, k, qtype, &cuda, rows as u64);
            let candle_f32 = w.dequantize(&cuda).unwrap();
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let ours = ops::dequantize(&w, &cuda, dtype).unwrap();
                let candle = candle_f32.to_dtype(dtype).unwrap();
                assert_eq!((ours.dims(), ours.dtype()), (candle.dims(), dtype));
                let (differ, all) = differing_bits(&ours, &candle);
                assert_eq!(differ, 0, "{qtype:?} {rows}x{k} {dtype:?}: {differ} of {all} values differ");
            }
        }
    }
}

/// A llama with rows of 256 (every projection fills Q4_K and Q6_K blocks), random weights, written next to the
/// tiny fixture's tokenizer.
fn wide_llama() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mc-wide-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = std::path::Path::new("tests/fixtures/tiny-llama");
    for entry in std::fs::read_dir(fixture).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".safetensors") && name != "config.json" {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    let (hidden, inter, heads, kv, layers) = (256usize, 512usize, 4usize, 2usize, 2usize);
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    config["hidden_size"] = hidden.into();
    config["intermediate_size"] = inter.into();
    config["num_attention_heads"] = heads.into();
    config["num_key_value_heads"] = kv.into();
    config["num_hidden_layers"] = layers.into();
    config["head_dim"] = (hidden / heads).into();
    config["tie_word_embeddings"] = false.into();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let d = hidden / heads;
    let mut tensors = std::collections::HashMap::new();
    let mut add = |name: String, shape: (usize, usize), std: f32| {
        tensors.insert(name, Tensor::randn(0f32, std, shape, &Device::Cpu).unwrap());
    };
    add("model.embed_tokens.weight".into(), (vocab, hidden), 1.0);
    add("lm_head.weight".into(), (vocab, hidden), 0.06);
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj", (heads * d, hidden)),
            ("self_attn.k_proj", (kv * d, hidden)),
            ("self_attn.v_proj", (kv * d, hidden)),
            ("self_attn.o_proj", (hidden, heads * d)),
            ("mlp.gate_proj", (inter, hidden)),
            ("mlp.up_proj", (inter, hidden)),
            ("mlp.down_proj", (hidden, inter)),
        ] {
            add(format!("{p}.{name}.weight"), shape, 0.06);
        }
    }
    let mut tensors: std::collections::HashMap<String, Tensor> = tensors;
    tensors.insert("model.norm.weight".into(), Tensor::ones(hidden, DType::F32, &Device::Cpu).unwrap());
    for l in 0..layers {
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            let t = Tensor::ones(hidden, DType::F32, &Device::Cpu).unwrap();
            tensors.insert(format!("model.layers.{l}.{norm}.weight"), t);
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    dir
}

/// Decoding a model whose whole base is quantized (projections Q4_K, Q6_K or Q8_0; the vocabulary as the
/// load's mix has it) on CUDA: each step's logits, replayed from a captured graph (the quantized embedding is
/// looked up on the device, so the step now stays there), equal the logits of one forward over the whole
/// sequence, whose products of many rows dequantize each weight and multiply densely. f32: the two differ only
/// in the order of sums (1e-4 of the logits' scale); bf16: its roundings (3e-2).
#[test]
fn quantized_decode_steps_equal_the_dequantized_forward() {
    let Some(cuda) = cuda_or_skip() else { return };
    let dir = wide_llama();
    for (quantize, dtype) in [
        (BaseQuant::Q4K, DType::F32),
        (BaseQuant::Q4K, DType::BF16),
        (BaseQuant::Q6K, DType::F32),
        (BaseQuant::Q8_0, DType::F32),
    ] {
        let loaded = load_model_with(&dir, &cuda, dtype, &LoadOptions { quantize }).unwrap();
        let model = &loaded.model;
        assert!(model.decode_step_stays_on_device(), "{quantize} {dtype:?}: the decode step reads back to the host");
        let mut steps = metal_candle::engine::model::decode_graph::DecodeSteps::new(model, 64, true);
        let mut cache = KvCache::new(model.config.num_layers);
        let mut ids = vec![281u32, 358, 289, 422, 348, 300, 311, 402, 290, 377, 351, 333];
        let mut decoded = Vec::new();
        for _ in 0..24 {
            let logits = steps.next_logits(model, &ids, &mut cache).unwrap();
            let row: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
            ids.push(argmax(&row));
            decoded.push(row);
        }
        assert!(steps.replays() >= 20, "{quantize} {dtype:?}: only {} steps replayed a graph", steps.replays());
        let input = Tensor::new(&ids[..ids.len() - 1], &cuda).unwrap().unsqueeze(0).unwrap();
        let full = model.forward(&input, 0, None).unwrap().to_dtype(DType::F32).unwrap().squeeze(0).unwrap();
        let full: Vec<Vec<f32>> = full.to_vec2().unwrap();
        let scale = full.iter().flatten().fold(1f32, |m, v| m.max(v.abs()));
        let tol = if dtype == DType::BF16 { 3e-2 } else { 1e-4 } * scale;
        // The prompt's last position is the first decoded row. The prompt has over 8 tokens, so its prefill
        // dequantizes too (fewer rows go through Candle's kernel, which rounds them to 8 bits).
        let first = 11;
        let mut worst = 0f32;
        for (step, row) in decoded.iter().enumerate() {
            let want = &full[first + step];
            let diff = want.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            worst = worst.max(diff);
            assert!(diff <= tol, "{quantize} {dtype:?} step {step}: decode differs from the full forward by {diff}");
        }
        println!(
            "{quantize} {dtype:?}: decode vs full forward, worst {worst:.2e} (scale {scale:.1}, tolerance {tol:.2e})"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
