//! What an evaluation scores: the base model, or the base with an adapter (a checkpoint of ours or a PEFT
//! adapter folder), named for the report. A run folder stands for all of its checkpoints, in step order.

use crate::engine::checkpoint::{self, step_of_folder};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::LoadedModel;
use crate::engine::{lora, Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One model to score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalTarget {
    /// How reports name it: "base", "checkpoint-200", "my-run/checkpoint-200", or the adapter folder's name.
    pub label: String,
    /// The adapter applied to the base (None: the base alone).
    pub adapter: Option<PathBuf>,
    /// The training step of a checkpoint (for plots against the step).
    pub step: Option<usize>,
}

impl EvalTarget {
    /// The base model alone.
    pub fn base() -> Self {
        Self { label: "base".into(), adapter: None, step: None }
    }

    /// An adapter folder: a checkpoint (named `run/checkpoint-N`, with its step) or any PEFT adapter folder.
    pub fn adapter(dir: &Path) -> Self {
        let step = step_of_folder(dir);
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        let own = name(dir).unwrap_or_else(|| dir.display().to_string());
        let label = match (step, dir.parent().and_then(name)) {
            (Some(_), Some(run)) => format!("{run}/{own}"),
            _ => own,
        };
        Self { label, adapter: Some(dir.to_path_buf()), step }
    }

    /// Each path as a target: a run folder (it holds run.json or checkpoints) becomes its checkpoints in step
    /// order; anything else is taken as an adapter folder (checked by [`Self::check`]).
    pub fn expand(paths: &[PathBuf]) -> Result<Vec<Self>> {
        let mut out = Vec::new();
        for path in paths {
            let checkpoints = checkpoint::list_checkpoints(path);
            let is_run = path.join(crate::engine::train::run_folder::RUN_CONFIG).exists() || !checkpoints.is_empty();
            if is_run && !path.join(checkpoint::ADAPTER_WEIGHTS).exists() {
                if checkpoints.is_empty() {
                    return Err(Error::MissingFile {
                        path: path.clone(),
                        what: "a run folder with at least one checkpoint to evaluate".into(),
                    });
                }
                out.extend(checkpoints.iter().map(|c| Self::adapter(&c.path)));
            } else {
                out.push(Self::adapter(path));
            }
        }
        Ok(out)
    }

    /// Refuse an adapter that does not fit `base` (before any work starts); a warning when it was trained on
    /// another base.
    pub fn check(&self, base: &LoadedModel) -> Result<Option<String>> {
        let Some(dir) = &self.adapter else { return Ok(None) };
        checkpoint::read_adapter_for(&base.config, dir)?;
        Ok(checkpoint::base_mismatch(dir, base)?.map(|w| format!("{}: {w}", self.label)))
    }

    /// The model to score: a clone of the base (sharing its weights) with this target's adapter alone attached.
    pub fn model_for(&self, base: &LoadedModel) -> Result<Transformer> {
        let mut model = base.model.clone();
        lora::detach_adapters(&mut model);
        if let Some(dir) = &self.adapter {
            checkpoint::load_adapter(&mut model, dir)?;
        }
        Ok(model)
    }
}
