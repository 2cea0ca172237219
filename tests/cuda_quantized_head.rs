//! The loss over a quantized LM head on CUDA (`ops::quantized_head_nll`): one chunk of rows goes a block of the
//! vocabulary at a time (each block dequantized for its product only, its logits written into their columns, the
//! gradient summed over the blocks in f32), more rows through the whole head dequantized once. Both against the
//! dense head's loss (the same CUDA kernel) on the same dequantized weights, in f32 and bf16.
//! Built with `--features cuda`; skipped without a GPU. Run on a lent GPU machine.
#![cfg(feature = "cuda")]

mod common;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use common::cuda_or_skip;
use metal_candle::engine::ops;
use std::sync::Arc;

/// Llama-3's vocabulary: CUDA chunks of 1,024 rows, so up to 1,024 rows go by blocks.
const VOCAB: usize = 128_256;
const HIDDEN: usize = 128;
/// Rows per quantized block: 31 of 4,096 and a last one of 1,280.
const BLOCK_ROWS: usize = 4096;

/// Deterministic values in [-1, 1) from a hash of their index.
fn hashed(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut x = (i ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 31;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The head quantized in blocks of rows on `device`, and the same blocks dequantized whole (vocab, hidden) in f32.
fn head(device: &Device) -> (Vec<Arc<QTensor>>, Tensor) {
    let dense = Tensor::from_vec(hashed(VOCAB * HIDDEN, 1), (VOCAB, HIDDEN), &Device::Cpu).unwrap();
    let blocks: Vec<Arc<QTensor>> = (0..VOCAB)
        .step_by(BLOCK_ROWS)
        .map(|s| {
            let rows = BLOCK_ROWS.min(VOCAB - s);
            Arc::new(ops::quantize_rows(&dense.narrow(0, s, rows).unwrap(), GgmlDType::Q8_0, device).unwrap())
        })
        .collect();
    let whole = ops::dequantize_stacked(&blocks, device, DType::F32).unwrap();
    (blocks, whole)
}

fn max_abs(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

/// Blocks (1,000 and 1,024 rows) and the whole head (1,025 and 4,100 rows) give the dense head's loss and hidden-state
/// gradient, row by row, within the dtype's rounding: in f32 the products are the same sums in another grouping;
/// in bf16 each logit rounds to bf16 in both, and the blocks' gradient is summed in f32 where the dense product
/// sums the vocabulary in one f32 accumulator, so they differ by its last rounding.
#[test]
fn a_quantized_head_by_blocks_or_whole_gives_the_dense_heads_loss_and_gradient() {
    let Some(device) = cuda_or_skip() else { return };
    let (blocks, whole) = head(&device);
    for dtype in [DType::F32, DType::BF16] {
        let dense = whole.to_dtype(dtype).unwrap();
        for rows in [1000, 1024, 1025, 4100] {
            let values: Vec<f32> = hashed(rows * HIDDEN, rows as u64).iter().map(|v| v * 0.5).collect();
            let hidden = Tensor::from_vec(values, (rows, HIDDEN), &device).unwrap().to_dtype(dtype).unwrap();
            let targets: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % VOCAB as u32).collect();
            let ids = Tensor::new(targets.as_slice(), &device).unwrap();
            let target_rows = dense.index_select(&ids, 0).unwrap();
            let quantized =
                ops::QuantizedHead { blocks: &blocks, rows_per_block: BLOCK_ROWS, target_rows: &target_rows };
            let by_rows = ops::dequantized_head_rows(VOCAB, BLOCK_ROWS, rows);
            assert_eq!(by_rows, if rows <= 1024 { BLOCK_ROWS } else { VOCAB }, "{rows} rows");

            let (mut ours_rows, mut reference_rows) = (Vec::new(), Vec::new());
            let ours =
                ops::quantized_head_nll(&hidden, &quantized, &targets, Some(0.25), Some(&mut ours_rows)).unwrap();
            let reference =
                ops::head_nll_rows(&hidden, &dense, &targets, Some(0.25), Some(&mut reference_rows)).unwrap();
            let (loss_tol, grad_tol) = if dtype == DType::F32 { (1e-5, 1e-6) } else { (2e-2, 2e-3) };
            for (i, (a, b)) in ours_rows.iter().zip(&reference_rows).enumerate() {
                assert!((a - b).abs() < loss_tol * b.abs().max(1.0), "{dtype:?} {rows} rows: row {i} nll {a} vs {b}");
            }
            let (a, b) = (ours.nll_sum.value().unwrap(), reference.nll_sum.value().unwrap());
            assert!((a - b).abs() < loss_tol * b.abs(), "{dtype:?} {rows} rows: loss {a} vs {b}");
            let (ga, gb) = (ours.grad_hidden.unwrap(), reference.grad_hidden.unwrap());
            assert_eq!(ga.dtype(), dtype);
            let scale = max_abs(&gb);
            let diff = max_abs(&(ga.to_dtype(DType::F32).unwrap() - gb.to_dtype(DType::F32).unwrap()).unwrap());
            assert!(scale > 1e-4, "{dtype:?} {rows} rows: the gradient is zero");
            assert!(
                diff <= grad_tol * scale.max(1e-3) * 10.0,
                "{dtype:?} {rows} rows: gradient differs by {diff} (scale {scale})"
            );
        }
    }
}
