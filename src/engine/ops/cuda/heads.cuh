// The split of a projection's rows into attention heads with the rotary embedding, and its backward, each in one
// pass (included by fused.cu; loaded by src/engine/ops/cuda/training.rs). Composed from Candle ops each was a
// strided copy (the transpose) and a rope pass, per q, k and v and again for their gradients.
//
//   rows   (b * t, n * d) contiguous: the projection's output, or the gradient the projection receives;
//   heads  (b, n, t, d) contiguous: what the attention reads, or the gradient it gives;
//   cos, sin (t, d / 2): the rope tables of the t positions (non-interleaved halves, as Candle's `rope`).
// Forward, with rotate: heads[i] = x1 cos - x2 sin, heads[i + d/2] = x2 cos + x1 sin (x1 = rows[i], x2 =
// rows[i + d/2]); the backward rotates by the opposite angle. Without rotate, a plain (transposing) copy.
// One thread per group of pairs (i, i + d/2) of one head of one row (16 bytes of each half where they allow it,
// one pair otherwise), in a grid-stride loop; f32 math, one rounding.

template <typename T>
__device__ void heads_rope(const T* src, const T* cos, const T* sin, T* dst, int b, int t, int n, int d, int rotate,
                           int backward) {
  // Each thread takes a group of 16 bytes of adjacent pairs where the halves and buffers allow it, else one pair.
  constexpr int G = Group16<T>::V;
  const int half = d / 2;
  const bool wide = half % G == 0 && aligned16(src) && aligned16(dst) && (!rotate || (aligned16(cos) && aligned16(sin)));
  const int width = wide ? G : 1, groups = half / width;
  const size_t units = (size_t)b * t * n * groups;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < units; idx += (size_t)gridDim.x * blockDim.x) {
    const int i = (int)(idx % groups) * width;
    const size_t head_row = idx / groups;  // (row, head) with row = bi * t + ti
    const int h = head_row % n;
    const size_t row = head_row / n;
    const int ti = row % t;
    const size_t bi = row / t;
    const size_t in_rows = row * (size_t)n * d + (size_t)h * d + i;        // the (b * t, n * d) side
    const size_t in_heads = ((bi * n + h) * t + ti) * (size_t)d + i;       // the (b, n, t, d) side
    const size_t from = backward ? in_heads : in_rows, to = backward ? in_rows : in_heads;
    const size_t table = (size_t)ti * half + i;
    if (wide) {
      float x1[G], x2[G], c[G], s[G];
      load16(src + from, x1);
      load16(src + from + half, x2);
      if (rotate) {
        load16(cos + table, c);
        load16(sin + table, s);
#pragma unroll
        for (int k = 0; k < G; k++) {
          const float sk = backward ? -s[k] : s[k], y1 = x1[k] * c[k] - x2[k] * sk;
          x2[k] = x2[k] * c[k] + x1[k] * sk;
          x1[k] = y1;
        }
      }
      store16(dst + to, x1);
      store16(dst + to + half, x2);
      continue;
    }
    const float x1 = to_f(src[from]), x2 = to_f(src[from + half]);
    if (!rotate) {
      dst[to] = from_f<T>(x1);
      dst[to + half] = from_f<T>(x2);
      continue;
    }
    const float c = to_f(cos[table]);
    const float s = backward ? -to_f(sin[table]) : to_f(sin[table]);
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
