//! `--task multiple-choice`: the log-likelihood of each choice as lm-evaluation-harness computes it.

use super::{EvalSpec, PreparedTask};
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};

/// Read the choice rows for the multiple-choice task.
pub fn prepare(_spec: &EvalSpec, _base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    Err(Error::InvalidSetting("the multiple-choice task is being built".into()))
}
