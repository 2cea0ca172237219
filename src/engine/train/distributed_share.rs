//! The trainer's side of data-parallel training (see engine/distributed): joining the other ranks, each rank's
//! share of a step's rows, and the decisions every rank must take alike (stop, early stop) taken from one value.

use super::config::TrainConfig;
use super::rows::TrainRows;
use super::WholeStep;
use crate::engine::data::{Batch, Example};
use crate::engine::distributed::{Group, JOIN_TIMEOUT};
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};

/// Join the other ranks when `config` is one rank of a data-parallel run (None: training alone). Methods whose
/// steps are not a sum over rows are refused first.
pub(super) fn join(config: &TrainConfig, base: &LoadedModel) -> Result<Option<Group>> {
    let Some(spec) = &config.distributed else { return Ok(None) };
    require_data_parallel_method(config)?;
    Ok(Some(Group::join(spec, base.model.device(), JOIN_TIMEOUT)?))
}

/// Whether this process leads its run: it trains alone, or it is rank 0 (the one that writes and evaluates).
pub(super) fn leads(group: Option<&Group>) -> bool {
    group.is_none_or(|g| g.spec().is_leader())
}

/// Data-parallel training runs SFT: a preference or GRPO step is not (yet) split into rows the ranks can share.
pub fn require_data_parallel_method(config: &TrainConfig) -> Result<()> {
    if config.method == super::Method::Sft {
        return Ok(());
    }
    Err(Error::InvalidSetting(format!(
        "{} trains on one device for now; data-parallel training (--gpus, torchrun) runs SFT",
        config.method.name()
    )))
}

/// This rank's share of a step's micro-batches (the rows of each that [`RankSpec::shard`] gives it, padded
/// among themselves; micro-batches of which it has no rows are left out), and what it must know of the whole step.
///
/// [`RankSpec::shard`]: crate::engine::distributed::RankSpec::shard
pub(super) fn shard_step(
    group: &Group,
    (units, examples): (&TrainRows, &[Example]),
    micro: &[Vec<usize>],
    whole: &[Batch],
    pad_id: u32,
) -> Result<(Vec<Batch>, WholeStep)> {
    let shards = micro
        .iter()
        .map(|indices| &indices[group.spec().shard(indices.len())])
        .filter(|rows| !rows.is_empty())
        .map(|rows| units.collate(examples, rows, pad_id))
        .collect::<Result<Vec<_>>>()?;
    Ok((shards, WholeStep { target_tokens: whole.iter().map(|b| b.target_tokens).sum() }))
}

/// The leader's validation loss, known to every rank (None when the leader had none to compute): the ranks'
/// replicas are equal, so the others do not compute it again, and all of them take the same early-stopping
/// decision from the same value.
pub(super) fn leader_value(group: &mut Group, device: &candle_core::Device, value: Option<f64>) -> Result<Option<f64>> {
    // The value travels as two f32 (its rounding and the rest), which carry an f64 loss to about 1e-14.
    let mine = match (group.spec().is_leader(), value) {
        (true, Some(v)) => [1.0f32, v as f32, (v - (v as f32) as f64) as f32],
        _ => [0.0; 3],
    };
    let summed = group.all_reduce_sum(&[candle_core::Tensor::new(&mine, device)?])?;
    let [has, high, low] = summed[0].to_vec1::<f32>()?[..] else {
        return Err(Error::Distributed("the shared value came back malformed".into()));
    };
    Ok((has > 0.5).then_some(high as f64 + low as f64))
}
