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
            Ok(Self { copier })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (device, offload);
            Ok(Self {})
        }
    }

    /// Whether parked tensors leave the device.
    pub fn offloads(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.copier.is_some();
        #[cfg(not(feature = "cuda"))]
        false
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
