//! Scalars a pass produces (a batch's loss, a squared norm) and when they reach the host. A CUDA training step
//! keeps its loss on the device until the step is queued to its end (the optimizer's guard reads it there), so the
//! GPU never waits midway for the host to read a value and queue the rest; [`Scalar::value`] reads it.

use super::kernel_choice::metal_dtypes;
use candle_core::{DType, Device, Result, Tensor};

/// A scalar on the host, or still on the device as a one-element f32 tensor.
#[derive(Debug, Clone)]
pub enum Scalar {
    Host(f64),
    Device(Tensor),
}

impl Scalar {
    /// The value on the host (a read, which waits for the device's queued work, when it is still there).
    pub fn value(&self) -> Result<f64> {
        match self {
            Scalar::Host(v) => Ok(*v),
            Scalar::Device(t) => Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?[0] as f64),
        }
    }

    /// The sum of one-element tensors, added on their device and not read.
    pub fn device_sum(parts: &[Tensor]) -> Result<Self> {
        let mut parts = parts.iter().map(|t| t.to_dtype(DType::F32)?.reshape(1));
        let Some(first) = parts.next() else { return Ok(Scalar::Host(0.0)) };
        Ok(Scalar::Device(parts.try_fold(first?, |sum, part| sum + part?)?))
    }

    /// `scale * (the sum of parts)`: on the host when every part is, else added on the device of the first part
    /// that is there.
    pub fn scaled_sum(parts: &[Scalar], scale: f64) -> Result<Self> {
        let Some(device) = parts.iter().find_map(|p| match p {
            Scalar::Device(t) => Some(t.device().clone()),
            Scalar::Host(_) => None,
        }) else {
            return Ok(Scalar::Host(
                parts.iter().map(|p| if let Scalar::Host(v) = p { *v } else { 0.0 }).sum::<f64>() * scale,
            ));
        };
        let on_device = parts.iter().map(|p| p.on_device(&device)).collect::<Result<Vec<_>>>()?;
        match Self::device_sum(&on_device)? {
            Scalar::Device(sum) => Ok(Scalar::Device((sum * scale)?)),
            host => Ok(host),
        }
    }

    /// This value as a one-element f32 tensor on `device` (copied there when it is on the host).
    pub fn on_device(&self, device: &Device) -> Result<Tensor> {
        match self {
            Scalar::Host(v) => Tensor::new(&[*v as f32], device),
            Scalar::Device(t) => t.to_device(device)?.to_dtype(DType::F32)?.reshape(1),
        }
    }
}

/// The sum of scalar tensors (losses, squared norms) reduced on their device and read to the host once:
/// in f32 on a GPU (Metal has no f64), in f64 when the tensors already are.
pub fn sum_to_host(parts: &[Tensor]) -> Result<f64> {
    let Some(first) = parts.first() else { return Ok(0.0) };
    metal_dtypes("sum_to_host", &parts.iter().collect::<Vec<_>>())?;
    let total = Tensor::stack(parts, 0)?.sum_all()?;
    if first.dtype() == DType::F64 {
        return total.to_scalar::<f64>();
    }
    Ok(total.to_dtype(DType::F32)?.to_scalar::<f32>()? as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_reach_the_host_once_in_the_tensors_precision() {
        let dev = Device::Cpu;
        let parts = [Tensor::new(1.5f32, &dev).unwrap(), Tensor::new(2.25f32, &dev).unwrap()];
        assert_eq!(sum_to_host(&parts).unwrap(), 3.75);
        assert_eq!(sum_to_host(&[Tensor::new(1e-12f64, &dev).unwrap()]).unwrap(), 1e-12);
        assert_eq!(sum_to_host(&[]).unwrap(), 0.0);
    }

    #[test]
    fn scaled_sums_stay_where_their_parts_are() {
        let dev = Device::Cpu;
        let host = Scalar::scaled_sum(&[Scalar::Host(1.5), Scalar::Host(2.5)], 0.5).unwrap();
        assert!(matches!(host, Scalar::Host(v) if v == 2.0));
        let parts = [
            Scalar::Host(1.5),
            Scalar::device_sum(&[Tensor::new(2.0f32, &dev).unwrap(), Tensor::new(0.5f32, &dev).unwrap()]).unwrap(),
        ];
        let mixed = Scalar::scaled_sum(&parts, 0.5).unwrap();
        assert!(matches!(mixed, Scalar::Device(_)));
        assert_eq!(mixed.value().unwrap(), 2.0);
        assert_eq!(Scalar::device_sum(&[]).unwrap().value().unwrap(), 0.0);
        assert_eq!(Scalar::Host(3.0).on_device(&dev).unwrap().to_vec1::<f32>().unwrap(), [3.0]);
    }
}
