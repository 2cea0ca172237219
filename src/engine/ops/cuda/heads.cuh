// The split of a projection's rows into attention heads with the rotary embedding, and its backward, each in one
// pass (included by fused.cu; loaded by src/engine/ops/cuda_training.rs). Composed from Candle ops each was a
// strided copy (the transpose) and a rope pass, per q, k and v and again for their gradients.
//
//   rows   (b * t, n * d) contiguous: the projection's output, or the gradient the projection receives;
//   heads  (b, n, t, d) contiguous: what the attention reads, or the gradient it gives;
//   cos, sin (t, d / 2): the rope tables of the t positions (non-interleaved halves, as Candle's `rope`).
// Forward, with rotate: heads[i] = x1 cos - x2 sin, heads[i + d/2] = x2 cos + x1 sin (x1 = rows[i], x2 =
// rows[i + d/2]); the backward rotates by the opposite angle. Without rotate, a plain (transposing) copy.
// One thread per pair (i, i + d/2) of one head of one row, in a grid-stride loop; f32 math, one rounding.

template <typename T>
__device__ void heads_rope(const T* src, const T* cos, const T* sin, T* dst, int b, int t, int n, int d, int rotate,
                           int backward) {
  const int half = d / 2;
  const size_t pairs = (size_t)b * t * n * half;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < pairs; idx += (size_t)gridDim.x * blockDim.x) {
    const int i = idx % half;
    const size_t head_row = idx / half;  // (row, head) with row = bi * t + ti
    const int h = head_row % n;
    const size_t row = head_row / n;
    const int ti = row % t;
    const size_t bi = row / t;
    const size_t in_rows = row * (size_t)n * d + (size_t)h * d + i;        // the (b * t, n * d) side
    const size_t in_heads = ((bi * n + h) * t + ti) * (size_t)d + i;       // the (b, n, t, d) side
    const size_t from = backward ? in_heads : in_rows, to = backward ? in_rows : in_heads;
    const float x1 = to_f(src[from]), x2 = to_f(src[from + half]);
    if (!rotate) {
      dst[to] = from_f<T>(x1);
      dst[to + half] = from_f<T>(x2);
      continue;
    }
    const float c = to_f(cos[(size_t)ti * half + i]);
    const float s = backward ? -to_f(sin[(size_t)ti * half + i]) : to_f(sin[(size_t)ti * half + i]);
    dst[to] = from_f<T>(x1 * c - x2 * s);
    dst[to + half] = from_f<T>(x2 * c + x1 * s);
  }
}

#define INSTANTIATE_HEADS(T, SUFFIX)                                                                             \
  extern "C" __global__ void heads_rope_##SUFFIX(const T* src, const T* cos, const T* sin, T* dst, int b, int t, \
                                                 int n, int d, int rotate, int backward) {                       \
    heads_rope<T>(src, cos, sin, dst, b, t, n, d, rotate, backward);                                             \
  }

INSTANTIATE_HEADS(float, f32)
INSTANTIATE_HEADS(__nv_bfloat16, bf16)
