//! The PEFT adapter format: `adapter_config.json` as a typed struct that `peft` reads, the adapter tensors
//! under PEFT's names and layout (DoRA's magnitude as `lora_magnitude_vector`, `use_dora: true`), and loading an
//! adapter onto a model (refusing one that does not match it).

use super::files::{read_safetensors, write_json, write_safetensors};
use super::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use crate::engine::lora::{self, AdapterParam, LoraSettings};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::ModelConfig;
use crate::engine::{Error, Result};
use candle_core::{DType, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// What an adapter folder declares (PEFT field names).
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdapterSummary {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<String>,
    pub use_rslora: bool,
    /// A DoRA adapter (a magnitude vector per linear).
    pub use_dora: bool,
    pub adapted_linears: usize,
}

/// PEFT's tensor name prefix for one adapted linear.
pub fn peft_prefix(layer: usize, module: &str) -> String {
    format!("base_model.model.{}", crate::engine::model::transformer::hf_linear_name(layer, module))
}

/// PEFT's `target_modules`: a list of module names, or one regular expression.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    List(Vec<String>),
    Pattern(String),
}

impl Default for TargetModules {
    fn default() -> Self {
        Self::List(Vec::new())
    }
}

/// `adapter_config.json` in PEFT's format, read and written only here. Fields are in key order, so what we
/// write is byte for byte what PEFT-style sorted JSON looks like; keys PEFT adds that we do not use are
/// ignored on reading, and the ones we refuse are read but never written.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PeftAdapterConfig {
    /// Per-module alphas (read to refuse them).
    #[serde(default, skip_serializing)]
    pub alpha_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    #[serde(default = "bias_none")]
    pub bias: String,
    #[serde(default)]
    pub fan_in_fan_out: bool,
    #[serde(default)]
    pub inference_mode: bool,
    #[serde(default)]
    pub init_lora_weights: serde_json::Value,
    #[serde(default)]
    pub layers_to_transform: Option<Vec<usize>>,
    pub lora_alpha: f64,
    #[serde(default)]
    pub lora_dropout: f64,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default = "peft_type_lora")]
    pub peft_type: String,
    pub r: usize,
    /// Per-module ranks (read to refuse them).
    #[serde(default, skip_serializing)]
    pub rank_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub target_modules: TargetModules,
    #[serde(default)]
    pub task_type: Option<String>,
    /// DoRA adapters: a `lora_magnitude_vector` per adapted linear. Written only when set, so a plain LoRA
    /// adapter's config stays byte for byte what it always was (PEFT reads a missing key as false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub use_dora: bool,
    #[serde(default)]
    pub use_rslora: bool,
}

fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn bias_none() -> String {
    "none".into()
}

fn peft_type_lora() -> String {
    "LORA".into()
}

impl PeftAdapterConfig {
    /// The config of an adapter trained with `settings` on a model of `num_layers` layers; `settings.targets`
    /// as resolved for the model's family (`TrainConfig::for_model`), so `target_modules` names its linears.
    pub fn for_settings(settings: &LoraSettings, num_layers: usize, base_model: &str) -> Result<Self> {
        let layers = settings.layers.map(|_| lora::adapted_layers(num_layers, settings.layers).collect());
        Ok(Self {
            alpha_pattern: Default::default(),
            base_model_name_or_path: Some(base_model.to_string()),
            bias: bias_none(),
            fan_in_fan_out: false,
            inference_mode: true,
            init_lora_weights: serde_json::Value::Bool(true),
            layers_to_transform: layers,
            lora_alpha: settings.alpha,
            // Through the shortest decimal form, so 0.1 stays 0.1 rather than f32's 0.10000000149.
            lora_dropout: settings.dropout.to_string().parse().unwrap_or(0.0),
            modules_to_save: None,
            peft_type: peft_type_lora(),
            r: settings.rank,
            rank_pattern: Default::default(),
            revision: None,
            target_modules: TargetModules::List(settings.targets.names()),
            task_type: Some("CAUSAL_LM".into()),
            use_dora: settings.dora,
            use_rslora: settings.use_rslora,
        })
    }

