//! `--task loss`: loss and perplexity on a split, templated and masked as training does.

use super::{EvalSpec, PreparedTask};
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};

/// Read and tokenize the split for the loss task.
pub fn prepare(_spec: &EvalSpec, _base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    Err(Error::InvalidSetting("the loss task is being built".into()))
}
