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

/// One saved checkpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckpointInfo {
    pub step: usize,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub saved_unix_secs: u64,
}

/// One run folder.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunInfo {
    pub name: String,
    pub dir: PathBuf,
    pub config: Option<TrainConfig>,
    pub started_unix_secs: Option<u64>,
    pub events: Vec<TrainEvent>,
    pub checkpoints: Vec<CheckpointInfo>,
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
        return Err(Error::io(path, e));
    }
    Ok(())
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Training(e.to_string()))?;
    write_atomic(path, text.as_bytes())
}

fn write_safetensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let cpu: HashMap<String, Tensor> =
        tensors.iter().map(|(k, t)| Ok((k.clone(), t.to_device(&Device::Cpu)?))).collect::<Result<_>>()?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = candle_core::safetensors::save(&cpu, &tmp)
        .map_err(|e| Error::Training(format!("writing {}: {e}", path.display())))
        .and_then(|_| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)))
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
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| Error::io(path, e))?;
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

/// PEFT's adapter_config.json for these settings.
pub fn peft_config_json(settings: &LoraSettings, num_layers: usize, base_model: &Path) -> Result<serde_json::Value> {
    let targets = settings.resolved_targets()?;
    let layers: Option<Vec<usize>> =
        settings.layers.map(|_| lora::adapted_layers(num_layers, settings.layers).collect());
    Ok(serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model.to_string_lossy(),
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": targets,
        "use_rslora": settings.use_rslora,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "layers_to_transform": layers,
        "modules_to_save": null,
        "revision": null,
    }))
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
pub fn save_peft_adapter(dir: &Path, params: &[AdapterParam], config: &serde_json::Value) -> Result<()> {
    write_safetensors(&dir.join(ADAPTER_WEIGHTS), &peft_tensors(params)?)?;
    write_json(&dir.join(ADAPTER_CONFIG), config)
}

/// Attach the adapter saved in `adapter_dir` (ours or PEFT's) to `model`, replacing any adapters it had.
pub fn load_adapter(model: &mut Transformer, adapter_dir: &Path) -> Result<AdapterSummary> {
    load_adapter_params(model, adapter_dir).map(|(summary, _)| summary)
}