    /// Read `dir/adapter_config.json` and refuse what we cannot apply exactly.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(ADAPTER_CONFIG);
        if !path.exists() {
            return Err(Error::MissingFile {
                path,
                what: "an adapter folder needs adapter_config.json (PEFT format)".into(),
            });
        }
        let cfg: Self = crate::engine::error::read_json(&path)?;
        let refuse = |message: &str| Err(Error::Adapter { path: path.clone(), message: message.to_string() });
        if cfg.peft_type != "LORA" {
            return refuse(&format!("peft_type `{}` is not supported; only LORA", cfg.peft_type));
        }
        if cfg.r == 0 {
            return refuse("`r` is 0; a LoRA rank is at least 1");
        }
        if cfg.fan_in_fan_out {
            return refuse("fan_in_fan_out adapters are not supported");
        }
        if !cfg.rank_pattern.is_empty() || !cfg.alpha_pattern.is_empty() {
            return refuse("per-module rank_pattern / alpha_pattern are not supported");
        }
        Ok(cfg)
    }

    /// Refuse to resume the checkpoint in `dir` (whose config this is) with LoRA settings that differ from the
    /// ones it was trained with: they cannot change mid-run, and new checkpoints would record them falsely.
    pub fn check_resume(&self, settings: &LoraSettings, num_layers: usize, dir: &Path) -> Result<()> {
        let wanted = Self::for_settings(settings, num_layers, "")?;
        let all_layers = || Some((0..num_layers).collect::<Vec<_>>());
        let layers = |l: &Option<Vec<usize>>| json(&l.clone().or_else(all_layers));
        let differs = [
            ("rank", self.r != wanted.r, self.r.to_string(), wanted.r.to_string()),
            ("alpha", self.lora_alpha != wanted.lora_alpha, self.lora_alpha.to_string(), wanted.lora_alpha.to_string()),
            (
                "targets",
                self.target_modules != wanted.target_modules,
                json(&self.target_modules),
                json(&wanted.target_modules),
            ),
            (
                "layers",
                layers(&self.layers_to_transform) != layers(&wanted.layers_to_transform),
                layers(&self.layers_to_transform),
                layers(&wanted.layers_to_transform),
            ),
            (
                "rslora",
                self.use_rslora != wanted.use_rslora,
                self.use_rslora.to_string(),
                wanted.use_rslora.to_string(),
            ),
            ("dora", self.use_dora != wanted.use_dora, self.use_dora.to_string(), wanted.use_dora.to_string()),
        ];
        match differs.into_iter().find(|(_, differ, _, _)| *differ) {
            None => Ok(()),
            Some((field, _, saved, asked)) => Err(Error::InvalidSetting(format!(
                "{} was trained with LoRA {field} {saved} but the settings say {asked}; LoRA settings cannot change \
                 on resume (learning rate, iterations and save interval can)",
                dir.display()
            ))),
        }
    }

    /// The multiplier of `x A B`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.lora_alpha / (self.r as f64).sqrt()
        } else {
            self.lora_alpha / self.r as f64
        }
    }

    /// Write `dir/adapter_config.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_json(&dir.join(ADAPTER_CONFIG), self)
    }
}

/// PEFT's name for DoRA's magnitude of the linear at `prefix` ([`peft_prefix`]); saved without `.weight`.
pub fn peft_magnitude_name(prefix: &str) -> String {
    format!("{prefix}.lora_magnitude_vector")
}

/// Adapter tensors in PEFT layout: lora_A (r, in), lora_B (out, r), and DoRA's lora_magnitude_vector (out).
pub fn peft_tensors(params: &[AdapterParam]) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for p in params {
        let prefix = peft_prefix(p.layer, p.module);
        out.insert(format!("{prefix}.lora_A.weight"), p.a.as_tensor().t()?.contiguous()?);
        out.insert(format!("{prefix}.lora_B.weight"), p.b.as_tensor().t()?.contiguous()?);
        if let Some(m) = &p.magnitude {
            out.insert(peft_magnitude_name(&prefix), m.as_tensor().clone());
        }
    }
    Ok(out)
}

