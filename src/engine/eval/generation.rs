//! `--task generate`: answers to each row's prompt, scored against the row's reference answer.

use super::{EvalSpec, GenerateSettings, PreparedTask};
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};

/// Read the split's prompts and references for the generate task.
pub fn prepare(_spec: &EvalSpec, _settings: &GenerateSettings, _base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    Err(Error::InvalidSetting("the generate task is being built".into()))
}