/// As [`load_adapter`], also returning the attached parameters (for resuming training).
pub fn load_adapter_params(model: &mut Transformer, adapter_dir: &Path) -> Result<(AdapterSummary, Vec<AdapterParam>)> {
    let config_path = adapter_dir.join(ADAPTER_CONFIG);
    if !config_path.exists() {
        return Err(Error::MissingFile {
            path: config_path,
            what: "an adapter folder needs adapter_config.json (PEFT format)".into(),
        });
    }
    let cfg: serde_json::Value = crate::engine::error::read_json(&config_path)?;
    let bad = |message: String| Error::Adapter { path: config_path.clone(), message };
    if let Some(t) = cfg.get("peft_type").and_then(|v| v.as_str()) {
        if t != "LORA" {
            return Err(bad(format!("peft_type `{t}` is not supported; only LORA")));
        }
    }
    let rank = cfg.get("r").and_then(|v| v.as_u64()).ok_or_else(|| bad("missing `r`".into()))? as usize;
    let alpha = cfg.get("lora_alpha").and_then(|v| v.as_f64()).ok_or_else(|| bad("missing `lora_alpha`".into()))?;
    let use_rslora = cfg.get("use_rslora").and_then(|v| v.as_bool()).unwrap_or(false);
    if cfg.get("fan_in_fan_out").and_then(|v| v.as_bool()).unwrap_or(false) {
        return Err(bad("fan_in_fan_out adapters are not supported".into()));
    }
    let has_patterns = ["rank_pattern", "alpha_pattern"]
        .iter()
        .any(|k| cfg.get(*k).and_then(|v| v.as_object()).map(|o| !o.is_empty()).unwrap_or(false));
    if has_patterns {
        return Err(bad("per-module rank_pattern / alpha_pattern are not supported".into()));
    }
    let scale = if use_rslora { alpha / (rank as f64).sqrt() } else { alpha / rank as f64 };
    let weights_path = adapter_dir.join(ADAPTER_WEIGHTS);
    let tensors = read_safetensors(&weights_path)?;
    lora::detach_adapters(model);
    let mut params = Vec::new();
    let mut targets = std::collections::BTreeSet::new();
    let linears: Vec<(usize, &'static str)> = model.linears().iter().map(|(l, m, _)| (*l, *m)).collect();
    for (layer, module) in linears {
        let prefix = peft_prefix(layer, module);
        let find = |which: &str| {
            tensors
                .get(&format!("{prefix}.{which}.weight"))
                .or_else(|| tensors.get(&format!("{prefix}.{which}.default.weight")))
        };
        let (Some(a), Some(b)) = (find("lora_A"), find("lora_B")) else { continue };
        if a.dim(0)? != rank {
            return Err(Error::Adapter {
                path: weights_path.clone(),
                message: format!("{prefix}.lora_A has rank {} but the config says r = {rank}", a.dim(0)?),
            });
        }
        let param = lora::attach_adapter(model, layer, module, a.t()?.contiguous()?, b.t()?.contiguous()?, scale)
            .map_err(|e| Error::Adapter { path: weights_path.clone(), message: e.to_string() })?;
        targets.insert(module.to_string());
        params.push(param);
    }
    if params.is_empty() {
        return Err(Error::Adapter {
            path: weights_path,
            message: "no lora_A/lora_B tensor matches this model's layers (is it an adapter for another model?)".into(),
        });
    }
    Ok((
        AdapterSummary {
            rank,
            alpha,
            targets: targets.into_iter().collect(),
            use_rslora,
            adapted_linears: params.len(),
        },
        params,
    ))
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoints and run folders

/// Save a full checkpoint (adapter, optimizer moments, trainer state) as `run_dir/checkpoint-<step>/`.
/// Built in a `.partial` folder and renamed into place, so an interrupted save leaves no half checkpoint.
pub fn save_checkpoint(
    run_dir: &Path,
    params: &[AdapterParam],
    adapter_config: &serde_json::Value,
    optimizer_state: &HashMap<String, Tensor>,
    state: &TrainerState,
) -> Result<PathBuf> {
    let final_dir = run_dir.join(format!("checkpoint-{}", state.step));
    let partial = run_dir.join(format!(".checkpoint-{}.partial", state.step));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(|e| Error::io(&partial, e))?;
    let written = (|| {
        save_peft_adapter(&partial, params, adapter_config)?;
        write_safetensors(&partial.join(OPTIMIZER_STATE), optimizer_state)?;
        write_json(&partial.join(TRAINER_STATE), state)?;
        if final_dir.exists() {
            let old = run_dir.join(format!(".checkpoint-{}.old", state.step));
            let _ = std::fs::remove_dir_all(&old);
            std::fs::rename(&final_dir, &old).map_err(|e| Error::io(&final_dir, e))?;
            std::fs::rename(&partial, &final_dir).map_err(|e| Error::io(&final_dir, e))?;
            let _ = std::fs::remove_dir_all(&old);
        } else {
            std::fs::rename(&partial, &final_dir).map_err(|e| Error::io(&final_dir, e))?;
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
    let line = serde_json::to_string(event).map_err(|e| Error::Training(e.to_string()))?;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::io(&path, e))?;
    writeln!(f, "{line}").map_err(|e| Error::io(&path, e))
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
        .map(|e| {
            let dir = e.path();
            let run: Option<serde_json::Value> = crate::engine::error::read_json(&dir.join(RUN_CONFIG)).ok();
            RunInfo {
                name: e.file_name().to_string_lossy().to_string(),
                config: run.as_ref().and_then(|r| r.get("config")).and_then(|c| serde_json::from_value(c.clone()).ok()),
                started_unix_secs: run.as_ref().and_then(|r| r.get("started_unix_secs")).and_then(|v| v.as_u64()),
                events: read_metrics(&dir),
                checkpoints: list_checkpoints(&dir),
                dir,
            }
        })
        .collect();
    runs.sort_by(|a, b| b.started_unix_secs.cmp(&a.started_unix_secs).then(a.name.cmp(&b.name)));
    Ok(runs)
}

/// Delete one checkpoint folder (it must look like one).
pub fn delete_checkpoint(path: &Path) -> Result<()> {
    if !path.join(ADAPTER_CONFIG).exists() {
        return Err(Error::InvalidSetting(format!("{} is not a checkpoint folder", path.display())));
    }
    std::fs::remove_dir_all(path).map_err(|e| Error::io(path, e))
}

/// Export `checkpoint` to `out` in `format`; `base_model` is needed for `Merged`.
pub fn export_checkpoint(checkpoint: &Path, format: ExportFormat, out: &Path, base_model: &Path) -> Result<PathBuf> {
    crate::engine::export::export(checkpoint, format, out, base_model)
}
