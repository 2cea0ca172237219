//! LoRA on a model: the settings (rank, alpha, targets, layers, DoRA), attaching fresh or saved adapters to a
//! model's projections, detaching them, dropout seeding, and the trainable-parameter count. The adapter
//! layer's math lives with the projection it wraps (model/adapter.rs, model/linear.rs).

use crate::engine::model::adapter::row_norms;
pub use crate::engine::model::adapter::{Dora, LoraAdapter};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::ModelConfig;
use crate::engine::{Error, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// A projection an adapter can wrap, by its Hugging Face (and PEFT) module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    QProj,
    KProj,
    VProj,
    /// phi3's fused q|k|v projection: one adapter over all three outputs.
    QkvProj,
    OProj,
    GateProj,
    UpProj,
    /// phi3's fused gate|up projection.
    GateUpProj,
    DownProj,
}

impl Target {
    /// Every target of every family, in model order (attention, then MLP). A family has either the separate
    /// q/k/v and gate/up projections or the fused ones ([`ModelConfig::linear_modules`]).
    pub const ALL: [Target; 9] = [
        Self::QProj,
        Self::KProj,
        Self::VProj,
        Self::QkvProj,
        Self::OProj,
        Self::GateProj,
        Self::UpProj,
        Self::GateUpProj,
        Self::DownProj,
    ];

    /// Whether this projection belongs to the attention block (else the MLP).
    pub fn is_attention(self) -> bool {
        matches!(self, Self::QProj | Self::KProj | Self::VProj | Self::QkvProj | Self::OProj)
    }

    /// The targets of the families with separate projections (llama and most others): what a panel shows
    /// before a model is loaded.
    pub fn separate() -> Vec<Target> {
        Self::ALL.into_iter().filter(|t| !matches!(t, Self::QkvProj | Self::GateUpProj)).collect()
    }

    /// The targets a model of `config`'s family has, in model order.
    pub fn of_model(config: &ModelConfig) -> Vec<Target> {
        Self::ALL.into_iter().filter(|t| config.linear_modules().contains(&t.name())).collect()
    }

    /// The fused projection that holds this one in families that fuse them (phi3: q, k and v in `qkv_proj`,
    /// gate and up in `gate_up_proj`).
    pub fn fused(self) -> Option<Target> {
        match self {
            Self::QProj | Self::KProj | Self::VProj => Some(Self::QkvProj),
            Self::GateProj | Self::UpProj => Some(Self::GateUpProj),
            _ => None,
        }
    }

    /// The module name, e.g. `q_proj`.
    pub fn name(self) -> &'static str {
        match self {
            Self::QProj => "q_proj",
            Self::KProj => "k_proj",
            Self::VProj => "v_proj",
            Self::QkvProj => "qkv_proj",
            Self::OProj => "o_proj",
            Self::GateProj => "gate_proj",
            Self::UpProj => "up_proj",
            Self::GateUpProj => "gate_up_proj",
            Self::DownProj => "down_proj",
        }
    }
}

impl std::str::FromStr for Target {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        Self::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|t| t.name()).collect();
            Error::InvalidSetting(format!("unknown LoRA target `{s}`; choose from {} or all-linear", names.join(", ")))
        })
    }
}

/// The projections that get adapters: a set kept in model order. Parsed from module names, where
/// `all-linear` (or `all`) means every one; written as the list of names (run.json, PEFT's target_modules).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Targets(Vec<Target>);

impl Targets {
    /// Every projection of every family (PEFT's `all-linear`, before [`Targets::for_model`] narrows it to one
    /// family's linears).
    pub fn all() -> Self {
        Self(Target::ALL.to_vec())
    }

    /// These targets as they apply to a model of `config`'s family ([`Targets::among`]).
    pub fn for_model(&self, config: &ModelConfig) -> Result<Self> {
        self.among(&Target::of_model(config), &format!("{} models", config.architecture.as_str()))
    }

    /// These targets among the linears a family has (`family`, called `family_name` in errors): `all-linear`
    /// becomes every one; a separate projection the family fuses becomes the fused one, so the default
    /// `q_proj,v_proj` adapts phi3's `qkv_proj` (PEFT's default target for phi3) and `gate_proj` its
    /// `gate_up_proj`; any other target the family lacks is an error that names the ones it has. The result is
    /// what run.json and the adapter config record.
    pub fn among(&self, family: &[Target], family_name: &str) -> Result<Self> {
        if *self == Self::all() {
            return Ok(Self(family.to_vec()));
        }
        let mut out = Vec::with_capacity(self.0.len());
        for &t in &self.0 {
            match t.fused().filter(|f| !family.contains(&t) && family.contains(f)) {
                Some(fused) => out.push(fused),
                None if family.contains(&t) => out.push(t),
                None => {
                    let names: Vec<&str> = family.iter().map(|t| t.name()).collect();
                    return Err(Error::InvalidSetting(format!(
                        "LoRA target `{}` is not a linear of {family_name} (its linears: {}, or all-linear)",
                        t.name(),
                        names.join(", ")
                    )));
                }
            }
        }
        Ok(Self::of(&out))
    }

