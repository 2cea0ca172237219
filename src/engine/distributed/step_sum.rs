//! A step's gradients summed over the ranks in buckets, handed over while the backward still runs: with NCCL each
//! bucket travels on the communicator's own stream as soon as it is given (the layers below go on computing), and
//! the sums are joined once, before the update. The host backend sums everything at the end, on rank 0.
//!
//! Every rank must give the same buckets (the same tensors' shapes, in the same order): the NCCL calls pair up by
//! their order. The trainer gives one bucket per adapted layer, top layer first, then the loss and the votes.

use super::{host_sum, Group, Summer};
use crate::engine::Result;
use candle_core::{DType, Shape, Tensor};

/// The buckets given so far: each one's tensors joined into one f32 row, and their shapes and dtypes.
pub struct StepSum {
    /// With NCCL, the device's stream must wait for the sums before what it frees is reused. Declared before the
    /// buckets so that, dropped unfinished, the wait is queued before their memory is freed on that stream (fields
    /// drop in declaration order).
    #[cfg(feature = "nccl")]
    joins: JoinOnDrop,
    buckets: Vec<(Tensor, Vec<(Shape, DType)>)>,
}

impl Group {
    /// A new step's sum, to give buckets to ([`Group::add_bucket`]) and end ([`Group::finish_sum`]).
    pub fn begin_sum(&self) -> StepSum {
        StepSum {
            #[cfg(feature = "nccl")]
            joins: JoinOnDrop(None),
            buckets: Vec::new(),
        }
    }

    /// Give `sum` a bucket: `tensors`, summed over the ranks (with NCCL it starts now, after the work queued so far).
    pub fn add_bucket(&mut self, sum: &mut StepSum, tensors: &[Tensor]) -> Result<()> {
        let flat =
            tensors.iter().map(|t| t.to_dtype(DType::F32)?.flatten_all()).collect::<candle_core::Result<Vec<_>>>()?;
        let joined = match flat.len() {
            1 => flat[0].copy()?,
            _ => Tensor::cat(&flat, 0)?,
        };
        match &self.summer {
            Summer::Host => {}
            #[cfg(feature = "nccl")]
            Summer::Nccl(comm) => {
                comm.all_reduce_sum_in_place(&joined).map_err(|e| self.links.explain(e))?;
                sum.joins.0.get_or_insert_with(|| (comm.stream_join(), joined.device().clone()));
            }
        }
        sum.buckets.push((joined, tensors.iter().map(|t| (t.shape().clone(), t.dtype())).collect()));
        Ok(())
    }

    /// The sums of every tensor given to `sum`, in the order given, each in its own shape and dtype.
    pub fn finish_sum(&mut self, #[allow(unused_mut)] mut sum: StepSum) -> Result<Vec<Tensor>> {
        let summed: Vec<Tensor> = match &self.summer {
            Summer::Host if sum.buckets.is_empty() => Vec::new(),
            Summer::Host => {
                let rows: Vec<&Tensor> = sum.buckets.iter().map(|(t, _)| t).collect();
                let joined = Tensor::cat(&rows, 0)?;
                let values = joined.to_vec1::<f32>()?;
                let sums = host_sum::all_reduce(&mut self.links, &self.spec, values)?;
                let all = Tensor::from_vec(sums, joined.dim(0)?, joined.device())?;
                let mut offset = 0;
                rows.iter()
                    .map(|t| {
                        let n = t.dim(0)?;
                        offset += n;
                        all.narrow(0, offset - n, n)
                    })
                    .collect::<candle_core::Result<_>>()?
            }
            #[cfg(feature = "nccl")]
            Summer::Nccl(_) => {
                sum.joins.join().map_err(|e| self.links.explain(e))?;
                sum.buckets.iter().map(|(t, _)| t.clone()).collect()
            }
        };
        let mut out = Vec::new();
        for (row, (_, parts)) in summed.iter().zip(&sum.buckets) {
            let mut offset = 0;
            for (shape, dtype) in parts {
                let n = shape.elem_count();
                out.push(row.narrow(0, offset, n)?.reshape(shape)?.to_dtype(*dtype)?);
                offset += n;
            }
        }
        Ok(out)
    }

    /// The element-wise sums of `tensors` over all ranks as one bucket (each rank passes tensors of the same shapes
    /// in the same order), in their dtypes. Every rank gets the same bits: NCCL's all-reduce gives all ranks one
    /// result, and the host sums are computed once, by the leader, in rank order.
    pub fn all_reduce_sum(&mut self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut sum = self.begin_sum();
        if !tensors.is_empty() {
            self.add_bucket(&mut sum, tensors)?;
        }
        self.finish_sum(sum)
    }
}

/// The wait for a sum's buckets in flight on NCCL's stream (None until the first is given): dropped unfinished (a
/// step begun ahead and abandoned, an error), it still makes the device's stream wait for them, so the memory they
/// use is not handed out again while NCCL writes it.
#[cfg(feature = "nccl")]
struct JoinOnDrop(Option<(crate::engine::ops::cuda::nccl::StreamJoin, candle_core::Device)>);

#[cfg(feature = "nccl")]
impl JoinOnDrop {
    /// Make the device's stream wait now (once: later calls and the drop do nothing).
    fn join(&mut self) -> Result<()> {
        match self.0.take() {
            Some((join, device)) => join.join(&device),
            None => Ok(()),
        }
    }
}

#[cfg(feature = "nccl")]
impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        let _ = self.join();
    }
}
