//! A few f32 rows times a Q8_0 matrix on the CPU without rounding the rows: the LM head's product when
//! decoding with a quantized base (`model/vocab_matrix.rs`).
//!
//! Candle's kernel (and llama.cpp's) first rounds the activations to 8-bit blocks. In the projections that costs
//! nothing visible, but in the head it moves logits by a few tenths: on SmolLM2 it turned "The capital of France
//! is Paris." into "La femme, ..." for the same stored weights. Here every weight is widened to f32 and multiplied
//! with the row as it is, so the logits equal those of the dequantized matrix up to summation order; the matrix is
//! still read at 1.06 bytes a weight instead of 4. Output features are split over the CPU team.

use half::f16;

/// Bytes of one Q8_0 block: an f16 scale and 32 signed 8-bit weights (GGML's `block_q8_0`).
const BLOCK_BYTES: usize = 34;
const BLOCK: usize = 32;
/// Output features per task.
const FEATURES_PER_TASK: usize = 256;

/// Whether rows of `in_features` fill whole Q8_0 blocks.
pub fn fits(in_features: usize) -> bool {
    in_features > 0 && in_features.is_multiple_of(BLOCK)
}

/// `x W^T` for `x` (rows, in) row-major and `W` (out, in) in Q8_0 blocks (`data`, GGML layout): (rows, out).
pub fn q8_0_rows(data: &[u8], x: &[f32], rows: usize, out_features: usize, in_features: usize) -> Vec<f32> {
    let row_bytes = in_features / BLOCK * BLOCK_BYTES;
    assert!(fits(in_features) && data.len() >= out_features * row_bytes && x.len() == rows * in_features);
    let mut out = vec![0f32; rows * out_features];
    for (r, out_row) in out.chunks_mut(out_features).enumerate() {
        let xr = &x[r * in_features..(r + 1) * in_features];
        crate::engine::cpu_pool::for_each_chunk(out_row, FEATURES_PER_TASK, |task, chunk| {
            for (j, y) in chunk.iter_mut().enumerate() {
                let feature = task * FEATURES_PER_TASK + j;
                *y = dot(&data[feature * row_bytes..(feature + 1) * row_bytes], xr);
            }
        });
    }
    out
}

/// One Q8_0 row (`w`, its blocks) dotted with `x`, on the widest vector unit the CPU has.
fn dot(w: &[u8], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the features the function is compiled for were just detected.
        return unsafe { dot_avx2(w, x) };
    }
    dot_portable(w, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(w: &[u8], x: &[f32]) -> f32 {
    dot_portable(w, x)
}

/// Eight lanes of partial sums, which the compiler turns into one vector register.
#[inline(always)]
fn dot_portable(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (block, xs) in w.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(BLOCK)) {
        let scale = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let qs = &block[2..];
        let mut part = [0f32; 8];
        for c in 0..BLOCK / 8 {
            for l in 0..8 {
                part[l] += f32::from(qs[c * 8 + l] as i8) * xs[c * 8 + l];
            }
        }
        for l in 0..8 {
            acc[l] += scale * part[l];
        }
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    #[test]
    fn rows_times_q8_0_equal_the_dequantized_product() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (out, k) = (700, 576);
        let w = QTensor::quantize(&Tensor::randn(0f32, 1.0, (out, k), &dev)?, GgmlDType::Q8_0)?;
        let dense = w.dequantize(&dev)?;
        for rows in [1, 3] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev)?;
            let reference = x.matmul(&dense.t()?)?.flatten_all()?.to_vec1::<f32>()?;
            let ours = q8_0_rows(&w.data()?, &x.flatten_all()?.to_vec1::<f32>()?, rows, out, k);
            let diff = ours.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            // f32 sums of 576 products of magnitude ~1 in another order.
            assert!(diff < 1e-4, "{rows} rows: {diff}");
        }
        Ok(())
    }
}
