//! Our CPU f32 kernels, taken under the native kernel set (never in the portable graph): parallel passes over rows
//! or elements on the CPU team instead of chains of Candle ops, BLAS products that read transposed views in place,
//! matrix-vector kernels for single rows (dense and quantized), and products of half-precision frozen weights made
//! dense in f32 piece by piece. The dispatchers in ops/ call in here; nothing here dispatches.

pub(super) mod blas_matmul;
pub(super) mod elementwise;
pub(super) mod gemv;
pub(super) mod half_products;
pub(super) mod host;
pub(super) mod qgemv;
pub(super) mod training;