    /// These targets, in model order, each once.
    pub fn of(targets: &[Target]) -> Self {
        let mut list = targets.to_vec();
        list.sort();
        list.dedup();
        Self(list)
    }

    pub fn contains(&self, target: Target) -> bool {
        self.0.contains(&target)
    }

    /// Whether the projection named `module` (e.g. `q_proj`) is a target.
    pub fn contains_name(&self, module: &str) -> bool {
        self.0.iter().any(|t| t.name() == module)
    }

    pub fn insert(&mut self, target: Target) {
        *self = Self::of(&[self.0.as_slice(), &[target]].concat());
    }

    pub fn remove(&mut self, target: Target) {
        self.0.retain(|t| *t != target);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = Target> + '_ {
        self.0.iter().copied()
    }

    /// The module names, in model order.
    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|t| t.name().to_string()).collect()
    }

    /// Parse a list of names, each possibly `all-linear`; blank names are ignored.
    pub fn parse_names<S: AsRef<str>>(names: &[S]) -> Result<Self> {
        let mut out = Vec::new();
        for name in names.iter().map(|n| n.as_ref().trim()).filter(|n| !n.is_empty()) {
            match name {
                "all-linear" | "all" => out.extend(Target::ALL),
                _ => out.push(name.parse()?),
            }
        }
        Ok(Self::of(&out))
    }
}

/// Comma-separated names, as the CLI's `--targets q_proj,v_proj` or `all-linear`.
impl std::str::FromStr for Targets {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse_names(&s.split(',').collect::<Vec<_>>())
    }
}

impl std::fmt::Display for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names().join(", "))
    }
}

impl serde::Serialize for Targets {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.names().serialize(serializer)
    }
}

/// A list of names (each possibly `all-linear`), or one comma-separated string (handy in a TOML file).
impl<'de> serde::Deserialize<'de> for Targets {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Names {
            List(Vec<String>),
            One(String),
        }
        match Names::deserialize(deserializer)? {
            Names::List(names) => Targets::parse_names(&names),
            Names::One(text) => text.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// LoRA shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LoraSettings {
    pub rank: usize,
    pub alpha: f64,
    pub dropout: f32,
    /// The projections that get adapters.
    pub targets: Targets,
    /// Adapt only the last N layers (None: all).
    pub layers: Option<usize>,
    /// Scale alpha/sqrt(r) instead of alpha/r.
    pub use_rslora: bool,
    /// DoRA: a trained magnitude per output row on top of the LoRA direction (PEFT's `use_dora`).
    pub dora: bool,
}

impl Default for LoraSettings {
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: Targets::of(&[Target::QProj, Target::VProj]),
            layers: None,
            use_rslora: false,
            dora: false,
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

