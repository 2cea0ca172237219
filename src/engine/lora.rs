//! LoRA: a low-rank update `scale * x A B` added to a frozen linear. A and B are stored in the layout that is
//! fastest for the forward pass, A as (in, r) and B as (r, out), so the update is two plain matmuls with no
//! transposes; PEFT's (r, in) / (out, r) layout is converted on save and load (see checkpoint.rs).
//! Adapters are kept in f32 (master weights) and cast to the model's compute dtype in the forward pass.

use crate::engine::model::transformer::Transformer;
use crate::engine::train::LoraSettings;
use crate::engine::{Error, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// One adapter on one linear.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// (in_features, rank), f32.
    pub a: Var,
    /// (rank, out_features), f32; starts at zero so step 0 equals the base model.
    pub b: Var,
    pub scale: f64,
    pub dropout: f32,
    /// Seeds the dropout mask; the trainer bumps it each step so masks are reproducible on resume.
    pub dropout_seed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl LoraAdapter {
    pub fn rank(&self) -> usize {
        self.a.dims()[1]
    }

    /// `y + scale * dropout(x) A B`, `x`: (..., in), `y`: (..., out).
    pub fn add_to(&self, y: &Tensor, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let dims = x.dims().to_vec();
        let in_features = dims[dims.len() - 1];
        let rows = x.elem_count() / in_features.max(1);
        let mut x2 = x.reshape((rows, in_features))?;
        if train && self.dropout > 0.0 {
            x2 = self.apply_dropout(&x2)?;
        }
        let (a, b) = (self.a.as_tensor(), self.b.as_tensor());
        let (a, b) = if a.dtype() == x.dtype() {
            (a.clone(), b.clone())
        } else {
            (a.to_dtype(x.dtype())?, b.to_dtype(x.dtype())?)
        };
        let update = (x2.matmul(&a)?.matmul(&b)? * self.scale)?;
        y + update.reshape(y.shape())?
    }

    /// Inverted dropout with a mask from our own seeded RNG (Candle's CPU RNG cannot be seeded).
    fn apply_dropout(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x * self.dropout_mask(x)?
    }

    /// The next dropout mask for an input like `x`: 0 or 1/keep per element, drawn from the shared seeded
    /// counter (so the training and reference passes draw identical masks in the same order).
    pub(crate) fn dropout_mask(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let seed = self.dropout_seed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut rng = StdRng::seed_from_u64(seed);
        let keep = 1.0 - self.dropout;
        let mask: Vec<f32> =
            (0..x.elem_count()).map(|_| if rng.random::<f32>() < keep { 1.0 / keep } else { 0.0 }).collect();
        Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())
    }
}

/// A named trainable tensor of an attached adapter, PEFT-style base name plus which matrix.
#[derive(Debug, Clone)]
pub struct AdapterParam {
    pub layer: usize,
    pub module: &'static str,
    pub a: Var,
    pub b: Var,
}

/// Which layers get adapters: all, or the last `last_n`.
pub fn adapted_layers(num_layers: usize, last_n: Option<usize>) -> std::ops::Range<usize> {
    let n = last_n.unwrap_or(num_layers).min(num_layers);
    (num_layers - n)..num_layers
}

/// Attach fresh adapters as PEFT initialises them: A ~ kaiming-uniform (bound 1/sqrt(in)), B = 0.
pub fn attach_new_adapters(model: &mut Transformer, settings: &LoraSettings, seed: u64) -> Result<Vec<AdapterParam>> {
    let targets = settings.resolved_targets()?;
    let layers = adapted_layers(model.config.num_layers, settings.layers);
    let device = model.device().clone();
    let mut rng = StdRng::seed_from_u64(seed);
    let dropout_seed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(seed.wrapping_mul(0x9E37_79B9)));
    let mut params = Vec::new();
    for (layer, module, linear) in model.linears_mut() {
        if !layers.contains(&layer) || !targets.iter().any(|t| t == module) {
            continue;
        }
        let (in_f, out_f) = (linear.in_features(), linear.out_features());
        let bound = 1.0 / (in_f as f32).sqrt();
        let a: Vec<f32> = (0..in_f * settings.rank).map(|_| rng.random_range(-bound..bound)).collect();
        let a = Var::from_tensor(&Tensor::from_vec(a, (in_f, settings.rank), &device)?)?;
        let b = Var::from_tensor(&Tensor::zeros((settings.rank, out_f), DType::F32, &device)?)?;
        linear.adapter = Some(LoraAdapter {
            a: a.clone(),
            b: b.clone(),
            scale: settings.scale(),
            dropout: settings.dropout,
            dropout_seed: dropout_seed.clone(),
        });
        params.push(AdapterParam { layer, module, a, b });
    }
    if params.is_empty() {
        return Err(Error::InvalidSetting("no linear matched the LoRA targets and layers".into()));
    }
    Ok(params)
}

/// Attach given adapter matrices (already in our layout: A (in, r), B (r, out)).
pub fn attach_adapter(
    model: &mut Transformer,
    layer: usize,
    module: &str,
    a: Tensor,
    b: Tensor,
    scale: f64,
) -> Result<AdapterParam> {
    let device: Device = model.device().clone();
    for (l, m, linear) in model.linears_mut() {
        if l == layer && m == module {
            let (in_f, out_f) = (linear.in_features(), linear.out_features());
            let r = a.dim(1)?;
            if a.dims() != [in_f, r] || b.dims() != [r, out_f] {
                return Err(Error::InvalidSetting(format!(
                    "adapter for layer {layer} {module} has shapes A {:?} B {:?}, expected A ({in_f}, r) B (r, {out_f})",
                    a.dims(),
                    b.dims()
                )));
            }
            let a = Var::from_tensor(&a.to_dtype(DType::F32)?.to_device(&device)?)?;
            let b = Var::from_tensor(&b.to_dtype(DType::F32)?.to_device(&device)?)?;
            linear.adapter =
                Some(LoraAdapter { a: a.clone(), b: b.clone(), scale, dropout: 0.0, dropout_seed: Default::default() });
            return Ok(AdapterParam { layer, module: m, a, b });
        }
    }
    Err(Error::InvalidSetting(format!("the model has no layer {layer} module {module}")))
}

/// Make the dropout masks of optimizer step `step` a pure function of (seed, step): all adapters share one
/// counter, which is reset here and advanced by each mask drawn during the step.
pub fn seed_dropout(model: &Transformer, seed: u64, step: usize) {
    let mixed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (step as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    if let Some(adapter) = model.linears().iter().find_map(|(_, _, l)| l.adapter.as_ref()) {
        adapter.dropout_seed.store(mixed, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Set the dropout probability of every attached adapter (adapters loaded from disk come without one),
/// sharing one mask-seed counter as freshly attached adapters do.
pub fn set_dropout(model: &mut Transformer, dropout: f32) {
    let counter = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    for (_, _, linear) in model.linears_mut() {
        if let Some(adapter) = linear.adapter.as_mut() {
            adapter.dropout = dropout;
            adapter.dropout_seed = counter.clone();
        }
    }
}

/// Remove every adapter.
pub fn detach_adapters(model: &mut Transformer) {
    for (_, _, linear) in model.linears_mut() {
        linear.adapter = None;
    }
}