/// Save a PEFT adapter (config + weights) into `dir` (which must exist).
pub fn save_peft_adapter(dir: &Path, params: &[AdapterParam], config: &PeftAdapterConfig) -> Result<()> {
    write_safetensors(&dir.join(ADAPTER_WEIGHTS), &peft_tensors(params)?)?;
    config.write(dir)
}

/// Attach the adapter saved in `adapter_dir` (ours or PEFT's) to `model`, replacing any adapters it had.
pub fn load_adapter(model: &mut Transformer, adapter_dir: &Path) -> Result<AdapterSummary> {
    load_adapter_params(model, adapter_dir).map(|(summary, _)| summary)
}

/// As [`load_adapter`], also returning the attached parameters (for resuming training). An adapter that does
/// not match the model is refused whole, naming the module at fault; nothing is half attached.
pub fn load_adapter_params(model: &mut Transformer, adapter_dir: &Path) -> Result<(AdapterSummary, Vec<AdapterParam>)> {
    let cfg = PeftAdapterConfig::read(adapter_dir)?;
    let weights_path = adapter_dir.join(ADAPTER_WEIGHTS);
    let tensors = read_safetensors(&weights_path, "adapter weights")?;
    let linears: Vec<(usize, &'static str)> = model.linears().iter().map(|(l, m, _)| (*l, *m)).collect();
    let misfit = |message: String| misfit_error(&weights_path, &cfg, message);
    let pairs = match_adapter_tensors(&linears, &cfg, &tensors).map_err(misfit)?;
    lora::detach_adapters(model);
    let mut params = Vec::new();
    let mut targets = std::collections::BTreeSet::new();
    for (layer, module, a, b, magnitude) in pairs {
        let ab = (a.t()?.contiguous()?, b.t()?.contiguous()?);
        let attached = lora::attach_adapter(model, layer, module, ab, magnitude.cloned(), cfg.scale());
        match attached {
            Ok(param) => params.push(param),
            Err(e) => {
                lora::detach_adapters(model);
                let message = match e {
                    Error::InvalidSetting(message) => message,
                    other => other.to_string(),
                };
                return Err(misfit(message));
            }
        }
        targets.insert(module.to_string());
    }
    Ok((summary_of(&cfg, targets, params.len()), params))
}

/// An adapter that does not fit the model: `message` (what does not fit), and the base it names, the likely
/// cause being an adapter of another model.
fn misfit_error(weights_path: &Path, cfg: &PeftAdapterConfig, message: String) -> Error {
    let named = match cfg.base_model_name_or_path.as_deref().filter(|n| !n.trim().is_empty()) {
        Some(name) => format!(" (its adapter_config.json names `{name}` as its base)"),
        None => String::new(),
    };
    Error::Adapter {
        path: weights_path.to_path_buf(),
        message: format!(
            "{message}; the adapter does not fit this model{named}: was it trained on another base model?"
        ),
    }
}

/// What an adapter read with `cfg` holds: its settings, the modules it adapts, and how many linears.
fn summary_of(
    cfg: &PeftAdapterConfig,
    targets: std::collections::BTreeSet<String>,
    adapted_linears: usize,
) -> AdapterSummary {
    AdapterSummary {
        rank: cfg.r,
        alpha: cfg.lora_alpha,
        targets: targets.into_iter().collect(),
        use_rslora: cfg.use_rslora,
        use_dora: cfg.use_dora,
        adapted_linears,
    }
}

/// One adapted linear found in an adapter file: (layer, module, lora_A (r, in), lora_B (out, r), DoRA's
/// magnitude (out) when the adapter is DoRA).
type AdapterPair<'t> = (usize, &'static str, &'t Tensor, &'t Tensor, Option<&'t Tensor>);

/// An adapter read for a model that is not loaded (a streamed export): its PEFT config, and per adapted linear
/// `(layer, module, lora_A (r, in), lora_B (out, r), DoRA magnitude (out))` in f32.
pub struct AdapterWeights {
    pub config: PeftAdapterConfig,
    pub summary: AdapterSummary,
    pub pairs: Vec<(usize, &'static str, Tensor, Tensor, Option<Tensor>)>,
}

/// Read the adapter in `adapter_dir` for a model of `config` without loading the model: refused as
/// [`load_adapter`] refuses it (a module the model lacks, a missing half, a wrong rank, a promised module
/// absent), and when a weight's shape is not the model's linear's (an adapter trained on another base).
pub fn read_adapter_for(config: &ModelConfig, adapter_dir: &Path) -> Result<AdapterWeights> {
    let cfg = PeftAdapterConfig::read(adapter_dir)?;
    let weights_path = adapter_dir.join(ADAPTER_WEIGHTS);
    let tensors = read_safetensors(&weights_path, "adapter weights")?;
    let refuse = |message: String| misfit_error(&weights_path, &cfg, message);
    let linears: Vec<(usize, &'static str)> = (0..config.num_layers)
        .flat_map(|l| crate::engine::lora::Target::of_model(config).into_iter().map(move |t| (l, t.name())))
        .collect();
    let pairs = match_adapter_tensors(&linears, &cfg, &tensors).map_err(refuse)?;
    let mut out = Vec::with_capacity(pairs.len());
    let mut targets = std::collections::BTreeSet::new();
    for (layer, module, a, b, magnitude) in pairs {
        let (in_f, out_f) = config.linear_shape(module).unwrap_or_default();
        let r = cfg.r;
        if let Some(m) = magnitude.filter(|m| m.dims() != [out_f]) {
            return Err(refuse(format!(
                "DoRA magnitude for layer {layer} {module} has shape {:?}, expected ({out_f}) for this model",
                m.dims()
            )));
        }
        if a.dims() != [r, in_f] || b.dims() != [out_f, r] {
            return Err(refuse(format!(
                "adapter for layer {layer} {module} has shapes A {:?} B {:?}, expected A ({r}, {in_f}) B ({out_f}, {r}) \
                 for this model",
                a.dims(),
                b.dims()
            )));
        }
        let magnitude = magnitude.map(|m| m.to_dtype(DType::F32)).transpose()?;
        out.push((layer, module, a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?, magnitude));
        targets.insert(module.to_string());
    }
    let summary = summary_of(&cfg, targets, out.len());
    Ok(AdapterWeights { config: cfg, summary, pairs: out })
}

/// Read the adapter in `adapter_dir` when its base model is not at hand (an inspection without the base): the
/// same pairing and refusals as [`read_adapter_for`] over every projection name of every family in the layers its
/// tensor names mention, and A (r, in) and B (out, r) checked against each other instead of against a model.
pub fn read_adapter_alone(adapter_dir: &Path) -> Result<AdapterWeights> {
    let cfg = PeftAdapterConfig::read(adapter_dir)?;
    let weights_path = adapter_dir.join(ADAPTER_WEIGHTS);
    let tensors = read_safetensors(&weights_path, "adapter weights")?;
    let refuse = |message: String| Error::Adapter { path: weights_path.clone(), message };
    let layer_of = |name: &str| name.split("layers.").nth(1)?.split('.').next()?.parse::<usize>().ok();
    let layers = tensors.keys().filter_map(|n| layer_of(n)).max().map_or(0, |l| l + 1);
    let linears: Vec<(usize, &'static str)> =
        (0..layers).flat_map(|l| lora::Target::ALL.into_iter().map(move |t| (l, t.name()))).collect();
    let pairs = match_adapter_tensors(&linears, &cfg, &tensors).map_err(refuse)?;
    let mut out = Vec::with_capacity(pairs.len());
    let mut targets = std::collections::BTreeSet::new();
    for (layer, module, a, b, magnitude) in pairs {
        let out_f = b.dim(0)?;
        if b.dims() != [out_f, cfg.r] || a.rank() != 2 || magnitude.is_some_and(|m| m.dims() != [out_f]) {
            return Err(refuse(format!(
                "adapter for layer {layer} {module} has shapes A {:?} B {:?}{}, which do not make a rank-{} update \
                 (A is (r, in), B is (out, r), a DoRA magnitude (out))",
                a.dims(),
                b.dims(),
                magnitude.map(|m| format!(" magnitude {:?}", m.dims())).unwrap_or_default(),
                cfg.r
            )));
        }
        let magnitude = magnitude.map(|m| m.to_dtype(DType::F32)).transpose()?;
        out.push((layer, module, a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?, magnitude));
        targets.insert(module.to_string());
    }
    let summary = summary_of(&cfg, targets, out.len());
    Ok(AdapterWeights { config: cfg, summary, pairs: out })
}

/// Pair every tensor of an adapter file with a linear of `model`. Refuses, naming the module: a tensor for a
/// module the model lacks, a lora_A without its lora_B (or the reverse), a rank other than `r`, a DoRA magnitude
/// missing (`use_dora`) or unexpected (not `use_dora`), and a module the config's `target_modules` /
/// `layers_to_transform` promise but the file lacks.
fn match_adapter_tensors<'t>(
    linears: &[(usize, &'static str)],
    cfg: &PeftAdapterConfig,
    tensors: &'t HashMap<String, Tensor>,
) -> std::result::Result<Vec<AdapterPair<'t>>, String> {
    let by_prefix: HashMap<String, (usize, &'static str)> =
        linears.iter().map(|&(l, m)| (peft_prefix(l, m), (l, m))).collect();
    let mut found: std::collections::BTreeMap<(usize, &'static str), [Option<&Tensor>; 3]> = Default::default();
    for (name, tensor) in tensors {
        let stem = name.strip_suffix(".default.weight").or_else(|| name.strip_suffix(".weight")).unwrap_or(name);
        let stem = stem.strip_suffix(".default").unwrap_or(stem);
        let (prefix, which) = match ["lora_A", "lora_B", "lora_magnitude_vector"]
            .iter()
            .enumerate()
            .find_map(|(i, kind)| stem.strip_suffix(kind).and_then(|p| p.strip_suffix('.')).map(|p| (p, i)))
        {
            Some(found) => found,
            None => {
                return Err(format!(
                    "tensor `{name}` is not a lora_A / lora_B / lora_magnitude_vector weight; only LoRA and DoRA \
                     adapters load"
                ))
            }
        };
        let Some(&key) = by_prefix.get(prefix) else {
            return Err(format!("tensor `{name}` is for `{prefix}`, a module this model does not have"));
        };
        found.entry(key).or_default()[which] = Some(tensor);
    }
    if found.is_empty() {
        return Err("no lora_A/lora_B tensor matches this model's layers (is it an adapter for another model?)".into());
    }
    let mut pairs = Vec::new();
    for ((layer, module), [a, b, magnitude]) in found {
        let prefix = peft_prefix(layer, module);
        let (Some(a), Some(b)) = (a, b) else {
            let missing = if a.is_none() { "lora_A" } else { "lora_B" };
            return Err(format!("`{prefix}` has no {missing} weight"));
        };
        match (cfg.use_dora, magnitude.is_some()) {
            (true, false) => {
                return Err(format!("`{prefix}` has no lora_magnitude_vector but adapter_config.json says use_dora"))
            }
            (false, true) => {
                return Err(format!(
                    "`{prefix}` has a lora_magnitude_vector (a DoRA adapter) but adapter_config.json does not say \
                     use_dora: true"
                ))
            }
            _ => {}
        }
        let rank = a.dim(0).map_err(|e| e.to_string())?;
        if rank != cfg.r {
            return Err(format!("{prefix}.lora_A has rank {rank} but the config says r = {}", cfg.r));
        }
        pairs.push((layer, module, a, b, magnitude));
    }
    if let TargetModules::List(targets) = &cfg.target_modules {
        let wanted = |l: usize| cfg.layers_to_transform.as_ref().is_none_or(|ls| ls.contains(&l));
        let missing = linears
            .iter()
            .filter(|(l, m)| wanted(*l) && targets.iter().any(|t| t == m))
            .find(|(l, m)| !pairs.iter().any(|(pl, pm, ..)| pl == l && pm == m));
        if let Some(&(l, m)) = missing {
            return Err(format!(
                "`{}` is in target_modules but the file has no weights for it (a partial or mismatched adapter)",
                peft_prefix(l, m)
            ));
        }
    }
    Ok(pairs)
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoints and run folders
