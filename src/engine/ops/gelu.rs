//! The tanh approximation of gelu (PyTorch's `gelu(approximate="tanh")`, gemma3's GeGLU): its constant, and the
//! value and slope at one point that the CPU kernels of the forward and the backward share.

/// `sqrt(2 / pi)`, the tanh approximation's constant.
pub(super) const GELU_TANH_C: f64 = 0.797_884_560_802_865_4;

/// gelu(x) with the tanh approximation and its derivative, in f32.
pub(super) fn gelu_tanh(x: f32) -> (f32, f32) {
    let c = GELU_TANH_C as f32;
    let t = (c * (x + 0.044_715 * x * x * x)).tanh();
    let value = 0.5 * x * (1.0 + t);
    let slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044_715 * x * x);
    (value, slope)
}