    /// These settings at `rank`, with the alpha that makes [`Self::scale`] equal `scale` (alpha = scale x r, or
    /// scale x sqrt(r) with rsLoRA): how the rank explorer probes each rank at the settings' scale.
    pub fn at_rank_with_scale(&self, rank: usize, scale: f64) -> Self {
        let per_scale = if self.use_rslora { (rank as f64).sqrt() } else { rank as f64 };
        Self { rank, alpha: scale * per_scale, ..self.clone() }
    }
}

/// A named trainable tensor of an attached adapter, PEFT-style base name plus which matrix.
#[derive(Debug, Clone)]
pub struct AdapterParam {
    pub layer: usize,
    pub module: &'static str,
    pub a: Var,
    pub b: Var,
    /// DoRA's magnitude (out,), for a DoRA adapter.
    pub magnitude: Option<Var>,
}

impl AdapterParam {
    /// Its trainable numbers: A, B and DoRA's magnitude.
    pub fn elem_count(&self) -> usize {
        self.a.elem_count() + self.b.elem_count() + self.magnitude.as_ref().map_or(0, |m| m.elem_count())
    }
}

/// Which layers get adapters: all, or the last `last_n`.
pub fn adapted_layers(num_layers: usize, last_n: Option<usize>) -> std::ops::Range<usize> {
    let n = last_n.unwrap_or(num_layers).min(num_layers);
    (num_layers - n)..num_layers
}

/// Attach fresh adapters as PEFT initialises them: A ~ kaiming-uniform (bound 1/sqrt(in)), B = 0, and with DoRA
/// the magnitude m = ||W||_row (so step 0 still equals the base model).
pub fn attach_new_adapters(model: &mut Transformer, settings: &LoraSettings, seed: u64) -> Result<Vec<AdapterParam>> {
    let layers = adapted_layers(model.config.num_layers, settings.layers);
    let targets = settings.targets.for_model(&model.config)?;
    let device = model.device().clone();
    let mut rng = StdRng::seed_from_u64(seed);
    let dropout_seed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(seed.wrapping_mul(0x9E37_79B9)));
    let mut params = Vec::new();
    for (layer, module, linear) in model.linears_mut() {
        if !layers.contains(&layer) || !targets.contains_name(module) {
            continue;
        }
        let (in_f, out_f) = (linear.in_features(), linear.out_features());
        let bound = 1.0 / (in_f as f32).sqrt();
        let a: Vec<f32> = (0..in_f * settings.rank).map(|_| rng.random_range(-bound..bound)).collect();
        let a = Var::from_tensor(&Tensor::from_vec(a, (in_f, settings.rank), &device)?)?;
        let b = Var::from_tensor(&Tensor::zeros((settings.rank, out_f), DType::F32, &device)?)?;
        let magnitude = match settings.dora {
            true => Some(Var::from_tensor(&row_norms(&linear.weight.to_dense(DType::F32)?)?.to_device(&device)?)?),
            false => None,
        };
        linear.adapter = Some(LoraAdapter {
            a: a.clone(),
            b: b.clone(),
            scale: settings.scale(),
            dropout: settings.dropout,
            dropout_seed: dropout_seed.clone(),
            compute: Default::default(),
            dora: magnitude.clone().map(Dora::new),
        });
        params.push(AdapterParam { layer, module, a, b, magnitude });
    }
    if params.is_empty() {
        return Err(Error::InvalidSetting("no linear matched the LoRA targets and layers".into()));
    }
    Ok(params)
}

/// Attach given adapter matrices (already in our layout: A (in, r), B (r, out)), with DoRA's magnitude (out,)
/// for a DoRA adapter.
pub fn attach_adapter(
    model: &mut Transformer,
    layer: usize,
    module: &str,
    (a, b): (Tensor, Tensor),
    magnitude: Option<Tensor>,
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
            if let Some(mag) = magnitude.as_ref().filter(|mag| mag.dims() != [out_f]) {
                return Err(Error::InvalidSetting(format!(
                    "DoRA magnitude for layer {layer} {module} has shape {:?}, expected ({out_f})",
                    mag.dims()
                )));
            }
            let magnitude = match magnitude {
                Some(mag) => Some(Var::from_tensor(&mag.to_dtype(DType::F32)?.to_device(&device)?)?),
                None => None,
            };
            linear.adapter = Some(LoraAdapter {
                a: a.clone(),
                b: b.clone(),
                scale,
                dropout: 0.0,
                dropout_seed: Default::default(),
                compute: Default::default(),
                dora: magnitude.clone().map(Dora::new),
            });
            return Ok(AdapterParam { layer, module: m, a, b, magnitude });
        }
    }
    Err(Error::InvalidSetting(format!("the model has no layer {layer} module {module}")))
}

/// The active adapters' A and B cast to the compute dtype once for a training pass (one batch's forward and
/// backward), in one batched cast (`ops::cast_many`: on CUDA a launch per 24 matrices instead of one per matrix),
/// where each adapter's product then finds them ([`LoraAdapter::matrices`]). Hold it over the pass only: dropping
/// it empties every adapter's copy, so an optimizer update is never hidden behind a stale one.
pub struct ComputeCopies {
    slots: Vec<crate::engine::model::adapter::ComputeSlot>,
}

impl ComputeCopies {
    /// Copies for `model`'s active adapters in `dtype` (none needed when the adapters already are `dtype`).
    pub fn prepare(model: &Transformer, dtype: DType) -> Result<Self> {
        let linears = model.linears();
        let adapters: Vec<&LoraAdapter> = linears.iter().filter_map(|(_, _, l)| l.active_adapter()).collect();
        if adapters.iter().all(|a| a.a.dtype() == dtype && a.b.dtype() == dtype) {
            return Ok(Self { slots: Vec::new() });
        }
        let sources: Vec<Tensor> =
            adapters.iter().flat_map(|a| [a.a.as_tensor().detach(), a.b.as_tensor().detach()]).collect();
        let cast = crate::engine::ops::cast_many(&sources.iter().collect::<Vec<_>>(), dtype)?;
        let copies = Self { slots: adapters.iter().map(|a| a.compute.clone()).collect() };
        for (slot, pair) in copies.slots.iter().zip(cast.chunks_exact(2)) {
            if let Ok(mut slot) = slot.lock() {
                *slot = Some((pair[0].clone(), pair[1].clone()));
            }
        }
        Ok(copies)
    }
}

