//! The frozen model an adapter is measured against: which one (named, or the one its run recorded, or the one
//! its adapter_config.json names), and each adapted linear's weight norms read from it one tensor at a time.

use crate::engine::checkpoint::PeftAdapterConfig;
use crate::engine::model::base_tensors::BaseTensors;
use crate::engine::model::transformer::hf_linear_name;
use crate::engine::model::ModelConfig;
use crate::engine::train::run_folder::{run_dir_of_checkpoint, RunManifest, RUN_CONFIG};
use crate::engine::Result;
use std::path::{Path, PathBuf};

/// The base an X-ray measures against, or why there is none here.
#[derive(Debug, Clone, PartialEq)]
pub enum BaseChoice {
    Found(PathBuf),
    Missing(String),
}

/// The base model for the adapter in `ckpt`: `named` when given (`--base`), else the model its run's run.json
/// recorded (a checkpoint of ours), else the `base_model_name_or_path` of its adapter_config.json when that is a
/// folder or file here (as written, or relative to the adapter folder, as PEFT adapters made next to their base
/// write it). Never downloads: a Hub id that is not a local path is [`BaseChoice::Missing`], with what to pass.
pub fn find_base(ckpt: &Path, named: Option<&Path>) -> BaseChoice {
    if let Some(path) = named {
        return BaseChoice::Found(path.to_path_buf());
    }
    let run_dir = run_dir_of_checkpoint(ckpt);
    if run_dir.join(RUN_CONFIG).exists() {
        if let Ok(manifest) = RunManifest::read(&run_dir) {
            if manifest.model.exists() {
                return BaseChoice::Found(manifest.model);
            }
            return BaseChoice::Missing(format!(
                "the base model recorded in {} ({}) is not here; pass --base <model> to compare the updates with \
                 the frozen weights",
                run_dir.join(RUN_CONFIG).display(),
                manifest.model.display()
            ));
        }
    }
    let named = PeftAdapterConfig::read(ckpt).ok().and_then(|c| c.base_model_name_or_path);
    let Some(named) = named.map(|n| n.trim().to_string()).filter(|n| !n.is_empty()) else {
        return BaseChoice::Missing(
            "the adapter names no base model and has no run.json beside it; pass --base <model> to compare the \
             updates with the frozen weights"
                .into(),
        );
    };
    for candidate in [PathBuf::from(&named), ckpt.join(&named)] {
        if candidate.exists() {
            return BaseChoice::Found(candidate);
        }
    }
    BaseChoice::Missing(format!(
        "the base model `{named}` (adapter_config.json base_model_name_or_path) is not a folder or file here; pass \
         --base <model> to compare the updates with the frozen weights"
    ))
}

/// The frozen weight of one linear: its Frobenius norm and the norm of each output row (DoRA starts its
/// magnitude at the latter).
pub struct FrozenNorms {
    pub frobenius: f64,
    pub row_norms: Vec<f64>,
}

/// Read the frozen weight of `layer`'s `module` from `base` and measure it.
pub fn frozen_norms(base: &mut BaseTensors, config: &ModelConfig, layer: usize, module: &str) -> Result<FrozenNorms> {
    let (in_f, out_f) = config.linear_shape(module).unwrap_or_default();
    let weight = base.read(&format!("{}.weight", hf_linear_name(layer, module)), &[out_f, in_f])?;
    let rows = weight.to_vec2::<f32>()?;
    let row_norms: Vec<f64> =
        rows.iter().map(|row| row.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>().sqrt()).collect();
    let frobenius = row_norms.iter().map(|n| n * n).sum::<f64>().sqrt();
    Ok(FrozenNorms { frobenius, row_norms })
}
