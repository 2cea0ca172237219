//! Adapter dropout masks from a counter-based generator: element `i` of the mask drawn with `seed` is kept when the
//! top 24 bits of output `i + 1` of splitmix64 started at `mix(seed)` fall below `keep * 2^24`, and is then
//! `1 / keep`, else 0. Every element is a pure function of (seed, i), so whichever device or thread draws it draws
//! the same: on CUDA `dropout_apply_*` (ops/cuda/training.cuh, the same integer arithmetic) multiplies an input by
//! its mask in one pass without ever writing the mask, and so do the WGSL kernels under `--kernels wgsl`
//! (ops/metal/wgsl/dropout_mask.wgsl: a Mac's GPU draws no mask on the host and copies none over); elsewhere the
//! CPU fills the mask in parallel chunks and the input is multiplied by it. A training tape keeps the mask's seed
//! ([`Dropout`]), not the mask. A sequential RNG on the host made a mask cost ~5 ns an element plus its copy to the
//! device: at 1 x 4,096 tokens with adapters on q and v of a 1B model, 268 million draws and a gigabyte copied
//! every step, seconds where the step itself takes tens of milliseconds.

use candle_core::{DType, Device, Result, Shape, Tensor};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finaliser (the ops/cuda/training.cuh `dropout_mix` does the same).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The kept-below threshold on 24 bits for a keep probability.
fn threshold(keep: f32) -> u32 {
    (keep as f64 * (1u64 << 24) as f64).round().clamp(0.0, (1u64 << 24) as f64) as u32
}

/// Whether element `i` of the mask whose generator starts at `base` is kept.
fn kept(base: u64, i: u64, threshold: u32) -> bool {
    ((mix(base.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN))) >> 40) as u32) < threshold
}

/// One dropout mask, by its seed and drop probability (0 < p < 1): what a training tape keeps instead of the mask
/// itself (a mask is as large as the input it drops from). `first`: the element of the whole mask this one starts
/// at, for a block of rows drawn alone ([`Dropout::rows_from`]); 0 for a whole mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    pub seed: u64,
    pub p: f32,
    pub first: u64,
}

impl Dropout {
    /// The whole mask drawn with `seed`.
    pub fn new(seed: u64, p: f32) -> Self {
        Self { seed, p, first: 0 }
    }

    /// The part of this mask over rows `row..` of a (rows, `row_len`) input: what a block of those rows, run on its
    /// own, multiplies by (the same elements as the whole mask's).
    pub fn rows_from(&self, row: usize, row_len: usize) -> Self {
        Self { first: self.first + (row * row_len) as u64, ..*self }
    }

    /// (generator start, kept-below threshold, kept value). Element `i` of a mask starting at `first` is element
    /// `first + i` of the whole one: the generator's start moves by `first` steps.
    fn parts(&self) -> (u64, u32, f32) {
        let keep = 1.0 - self.p;
        (mix(self.seed).wrapping_add(self.first.wrapping_mul(GOLDEN)), threshold(keep), 1.0 / keep)
    }

    /// This mask as the WGSL kernels draw it (ops/metal/wgsl/dropout_mask.wgsl).
    pub fn for_wgsl(&self) -> super::metal::wgsl::Mask {
        let (base, threshold, scale) = self.parts();
        super::metal::wgsl::Mask { base, threshold, scale }
    }

    /// The mask of `shape`: 0 or `1 / (1 - p)` per element, in `dtype` on `device` (drawn on the CPU; on CUDA
    /// [`Self::apply`] never needs it).
    pub fn mask(&self, shape: &Shape, dtype: DType, device: &Device) -> Result<Tensor> {
        let (base, threshold, scale) = self.parts();
        let n = shape.elem_count();
        let mask = crate::engine::cpu_pool::new_f32(n, crate::engine::cpu_pool::ELEMENTS_PER_TASK, |chunk, out| {
            let start = (chunk * crate::engine::cpu_pool::ELEMENTS_PER_TASK) as u64;
            for (k, v) in out.iter_mut().enumerate() {
                *v = if kept(base, start + k as u64, threshold) { scale } else { 0.0 };
            }
        });
        Tensor::from_vec(mask, shape, device)?.to_dtype(dtype)
    }

    /// `x` times its mask (the mask's shape is `x`'s): on CUDA, and under `--kernels wgsl` (a Mac's GPU), in one
    /// pass that never writes the mask, the same values as the product with [`Self::mask`].
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        if super::cuda::availability::available(x.device(), x.dtype()) {
            let (base, threshold, scale) = self.parts();
            return super::cuda::training::dropout_apply(x, base, threshold, scale);
        }
        if super::metal::takes(&[x]) {
            return super::metal::dropout_apply(x, self.for_wgsl());
        }
        x * self.mask(x.shape(), x.dtype(), x.device())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_of_rows_draws_the_whole_masks_rows() {
        let whole = Dropout::new(11, 0.3).mask(&Shape::from((10, 37)), DType::F32, &Device::Cpu).unwrap();
        let block =
            Dropout::new(11, 0.3).rows_from(4, 37).mask(&Shape::from((5, 37)), DType::F32, &Device::Cpu).unwrap();
        let rows: Vec<f32> = whole.narrow(0, 4, 5).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(rows, block.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        let later = Dropout::new(11, 0.3).rows_from(4, 37).rows_from(3, 37);
        assert_eq!(later, Dropout::new(11, 0.3).rows_from(7, 37), "blocks of blocks add up");
    }

    #[test]
    fn masks_keep_their_share_scale_the_kept_and_differ_by_seed() {
        let shape = Shape::from((300, 1000));
        let mask = |seed| -> Vec<f32> {
            let m = Dropout::new(seed, 0.1).mask(&shape, DType::F32, &Device::Cpu).unwrap();
            m.flatten_all().unwrap().to_vec1().unwrap()
        };
        let a = mask(7);
        let kept_share = a.iter().filter(|&&v| v != 0.0).count() as f64 / a.len() as f64;
        assert!((kept_share - 0.9).abs() < 0.003, "{kept_share}");
        assert!(a.iter().all(|&v| v == 0.0 || v == 1.0 / 0.9));
        assert_eq!(a, mask(7), "a mask is a function of its seed");
        let b = mask(8);
        // The product with the mask is what `apply` gives off CUDA.
        let x = Tensor::ones(shape.clone(), DType::F32, &Device::Cpu).unwrap();
        let applied: Vec<f32> = Dropout::new(7, 0.1).apply(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(applied, a);
        let same = a.iter().zip(&b).filter(|(x, y)| (**x == 0.0) == (**y == 0.0)).count() as f64 / a.len() as f64;
        // Independent masks agree where both keep or both drop: 0.9^2 + 0.1^2 = 0.82 of the elements.
        assert!((same - 0.82).abs() < 0.005, "{same}");
        // Neighbouring elements are not correlated: the pairs (keep, keep) come out at 0.81 too.
        let pairs = a.windows(2).filter(|w| w[0] != 0.0 && w[1] != 0.0).count() as f64 / (a.len() - 1) as f64;
        assert!((pairs - 0.81).abs() < 0.005, "{pairs}");
    }
}
