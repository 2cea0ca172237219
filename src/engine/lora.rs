//! LoRA on a model: the settings (rank, alpha, targets, layers), attaching fresh or saved adapters to a
//! model's projections, detaching them, dropout seeding, and the trainable-parameter count. The adapter
//! layer's math lives with the projection it wraps (model/adapter.rs, model/linear.rs).

pub use crate::engine::model::adapter::LoraAdapter;
use crate::engine::model::transformer::Transformer;
use crate::engine::{Error, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// The linears an adapter can wrap.
pub const ALL_TARGETS: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// LoRA shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LoraSettings {
    pub rank: usize,
    pub alpha: f64,
    pub dropout: f32,
    /// Module names (see [`ALL_TARGETS`]); "all-linear" expands to all of them.
    pub targets: Vec<String>,
    /// Adapt only the last N layers (None: all).
    pub layers: Option<usize>,
    /// Scale alpha/sqrt(r) instead of alpha/r.
    pub use_rslora: bool,
}

impl Default for LoraSettings {
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: vec!["q_proj".into(), "v_proj".into()],
            layers: None,
            use_rslora: false,
        }
    }
}

impl LoraSettings {
    /// The multiplier applied to `x A B`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Target module names with "all-linear" expanded, validated.
    pub fn resolved_targets(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for t in &self.targets {
            let t = t.trim();
            if t == "all-linear" || t == "all" {
                out.extend(ALL_TARGETS.iter().map(|s| s.to_string()));
            } else if ALL_TARGETS.contains(&t) {
                out.push(t.to_string());
            } else if !t.is_empty() {
                return Err(Error::InvalidSetting(format!(
                    "unknown LoRA target `{t}`; choose from {} or all-linear",
                    ALL_TARGETS.join(", ")
                )));
            }
        }
        out.sort_by_key(|t| ALL_TARGETS.iter().position(|a| a == t));
        out.dedup();
        if out.is_empty() {
            return Err(Error::InvalidSetting("choose at least one LoRA target module".into()));
        }
        Ok(out)
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
