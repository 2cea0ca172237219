//! Run folders and adapter I/O: `runs/<name>/{run.json, metrics.jsonl, checkpoint-<step>/}`, PEFT and mlx-lm
//! adapter formats, trainer state, merged-model export. Every write is atomic (temp file/folder + rename),
//! so a crash or a full disk mid-save never corrupts an earlier checkpoint.

use crate::engine::data::DataCursor;
use crate::engine::lora::{self, AdapterParam};
use crate::engine::model::transformer::Transformer;
use crate::engine::train::{LoraSettings, TrainConfig, TrainEvent};
use crate::engine::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
pub const TRAINER_STATE: &str = "trainer_state.json";
pub const OPTIMIZER_STATE: &str = "optimizer.safetensors";
pub const RUN_CONFIG: &str = "run.json";
pub const METRICS: &str = "metrics.jsonl";

/// One saved checkpoint, as the run browser and the CLI list it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointInfo {
    pub step: usize,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub saved_unix_secs: u64,
}

/// One run folder reduced to what a run browser shows: its manifest, loss curves from `metrics.jsonl`, how it
/// ended, and its checkpoints.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunInfo {
    pub name: String,
    pub dir: PathBuf,
    /// None when run.json is missing or unreadable.
    pub config: Option<TrainConfig>,
    pub started_unix_secs: Option<u64>,
    /// (step, loss).
    pub train_loss: Vec<[f64; 2]>,
    /// (step, validation loss).
    pub val_loss: Vec<[f64; 2]>,
    pub total_steps: Option<usize>,
    pub trainable_params: Option<usize>,
    /// "finished", "stopped", "failed: ..." or "incomplete".
    pub status: String,
    pub checkpoints: Vec<CheckpointInfo>,
}

/// The version [`RunManifest::write`] writes. Files from releases before versioning have no `version` field
/// and read as version 0; their layout is the same.
pub const RUN_MANIFEST_VERSION: u32 = 1;

/// `run.json`: what a run was started with. Read and written only here.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunManifest {
    #[serde(default)]
    pub version: u32,
    pub name: String,
    pub config: TrainConfig,
    pub model: PathBuf,
    pub dataset: PathBuf,
    #[serde(default)]
    pub started_unix_secs: u64,
    /// The metal-candle release that started the run.
    #[serde(default)]
    pub metal_candle_version: String,
}

impl RunManifest {
    /// The manifest of a run starting now.
    pub fn new(name: &str, config: &TrainConfig) -> Self {
        Self {
            version: RUN_MANIFEST_VERSION,
            name: name.to_string(),
            config: config.clone(),
            model: config.model.clone(),
            dataset: config.data.clone(),
            started_unix_secs: unix_now(),
            metal_candle_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The run.json of `run_dir`. A manifest from a newer release is refused rather than half read.
    pub fn read(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(RUN_CONFIG);
        let manifest: Self = crate::engine::error::read_json(&path)?;
        if manifest.version > RUN_MANIFEST_VERSION {
            return Err(Error::Json {
                path,
                message: format!(
                    "version {} was written by a newer metal-candle (this one reads up to {RUN_MANIFEST_VERSION}); \
                     upgrade to open this run",
                    manifest.version
                ),
            });
        }
        Ok(manifest)
    }

    /// The manifest of the run a checkpoint folder belongs to (its parent folder).
    pub fn of_checkpoint(checkpoint: &Path) -> Result<Self> {
        let run_dir = checkpoint.parent().unwrap_or(Path::new("."));
        Self::read(run_dir)
    }

    /// Write `run_dir/run.json` atomically.
    pub fn write(&self, run_dir: &Path) -> Result<()> {
        write_json(&run_dir.join(RUN_CONFIG), self)
    }
}

/// Export targets for a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExportFormat {
    /// adapter_config.json + adapter_model.safetensors (a copy of the checkpoint's adapter).
    Peft,
    /// mlx-lm's adapters.safetensors + adapter_config.json.
    MlxLm,
    /// A full Hugging Face model folder with the adapter merged into the weights.
    Merged,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "peft" => Ok(Self::Peft),
            "mlx" | "mlx-lm" => Ok(Self::MlxLm),
            "merged" => Ok(Self::Merged),
            other => Err(format!("unknown export format `{other}`; use peft, mlx-lm or merged")),
        }
    }
}

/// What an adapter folder declares (PEFT field names).
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdapterSummary {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<String>,
    pub use_rslora: bool,
    pub adapted_linears: usize,
}

/// Where the trainer was when it saved, enough to continue exactly.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrainerState {
    pub step: usize,
    pub total_steps: usize,
    pub cursor: DataCursor,
    pub seed: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub trained_tokens: usize,
    pub elapsed_secs: f64,
    pub saved_unix_secs: u64,
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------------------
// Atomic file writes

