//! A data-parallel step's adapter gradients summed over the ranks layer by layer while the backward still runs
//! (engine/distributed/step_sum.rs does the sums): one bucket per adapted layer, the top layer first, given as soon
//! as that layer's backward is done in the step's last micro-batch, so its sum travels while the layers below are
//! differentiated. Every rank gives the same buckets in the same order whatever rows it had: a layer the pass did
//! not reach (a rank with no rows this step) is given at the end, its gradients zeros.

use crate::engine::distributed::{Group, StepSum};
use crate::engine::model::Gradients;
use crate::engine::{Error, Result};
use candle_core::{Tensor, Var};

/// The buckets of one step in flight.
pub struct LayerSums {
    sum: StepSum,
    /// The optimizer's parameters, in its order.
    params: Vec<Var>,
    /// The adapted layers not given yet, the highest last, each with its parameters' positions in the optimizer.
    waiting: Vec<(usize, Vec<usize>)>,
    /// Optimizer positions in the order their gradients were given.
    given: Vec<usize>,
}

impl LayerSums {
    /// A step's sums, for the optimizer's parameters `params`, whose layers are `param_layers`.
    pub fn new(group: &Group, params: &[(String, Var)], param_layers: &[usize]) -> Self {
        let mut waiting: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut layers: Vec<usize> = param_layers.to_vec();
        layers.sort_unstable();
        layers.dedup();
        for layer in layers {
            let positions = (0..param_layers.len()).filter(|&i| param_layers[i] == layer).collect();
            waiting.push((layer, positions));
        }
        let params = params.iter().map(|(_, v)| v.clone()).collect();
        Self { sum: group.begin_sum(), params, waiting, given: Vec::new() }
    }

    /// `layer`'s backward is done: give it, and any layer above it not given yet, their gradients now final.
    pub fn after_layer(&mut self, group: &mut Group, layer: usize, grads: &Gradients) -> Result<()> {
        while self.waiting.last().is_some_and(|(l, _)| *l >= layer) {
            let (_, positions) = self.waiting.pop().expect("checked above");
            // A parameter the pass did not reach gives zeros (f32, as every adapter is): every rank gives a bucket
            // of the same shapes and dtype.
            let tensors = positions
                .iter()
                .map(|&i| grads.get_or_zeros(self.params[i].as_tensor()))
                .collect::<candle_core::Result<Vec<_>>>()?;
            group.add_bucket(&mut self.sum, &tensors)?;
            self.given.extend(positions);
        }
        Ok(())
    }

    /// Give the layers not given yet and then `tail` (the loss, the votes), and wait for the sums: the gradients
    /// in the optimizer's order, and `tail`'s sums.
    pub fn finish(
        mut self,
        group: &mut Group,
        grads: &Gradients,
        tail: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        self.after_layer(group, 0, grads)?;
        group.add_bucket(&mut self.sum, tail)?;
        let mut summed = group.finish_sum(self.sum)?;
        let tail_sums = summed.split_off(summed.len().saturating_sub(tail.len()));
        let mut ordered: Vec<Option<Tensor>> = vec![None; self.params.len()];
        for (&position, sum) in self.given.iter().zip(summed) {
            ordered[position] = Some(sum);
        }
        let ordered = ordered.into_iter().collect::<Option<Vec<_>>>();
        let ordered = ordered.ok_or_else(|| Error::Distributed("a parameter's gradient was never summed".into()))?;
        Ok((ordered, tail_sums))
    }
}