impl Drop for ComputeCopies {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Ok(mut slot) = slot.lock() {
                *slot = None;
            }
        }
    }
}

/// Make the dropout masks of optimizer step `step` a pure function of (seed, step): all adapters share one
/// counter, which is reset here and advanced by each mask drawn during the step.
pub fn seed_dropout(model: &Transformer, seed: u64, step: usize) {
    let mixed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (step as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    set_dropout_counter(model, mixed);
}

/// Where the shared dropout-mask counter stands (None without adapters). Gradient checkpointing reads it
/// before a layer's forward and puts it back before recomputing that layer, so the recompute draws the same
/// masks.
pub fn dropout_counter(model: &Transformer) -> Option<u64> {
    let adapter = model.linears().into_iter().find_map(|(_, _, l)| l.adapter.as_ref())?;
    Some(adapter.dropout_seed.load(std::sync::atomic::Ordering::Relaxed))
}

/// Move the shared dropout-mask counter to `value` (see [`dropout_counter`]).
pub fn set_dropout_counter(model: &Transformer, value: u64) {
    if let Some(adapter) = model.linears().iter().find_map(|(_, _, l)| l.adapter.as_ref()) {
        adapter.dropout_seed.store(value, std::sync::atomic::Ordering::Relaxed);
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

/// Empty every DoRA adapter's kept inference factor ([`Dora::factor`]), before its weights change.
pub fn forget_dora_factors(model: &Transformer) {
    for (_, _, linear) in model.linears() {
        if let Some(dora) = linear.adapter.as_ref().and_then(|a| a.dora.as_ref()) {
            dora.forget_factor();
        }
    }
}

/// Remove every adapter.
pub fn detach_adapters(model: &mut Transformer) {
    for (_, _, linear) in model.linears_mut() {
        linear.adapter = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_expand_all_linear_and_keep_model_order() {
        let t: Targets = "v_proj, q_proj,v_proj".parse().unwrap();
        assert_eq!(t.names(), ["q_proj", "v_proj"]);
        assert_eq!("all-linear".parse::<Targets>().unwrap(), Targets::all());
        assert!("q_proj,qproj".parse::<Targets>().unwrap_err().to_string().contains("`qproj`"));
        // run.json holds a list (old files may say "all-linear"); a TOML file may give one string.
        let from_list: Targets = serde_json::from_str(r#"["all-linear"]"#).unwrap();
        assert_eq!(from_list, Targets::all());
        let from_string: Targets = serde_json::from_str(r#""k_proj,o_proj""#).unwrap();
        assert_eq!(serde_json::to_string(&from_string).unwrap(), r#"["k_proj","o_proj"]"#);
        let mut edited = from_string;
        edited.insert(Target::QProj);
        edited.remove(Target::OProj);
        assert_eq!(edited.to_string(), "q_proj, k_proj");
    }

    #[test]
    fn separate_targets_adapt_a_fused_family_projection_and_others_are_refused() {
        let phi3 = [Target::QkvProj, Target::OProj, Target::GateUpProj, Target::DownProj];
        let qv: Targets = "q_proj,v_proj".parse().unwrap();
        assert_eq!(qv.among(&phi3, "phi3 models").unwrap().names(), ["qkv_proj"]);
        let mlp: Targets = "gate_proj,down_proj".parse().unwrap();
        assert_eq!(mlp.among(&phi3, "phi3 models").unwrap().names(), ["gate_up_proj", "down_proj"]);
        assert_eq!(Targets::all().among(&phi3, "phi3 models").unwrap().names().len(), 4);
        // A family with the separate projections keeps them; one without the fused ones refuses them.
        let llama = Target::separate();
        assert_eq!(qv.among(&llama, "llama models").unwrap(), qv);
        let fused: Targets = "qkv_proj".parse().unwrap();
        let err = fused.among(&llama, "llama models").unwrap_err().to_string();
        assert!(err.contains("`qkv_proj` is not a linear of llama models") && err.contains("q_proj, k_proj"), "{err}");
    }
}
