//! Where gradient checkpointing keeps the saved layer inputs during a training pass: on the device, or with
//! `--checkpointing offload` on CUDA in pinned host memory, copied out and back on a second stream while the layers
//! compute (`cuda/offload.rs`). Elsewhere offloading keeps them resident: the CPU's memory is the host's, and a
//! Mac's GPU shares it.
//!
//! The copies are byte for byte, so the gradients are those of resident checkpoints, bit for bit.

use candle_core::{Device, Result, Tensor};

/// Whether `--checkpointing offload` moves the kept layer inputs off `device` (a CUDA GPU under the native kernels).
pub fn offload_applies(device: &Device) -> bool {
    cfg!(feature = "cuda") && device.is_cuda() && super::kernel_choice::native()
}

/// A tensor kept for the backward pass.
pub enum Parked {
    Resident(Tensor),
    #[cfg(feature = "cuda")]
    Host(super::cuda::offload::HostCopy),
}

/// Parks tensors for one training pass.
pub struct Offloader {
    #[cfg(feature = "cuda")]
    copier: Option<super::cuda::offload::Copier>,
    /// Whether the layers' attention results go to host memory beside their inputs, decided at the first layer.
    attention: Option<bool>,
}

/// Whether the attention results of `layers` layers fit in host memory beside their inputs (`input_bytes` and
/// `attention_bytes` a layer) within `budget_bytes` ([`host_pin_budget`]; unknown: they go). When not, only the
/// inputs leave the device and the recompute attends again: the kept attention output doubles the host memory a
/// token costs (at 8B, 512 KiB instead of 256), so a long run on a host of 128 GiB would stop near 250k tokens where
/// the inputs alone reach twice as far.
pub fn attention_fits_in_host(input_bytes: u64, attention_bytes: u64, layers: u64, budget_bytes: Option<u64>) -> bool {
    budget_bytes.is_none_or(|budget| layers.saturating_mul(input_bytes + attention_bytes) <= budget)
}

/// The host memory an offloading pass may pin: `METAL_CANDLE_OFFLOAD_HOST_GIB` where set, else three quarters of
/// what the kernel reports available (Linux) plus the pinned buffers a previous pass left in the pool for reuse.
/// None where unknown.
pub fn host_pin_budget() -> Option<u64> {
    if let Some(gib) = std::env::var("METAL_CANDLE_OFFLOAD_HOST_GIB").ok().and_then(|v| v.trim().parse::<f64>().ok()) {
        return Some((gib.max(0.0) * (1u64 << 30) as f64) as u64);
    }
    let available = crate::engine::device::available_memory_bytes()?;
    #[cfg(feature = "cuda")]
    let pooled = super::cuda::offload::pooled_bytes() as u64;
    #[cfg(not(feature = "cuda"))]
    let pooled = 0;
    Some((available + pooled) / 4 * 3)
}

impl Offloader {
    /// Host copies when `offload` is set and `device` is a CUDA GPU under the native kernels; else resident.
    pub fn new(device: &Device, offload: bool) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            let copier = match device {
                Device::Cuda(cuda) if offload && offload_applies(device) => {
                    Some(super::cuda::offload::Copier::new(cuda)?)
                }
                _ => None,
            };
            Ok(Self { copier, attention: None })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (device, offload);
            Ok(Self { attention: None })
        }
    }

    /// Whether parked tensors leave the device.
    pub fn offloads(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.copier.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Whether a layer's attention result (`attention_bytes`, its input `input_bytes`) is parked beside the input,
    /// for `layers` layers: only when tensors leave the device, and only while they fit in host memory
    /// ([`attention_fits_in_host`]); decided once a pass, at its first layer.
    pub fn parks_attention(&mut self, input_bytes: u64, attention_bytes: u64, layers: u64) -> bool {
        if !self.offloads() {
            return false;
        }
        *self.attention.get_or_insert_with(|| {
            let fits = attention_fits_in_host(input_bytes, attention_bytes, layers, host_pin_budget());
            if !fits {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "checkpointing offload: {:.1} GiB of layer inputs and attention results would not fit in \
                         host memory; keeping the inputs only ({:.1} GiB) and attending again in the backward",
                        (layers * (input_bytes + attention_bytes)) as f64 / (1u64 << 30) as f64,
                        (layers * input_bytes) as f64 / (1u64 << 30) as f64
                    )
                });
            }
            fits
        })
    }

    /// Keep one layer's `tensors` for later: their copies out start now, behind the work queued so far (the layer's
    /// forward); the device lets them go behind the next layer's.
    pub fn park(&mut self, tensors: &[&Tensor]) -> Result<Vec<Parked>> {
        #[cfg(feature = "cuda")]
        if let Some(copier) = self.copier.as_mut() {
            return Ok(copier.park(tensors)?.into_iter().map(Parked::Host).collect());
        }
        Ok(tensors.iter().map(|t| Parked::Resident((*t).clone())).collect())
    }

    /// The forward pass is over: let the device copies of the parked tensors go once their copies are done.
    pub fn settle(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(copier) = self.copier.as_mut() {
            copier.settle()?;
        }
        Ok(())
    }

    /// Start bringing `parked` back, so that it is there when [`Self::fetch`] asks for it.
    pub fn prefetch(&mut self, parked: &mut Parked) -> Result<()> {
        match parked {
            Parked::Resident(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Parked::Host(host) => self.copier()?.prefetch(host),
        }
    }

    /// `parked` on the device, ready for the work queued next.
    pub fn fetch(&mut self, parked: Parked) -> Result<Tensor> {
        match parked {
            Parked::Resident(t) => Ok(t),
            #[cfg(feature = "cuda")]
            Parked::Host(host) => self.copier()?.fetch(host),
        }
    }

    /// The copy stream that parked a tensor in host memory.
    #[cfg(feature = "cuda")]
    fn copier(&mut self) -> Result<&mut super::cuda::offload::Copier> {
        match self.copier.as_mut() {
            Some(copier) => Ok(copier),
            None => candle_core::bail!("a checkpoint in host memory without the pass's copier"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8B shape at 250k tokens: inputs and attention results (512 KiB a token) do not fit in three quarters of
    /// a 128 GiB host; the inputs alone would, and 32k tokens fit with both.
    #[test]
    fn attention_results_are_parked_only_while_they_fit_in_host_memory() {
        let (layers, host) = (32, 96u64 << 30);
        let per_token = 4096 * 2;
        let at = |tokens: u64| (tokens * per_token, tokens * (per_token + 32 * 4));
        let (input, attention) = at(250_000);
        assert!(!attention_fits_in_host(input, attention, layers, Some(host)));
        assert!(attention_fits_in_host(input, 0, layers, Some(host)));
        assert!(attention_fits_in_host(input, attention, layers, None), "an unknown budget: they go");
        let (input, attention) = at(32_768);
        assert!(attention_fits_in_host(input, attention, layers, Some(host)));
    }
}