/// Write `bytes` to `path` via a temporary file in the same folder and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::write(path, e));
    }
    Ok(())
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::write(path, e))?;
    write_atomic(path, text.as_bytes())
}

fn write_safetensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let cpu: HashMap<String, Tensor> =
        tensors.iter().map(|(k, t)| Ok((k.clone(), t.to_device(&Device::Cpu)?))).collect::<Result<_>>()?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = candle_core::safetensors::save(&cpu, &tmp)
        .map_err(|e| Error::write(path, e))
        .and_then(|_| std::fs::rename(&tmp, path).map_err(|e| Error::write(path, e)))
        .and_then(|_| make_world_readable(path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// safetensors writes through an owner-only temporary file; give saved weights the usual 0644 so other
/// tools (and other users of a shared machine) can read them.
pub fn make_world_readable(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| Error::write(path, e))?;
    }
    Ok(())
}

fn read_safetensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    if !path.exists() {
        return Err(Error::MissingFile { path: path.to_path_buf(), what: "adapter weights".into() });
    }
    candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|e| Error::CorruptWeights { path: path.to_path_buf(), message: e.to_string() })
}

// ---------------------------------------------------------------------------------------------------------
// PEFT adapter format

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
    /// DoRA adapters (read to refuse them).
    #[serde(default, skip_serializing)]
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
    /// The config of an adapter trained with `settings` on a model of `num_layers` layers.
    pub fn for_settings(settings: &LoraSettings, num_layers: usize, base_model: &Path) -> Result<Self> {
        let layers = settings.layers.map(|_| lora::adapted_layers(num_layers, settings.layers).collect());
        Ok(Self {
            alpha_pattern: Default::default(),
            base_model_name_or_path: Some(base_model.to_string_lossy().into_owned()),
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
            target_modules: TargetModules::List(settings.resolved_targets()?),
            task_type: Some("CAUSAL_LM".into()),
            use_dora: false,
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
        if cfg.use_dora {
            return refuse("DoRA adapters (use_dora) are not supported");
        }
        Ok(cfg)
    }

    /// Refuse to resume the checkpoint in `dir` (whose config this is) with LoRA settings that differ from the
    /// ones it was trained with: they cannot change mid-run, and new checkpoints would record them falsely.
    pub fn check_resume(&self, settings: &LoraSettings, num_layers: usize, dir: &Path) -> Result<()> {
        let wanted = Self::for_settings(settings, num_layers, Path::new(""))?;
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

/// Adapter tensors in PEFT layout: lora_A (r, in), lora_B (out, r).
pub fn peft_tensors(params: &[AdapterParam]) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for p in params {
        let prefix = peft_prefix(p.layer, p.module);
        out.insert(format!("{prefix}.lora_A.weight"), p.a.as_tensor().t()?.contiguous()?);
        out.insert(format!("{prefix}.lora_B.weight"), p.b.as_tensor().t()?.contiguous()?);
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
    let tensors = read_safetensors(&weights_path)?;
    let pairs = match_adapter_tensors(model, &cfg, &tensors)
        .map_err(|message| Error::Adapter { path: weights_path.clone(), message })?;
    lora::detach_adapters(model);
    let mut params = Vec::new();
    let mut targets = std::collections::BTreeSet::new();
    for (layer, module, a, b) in pairs {
        let attached =
            lora::attach_adapter(model, layer, module, a.t()?.contiguous()?, b.t()?.contiguous()?, cfg.scale());
        match attached {
            Ok(param) => params.push(param),
            Err(e) => {
                lora::detach_adapters(model);
                return Err(Error::Adapter { path: weights_path, message: e.to_string() });
            }
        }
        targets.insert(module.to_string());
    }
    let summary = AdapterSummary {
        rank: cfg.r,
        alpha: cfg.lora_alpha,
        targets: targets.into_iter().collect(),
        use_rslora: cfg.use_rslora,
        adapted_linears: params.len(),
    };
    Ok((summary, params))
}

/// One adapted linear found in an adapter file: (layer, module, lora_A (r, in), lora_B (out, r)).
type AdapterPair<'t> = (usize, &'static str, &'t Tensor, &'t Tensor);

/// Pair every tensor of an adapter file with a linear of `model`. Refuses, naming the module: a tensor for a
/// module the model lacks, a lora_A without its lora_B (or the reverse), a rank other than `r`, and a module
/// the config's `target_modules` / `layers_to_transform` promise but the file lacks.
fn match_adapter_tensors<'t>(
    model: &Transformer,
    cfg: &PeftAdapterConfig,
    tensors: &'t HashMap<String, Tensor>,
) -> std::result::Result<Vec<AdapterPair<'t>>, String> {
    let linears: Vec<(usize, &'static str)> = model.linears().iter().map(|(l, m, _)| (*l, *m)).collect();
    let by_prefix: HashMap<String, (usize, &'static str)> =
        linears.iter().map(|&(l, m)| (peft_prefix(l, m), (l, m))).collect();
    let mut found: std::collections::BTreeMap<(usize, &'static str), [Option<&Tensor>; 2]> = Default::default();
    for (name, tensor) in tensors {
        let stem = name.strip_suffix(".default.weight").or_else(|| name.strip_suffix(".weight")).unwrap_or(name);
        let (prefix, which) = match (stem.strip_suffix(".lora_A"), stem.strip_suffix(".lora_B")) {
            (Some(p), _) => (p, 0),
            (_, Some(p)) => (p, 1),
            _ => return Err(format!("tensor `{name}` is not a lora_A / lora_B weight; only plain LoRA adapters load")),
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
    for ((layer, module), [a, b]) in found {
        let prefix = peft_prefix(layer, module);
        let (Some(a), Some(b)) = (a, b) else {
            let missing = if a.is_none() { "lora_A" } else { "lora_B" };
            return Err(format!("`{prefix}` has no {missing} weight"));
        };
        let rank = a.dim(0).map_err(|e| e.to_string())?;
        if rank != cfg.r {
            return Err(format!("{prefix}.lora_A has rank {rank} but the config says r = {}", cfg.r));
        }
        pairs.push((layer, module, a, b));
    }
    if let TargetModules::List(targets) = &cfg.target_modules {
        let wanted = |l: usize| cfg.layers_to_transform.as_ref().is_none_or(|ls| ls.contains(&l));
        let missing = linears
            .iter()
            .filter(|(l, m)| wanted(*l) && targets.iter().any(|t| t == m))
            .find(|(l, m)| !pairs.iter().any(|(pl, pm, _, _)| pl == l && pm == m));
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

/// Save a full checkpoint (adapter, optimizer moments, trainer state) as `run_dir/checkpoint-<step>/`.
/// Built in a `.partial` folder and renamed into place, so an interrupted save leaves no half checkpoint.
pub fn save_checkpoint(
    run_dir: &Path,
    params: &[AdapterParam],
    adapter_config: &PeftAdapterConfig,
    optimizer_state: &HashMap<String, Tensor>,
    state: &TrainerState,
) -> Result<PathBuf> {
    let final_dir = run_dir.join(format!("checkpoint-{}", state.step));
    let partial = run_dir.join(format!(".checkpoint-{}.partial", state.step));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(|e| Error::write(&partial, e))?;
    let written = (|| {
        save_peft_adapter(&partial, params, adapter_config)?;
        write_safetensors(&partial.join(OPTIMIZER_STATE), optimizer_state)?;
        write_json(&partial.join(TRAINER_STATE), state)?;
        if final_dir.exists() {
            let old = run_dir.join(format!(".checkpoint-{}.old", state.step));
            let _ = std::fs::remove_dir_all(&old);
            std::fs::rename(&final_dir, &old).map_err(|e| Error::write(&final_dir, e))?;
            std::fs::rename(&partial, &final_dir).map_err(|e| Error::write(&final_dir, e))?;
            let _ = std::fs::remove_dir_all(&old);
        } else {
            std::fs::rename(&partial, &final_dir).map_err(|e| Error::write(&final_dir, e))?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e);
    }
    Ok(final_dir)
}

/// Read a checkpoint's trainer state and optimizer moments.
pub fn load_trainer_state(checkpoint: &Path) -> Result<(TrainerState, HashMap<String, Tensor>)> {
    let state: TrainerState = crate::engine::error::read_json(&checkpoint.join(TRAINER_STATE))?;
    let optimizer = read_safetensors(&checkpoint.join(OPTIMIZER_STATE))?;
    Ok((state, optimizer))
}

/// Append one event to `metrics.jsonl`.
pub fn append_metric(run_dir: &Path, event: &TrainEvent) -> Result<()> {
    use std::io::Write;
    let path = run_dir.join(METRICS);
    let line = serde_json::to_string(event).map_err(|e| Error::write(&path, e))?;
    let mut f =
        std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::write(&path, e))?;
    writeln!(f, "{line}").map_err(|e| Error::write(&path, e))
}

/// Every event in a run's `metrics.jsonl` (unreadable lines are skipped).
pub fn read_metrics(run_dir: &Path) -> Vec<TrainEvent> {
    std::fs::read_to_string(run_dir.join(METRICS))
        .map(|text| text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
        .unwrap_or_default()
}

/// On resume: keep only events up to `step`, so the curve continues instead of repeating.
pub fn truncate_metrics(run_dir: &Path, step: usize) -> Result<()> {
    let kept: Vec<String> = read_metrics(run_dir)
        .into_iter()
        .filter(|e| event_step(e).map(|s| s <= step).unwrap_or(true))
        .filter(|e| !matches!(e, TrainEvent::Finished { .. } | TrainEvent::Failed { .. }))
        .filter_map(|e| serde_json::to_string(&e).ok())
        .collect();
    let mut text = kept.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    write_atomic(&run_dir.join(METRICS), text.as_bytes())
}

/// The step an event belongs to (None for events without one).
pub fn event_step(e: &TrainEvent) -> Option<usize> {
    match e {
        TrainEvent::Started { start_step, .. } => Some(*start_step),
        TrainEvent::Step { step, .. }
        | TrainEvent::Eval { step, .. }
        | TrainEvent::CheckpointSaved { step, .. }
        | TrainEvent::Paused { step }
        | TrainEvent::Resumed { step }
        | TrainEvent::Finished { step, .. }
        | TrainEvent::Failed { step, .. } => Some(*step),
    }
}

fn folder_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// The checkpoints of one run, by step.
pub fn list_checkpoints(run_dir: &Path) -> Vec<CheckpointInfo> {
    let mut out: Vec<CheckpointInfo> = std::fs::read_dir(run_dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    let step: usize = name.strip_prefix("checkpoint-")?.parse().ok()?;
                    let path = e.path();
                    if !path.join(ADAPTER_WEIGHTS).exists() {
                        return None;
                    }
                    let state: Option<TrainerState> = crate::engine::error::read_json(&path.join(TRAINER_STATE)).ok();
                    let mtime = e
                        .metadata()
                        .ok()
                        .and_then(|m| m.modified().ok())
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    Some(CheckpointInfo {
                        step,
                        size_bytes: folder_size(&path),
                        train_loss: state.as_ref().and_then(|s| s.train_loss),
                        val_loss: state.as_ref().and_then(|s| s.val_loss),
                        saved_unix_secs: state.map(|s| s.saved_unix_secs).unwrap_or(mtime),
                        path,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|c| c.step);
    out
}

/// All runs under `runs_dir`, newest first. A missing folder is an empty list.
pub fn list_runs(runs_dir: &Path) -> Result<Vec<RunInfo>> {
    let Ok(entries) = std::fs::read_dir(runs_dir) else { return Ok(Vec::new()) };
    let mut runs: Vec<RunInfo> = entries
        .flatten()
        .filter(|e| e.path().join(RUN_CONFIG).exists())
        .map(|e| run_info(e.file_name().to_string_lossy().to_string(), e.path()))
        .collect();
    runs.sort_by(|a, b| b.started_unix_secs.cmp(&a.started_unix_secs).then(a.name.cmp(&b.name)));
    Ok(runs)
}

/// One run folder: its manifest (if readable), curves and end state from `metrics.jsonl`, its checkpoints.
fn run_info(name: String, dir: PathBuf) -> RunInfo {
    let manifest = RunManifest::read(&dir).ok();
    let mut info = RunInfo {
        name,
        config: manifest.as_ref().map(|m| m.config.clone()),
        started_unix_secs: manifest.map(|m| m.started_unix_secs),
        train_loss: Vec::new(),
        val_loss: Vec::new(),
        total_steps: None,
        trainable_params: None,
        status: "incomplete".into(),
        checkpoints: list_checkpoints(&dir),
        dir,
    };
    for e in read_metrics(&info.dir) {
        match e {
            TrainEvent::Started { total_steps, trainable_params, .. } => {
                info.total_steps = Some(total_steps);
                info.trainable_params = Some(trainable_params);
            }
            TrainEvent::Step { step, loss, .. } => info.train_loss.push([step as f64, loss]),
            TrainEvent::Eval { step, val_loss, .. } => info.val_loss.push([step as f64, val_loss]),
            TrainEvent::Finished { stopped_early, .. } => {
                info.status = if stopped_early { "stopped".into() } else { "finished".into() };
            }
            TrainEvent::Failed { message, .. } => info.status = format!("failed: {message}"),
            _ => {}
        }
    }
    info
}

/// Delete one checkpoint folder (it must look like one).
pub fn delete_checkpoint(path: &Path) -> Result<()> {
    if !path.join(ADAPTER_CONFIG).exists() {
        return Err(Error::InvalidSetting(format!("{} is not a checkpoint folder", path.display())));
    }
    std::fs::remove_dir_all(path).map_err(|e| Error::write(path, e))
}

/// Export `checkpoint` to `out` in `format`; `base_model` is needed for `Merged`.
pub fn export_checkpoint(checkpoint: &Path, format: ExportFormat, out: &Path, base_model: &Path) -> Result<PathBuf> {
    crate::engine::export::export(checkpoint, format, out, base_model)
}
