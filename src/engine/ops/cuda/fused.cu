// Fused CUDA kernels, where each composed Candle op would be a kernel launch (and, in half precision, an
// f32 copy): token-by-token decoding (loaded by src/engine/ops/cuda/decode.rs), the residual add with its RMS
// norm (residual.rs), the optimizer (optimizer.rs), and through the included files the training pass's
// element-wise blocks (training.cuh), the head split (heads.cuh) and the flash attention (flash_attention*.cuh).
// Compiled to PTX by build.rs when the `cuda` feature is on. Math is in f32 for every storage type.
#include <assert.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// 16 bytes of T as floats and back (the element-wise passes below move 16 bytes per load where every buffer is
// 16-byte aligned and the length a multiple of the group, one element at a time otherwise).
template <typename T> struct Group16 {
  static constexpr int V = 16 / sizeof(T);
};
__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
template <typename T> __device__ __forceinline__ void load16(const T* p, float* v) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < Group16<T>::V; k++) v[k] = to_f(e[k]);
}
template <typename T> __device__ __forceinline__ void store16(T* p, const float* v) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < Group16<T>::V; k++) e[k] = from_f<T>(v[k]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// 16-byte chunks of a row that each thread keeps in registers between the two passes (decoding is bound by
// the latency of this one-block row: one round of 16-byte loads, no re-reading of what was just stored).
#define ADD_NORM_KEEP 2
template <typename T>
__device__ __forceinline__ uint4 add_chunk(uint4 a, uint4 b, float* sq) {
  uint4 out;
  const T* at = reinterpret_cast<const T*>(&a);
  const T* bt = reinterpret_cast<const T*>(&b);
  T* ot = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) {
    ot[e] = from_f<T>(to_f(at[e]) + to_f(bt[e]));
    const float f = to_f(ot[e]);
    *sq += f * f;
  }
  return out;
}
// A chunk as it is, its squares added to *sq (add_chunk without the add).
template <typename T>
__device__ __forceinline__ uint4 square_chunk(uint4 a, float* sq) {
  const T* at = reinterpret_cast<const T*>(&a);
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) {
    const float f = to_f(at[e]);
    *sq += f * f;
  }
  return a;
}
template <typename T>
__device__ __forceinline__ uint4 scale_chunk(uint4 s, uint4 w, float inv) {
  uint4 out;
  const T* st = reinterpret_cast<const T*>(&s);
  const T* wt = reinterpret_cast<const T*>(&w);
  T* ot = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) ot[e] = from_f<T>(to_f(st[e]) * inv * to_f(wt[e]));
  return out;
}

// Residual add then RMS norm, one block per row: sum = x + delta (rounded to T), normed = its norm times w. Without
// `delta` (null) the row of x is normed as it is and `sum` (then null too) is not written: the plain RMS norm, the
// same arithmetic, so a sum normed again later gives the bits this pass gave (checkpointing's recompute).
template <typename T>
__device__ void add_rms_norm(const T* x, const T* delta, const T* w, T* sum, T* normed, int cols, float eps) {
  __shared__ float partial[32];
  const int row = blockIdx.x;
  const bool add = delta != nullptr;
  const T* xr = x + (size_t)row * cols;
  const T* dr = add ? delta + (size_t)row * cols : nullptr;
  T* sum_out = add ? sum + (size_t)row * cols : nullptr;
  // What the second pass re-reads: the sum just written, or x itself.
  const T* summed = add ? sum_out : xr;
  T* norm_out = normed + (size_t)row * cols;
  const int per = 16 / (int)sizeof(T), chunks = cols / per;
  const bool vec = cols % per == 0 && ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(dr) |
                                        reinterpret_cast<uintptr_t>(sum_out) | reinterpret_cast<uintptr_t>(norm_out) |
                                        reinterpret_cast<uintptr_t>(w)) & 15) == 0;
  const uint4 *xv = reinterpret_cast<const uint4*>(xr), *dv = reinterpret_cast<const uint4*>(dr);
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* summed_v = reinterpret_cast<const uint4*>(summed);
  uint4* sv = reinterpret_cast<uint4*>(sum_out);
  uint4* nv = reinterpret_cast<uint4*>(norm_out);
  uint4 kept[ADD_NORM_KEEP];
  float sq = 0.f;
  auto chunk = [&](int c) {
    if (!add) return square_chunk<T>(xv[c], &sq);
    const uint4 s = add_chunk<T>(xv[c], dv[c], &sq);
    sv[c] = s;
    return s;
  };
  if (vec) {
#pragma unroll
    for (int j = 0; j < ADD_NORM_KEEP; j++) {
      const int c = threadIdx.x + j * blockDim.x;
      if (c < chunks) kept[j] = chunk(c);
    }
    for (int c = threadIdx.x + ADD_NORM_KEEP * blockDim.x; c < chunks; c += blockDim.x) chunk(c);
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
      const T s = add ? from_f<T>(to_f(xr[i]) + to_f(dr[i])) : xr[i];
      if (add) sum_out[i] = s;
      float f = to_f(s);
      sq += f * f;
    }
  }
  sq = warp_sum(sq);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) partial[warp] = sq;
  __syncthreads();
  if (warp == 0) {
    float v = lane < warps ? partial[lane] : 0.f;
    v = warp_sum(v);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / cols + eps);
  if (vec) {
#pragma unroll
    for (int j = 0; j < ADD_NORM_KEEP; j++) {
      const int c = threadIdx.x + j * blockDim.x;
      if (c < chunks) nv[c] = scale_chunk<T>(kept[j], wv[c], inv);
    }
    for (int c = threadIdx.x + ADD_NORM_KEEP * blockDim.x; c < chunks; c += blockDim.x)
      nv[c] = scale_chunk<T>(summed_v[c], wv[c], inv);
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) norm_out[i] = from_f<T>(to_f(summed[i]) * inv * to_f(w[i]));
  }
}

// SwiGLU on a fused gate|up product: gu (rows, 2 * inter) -> out (rows, inter) = silu(gate) * up.
template <typename T>
__device__ void silu_mul_halves(const T* gu, T* out, int rows, int inter) {
  const size_t n = (size_t)rows * inter;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / inter, c = i % inter;
    const float g = to_f(gu[r * 2 * inter + c]);
    const float u = to_f(gu[r * 2 * inter + inter + c]);
    out[i] = from_f<T>(g / (1.f + __expf(-g)) * u);
  }
}

// Rotate-half rotary embedding of element i (< d/2) and its partner i + d/2 at one position.
__device__ __forceinline__ void rotate(float x1, float x2, float c, float s, float* o1, float* o2) {
  *o1 = x1 * c - x2 * s;
  *o2 = x2 * c + x1 * s;
}

// Write one decoded token's keys (rotated) and values into the cache (2, b, kv, cap, d) at `pos` (read from
// `pos_dev` when that is not null: a CUDA graph replays the launch for every position).
// qkv: (b, (heads + 2 * kv) * d); rope: (max_len, d) rows of [cos | sin] in f32. Grid (kv, b), block d.
template <typename T>
__device__ void kv_write(const T* qkv, const float* rope, T* cache, int heads, int kv, int d, int cap, int b,
                         const unsigned* pos_dev, int pos) {
  if (pos_dev) pos = (int)*pos_dev;
  const int kvh = blockIdx.x, bi = blockIdx.y, i = threadIdx.x, half = d / 2;
  const T* row = qkv + (size_t)bi * (heads + 2 * kv) * d;
  const T* k = row + (size_t)(heads + kvh) * d;
  const T* v = row + (size_t)(heads + kv + kvh) * d;
  T* kc = cache + (((size_t)bi * kv + kvh) * cap + pos) * d;
  T* vc = cache + (size_t)b * kv * cap * d + (((size_t)bi * kv + kvh) * cap + pos) * d;
  if (i < half) {
    const float c = rope[(size_t)pos * d + i], s = rope[(size_t)pos * d + half + i];
    float o1, o2;
    rotate(to_f(k[i]), to_f(k[i + half]), c, s, &o1, &o2);
    kc[i] = from_f<T>(o1);
    kc[i + half] = from_f<T>(o2);
  }
  if (i < d) vc[i] = v[i];
}

// Sum over the block of one value per thread (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; w++) total += scratch[w];
  return total;
}

__device__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < warps; w++) m = fmaxf(m, scratch[w]);
  return m;
}

// The dot product of a query held in shared memory (f32, already scaled) with one cached key row of `d`
// elements: 16-byte loads where the row allows them.
__device__ __forceinline__ float dot_key(const float* q, const float* k, int d, bool wide) {
  float s = 0.f;
  if (wide) {
    for (int c = 0; c < d; c += 4) {
      const float4 u = *reinterpret_cast<const float4*>(k + c);
      s += q[c] * u.x + q[c + 1] * u.y + q[c + 2] * u.z + q[c + 3] * u.w;
    }
  } else {
    for (int c = 0; c < d; c++) s += q[c] * k[c];
  }
  return s;
}
__device__ __forceinline__ float dot_key(const float* q, const __nv_bfloat16* k, int d, bool wide) {
  float s = 0.f;
  if (wide) {
    for (int c = 0; c < d; c += 8) {
      const uint4 u = *reinterpret_cast<const uint4*>(k + c);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float2 f = __bfloat1622float2(h[e]);
        s += q[c + 2 * e] * f.x + q[c + 2 * e + 1] * f.y;
      }
    }
  } else {
    for (int c = 0; c < d; c++) s += q[c] * __bfloat162float(k[c]);
  }
  return s;
}

// acc[0 .. w) += p * v[0 .. w) for one value row slice: w = 16 / sizeof(T) elements by one 16-byte load when
// `wide`, else w = 1.
__device__ __forceinline__ void add_weighted(const float* v, float p, float* acc, bool wide) {
  if (wide) {
    const float4 u = *reinterpret_cast<const float4*>(v);
    acc[0] += p * u.x;
    acc[1] += p * u.y;
    acc[2] += p * u.z;
    acc[3] += p * u.w;
  } else {
    acc[0] += p * v[0];
  }
}
__device__ __forceinline__ void add_weighted(const __nv_bfloat16* v, float p, float* acc, bool wide) {
  if (wide) {
    const uint4 u = *reinterpret_cast<const uint4*>(v);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float2 f = __bfloat1622float2(h[e]);
      acc[2 * e] += p * f.x;
      acc[2 * e + 1] += p * f.y;
    }
  } else {
    acc[0] += p * __bfloat162float(v[0]);
  }
}

// Attention of one new query per head at `pos` (read from `pos_dev` when not null, as in `kv_write`) over the
// `pos + 1` cached positions (keys `window` or more back, when window > 0, fall outside a sliding window), in two
// launches (flash-decoding): attn_decode_part, grid (heads, b, splits), then attn_decode_merge, grid (heads, b).
// The keys the token sees are cut into `splits` contiguous shares, one block each, so a model with 32 heads keeps
// every SM busy instead of 32 (one block per head walked all the keys: 15 us a layer at 384 keys on an H200,
// and growing with the context). The share count is fixed by the host and the shares by the position the kernel
// reads, so a captured decode step replays at every position.
//
// attn_decode_part rotates the query, then takes its keys DEC_CHUNK at a time: every thread scores its own keys
// (a whole row each), the chunk's softmax weights sit in shared memory, then the threads split into groups of
// d / w lanes, each lane summing a w-element slice (one 16-byte load) of the weighted value rows of its group's
// keys; an online softmax carries over chunks and the groups are summed at the end. It writes its share's
// running maximum, sum of weights and unnormalised output to part ((b * heads + h) * splits + share) * (d + 2):
// [m, l, acc[0 .. d)] in f32 (an empty share: m = -inf, l = 0). Block DEC_THREADS; d <= 256.
#define DEC_THREADS 256
#define DEC_CHUNK 1024
template <typename T>
__device__ void attn_decode_part(const T* qkv, const float* rope, const T* cache, float* part, int heads, int kv,
                                 int d, int cap, int b, const unsigned* pos_dev, int pos, int window, float scale) {
  if (pos_dev) pos = (int)*pos_dev;
  const int len = pos + 1, lo = window > 0 ? max(0, len - window) : 0;
  const int splits = gridDim.z, share = (len - lo + splits - 1) / splits;
  const int k0 = lo + (int)blockIdx.z * share, k1 = min(len, k0 + share);
  const int h = blockIdx.x, bi = blockIdx.y, half = d / 2, tid = threadIdx.x;
  float* mine = part + (((size_t)bi * heads + h) * splits + blockIdx.z) * (d + 2);
  if (k0 >= k1) {  // the whole block: nothing to see
    for (int i = tid; i < d + 2; i += blockDim.x) mine[i] = i == 0 ? -INFINITY : 0.f;
    return;
  }
  __shared__ __align__(16) float q_s[256];
  __shared__ float p_s[DEC_CHUNK];
  __shared__ __align__(16) float acc_s[DEC_THREADS * 8];
  __shared__ float scratch[32];
  const int kvh = h / (heads / kv);
  const T* q = qkv + (size_t)bi * (heads + 2 * kv) * d + (size_t)h * d;
  for (int i = tid; i < half; i += blockDim.x) {
    const float c = rope[(size_t)pos * d + i], s = rope[(size_t)pos * d + half + i];
    float o1, o2;
    rotate(to_f(q[i]), to_f(q[i + half]), c, s, &o1, &o2);
    q_s[i] = o1 * scale;
    q_s[i + half] = o2 * scale;
  }
  __syncthreads();
  const T* kbase = cache + ((size_t)bi * kv + kvh) * cap * d;
  const T* vbase = cache + (size_t)b * kv * cap * d + ((size_t)bi * kv + kvh) * cap * d;
  const int per_vec = 16 / (int)sizeof(T);
  const bool wide = d % per_vec == 0 && (reinterpret_cast<uintptr_t>(cache) & 15) == 0;
  const int w = wide ? per_vec : 1, lanes = d / w;
  const int groups = max(1, (int)blockDim.x / lanes), group = tid / lanes, lane = tid % lanes;
  const bool sums = group < groups;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, m = -INFINITY, l = 0.f;
  for (int c0 = k0; c0 < k1; c0 += DEC_CHUNK) {
    const int n = min(DEC_CHUNK, k1 - c0);
    float mx = -INFINITY;
    for (int j = tid; j < n; j += blockDim.x) {
      const float s = dot_key(q_s, kbase + (size_t)(c0 + j) * d, d, wide);
      p_s[j] = s;
      mx = fmaxf(mx, s);
    }
    const float m_new = fmaxf(m, block_max(mx, scratch));
    const float corr = __expf(m - m_new);
    float part_sum = 0.f;
    for (int j = tid; j < n; j += blockDim.x) {
      const float p = __expf(p_s[j] - m_new);
      p_s[j] = p;
      part_sum += p;
    }
    l = l * corr + block_sum(part_sum, scratch);
    m = m_new;
    __syncthreads();
    if (sums) {
      float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int j = group; j < n; j += groups) add_weighted(vbase + (size_t)(c0 + j) * d + lane * w, p_s[j], a, wide);
#pragma unroll
      for (int e = 0; e < 8; e++) acc[e] = acc[e] * corr + a[e];
    }
    __syncthreads();
  }
  // Group g's sums for dimensions [lane * w, lane * w + w) at acc_s[g * d + lane * w ...].
  if (sums) {
#pragma unroll
    for (int e = 0; e < 8; e++)
      if (e < w) acc_s[group * d + lane * w + e] = acc[e];
  }
  __syncthreads();
  for (int i = tid; i < d; i += blockDim.x) {
    float v = 0.f;
    for (int g = 0; g < groups; g++) v += acc_s[g * d + i];
    mine[2 + i] = v;
  }
  if (tid == 0) {
    mine[0] = m;
    mine[1] = l;
  }
}

// The shares' results of attn_decode_part for one (head, batch row) rescaled to their common maximum and summed:
// out (b, heads * d). Grid (heads, b), any block.
template <typename T>
__device__ void attn_decode_merge(const float* part, T* out, int heads, int d, int splits) {
  const int h = blockIdx.x, bi = blockIdx.y;
  const float* parts = part + ((size_t)bi * heads + h) * splits * (d + 2);
  float m = -INFINITY;
  for (int s = 0; s < splits; s++) m = fmaxf(m, parts[(size_t)s * (d + 2)]);
  float l = 0.f;
  for (int s = 0; s < splits; s++) {
    const float ms = parts[(size_t)s * (d + 2)];
    if (ms != -INFINITY) l += parts[(size_t)s * (d + 2) + 1] * __expf(ms - m);
  }
  T* o = out + (size_t)bi * heads * d + (size_t)h * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < splits; s++) {
      const float ms = parts[(size_t)s * (d + 2)];
      if (ms != -INFINITY) v += parts[(size_t)s * (d + 2) + 2 + i] * __expf(ms - m);
    }
    o[i] = from_f<T>(v / l);
  }
}

#define INSTANTIATE(T, SUFFIX)                                                                                     \
  extern "C" __global__ void add_rms_norm_##SUFFIX(const T* x, const T* delta, const T* w, T* sum, T* normed,   \
                                                   int cols, float eps) {                                        \
    add_rms_norm<T>(x, delta, w, sum, normed, cols, eps);                                                        \
  }                                                                                                              \
  extern "C" __global__ void silu_mul_halves_##SUFFIX(const T* gu, T* out, int rows, int inter) {                \
    silu_mul_halves<T>(gu, out, rows, inter);                                                                    \
  }                                                                                                              \
  extern "C" __global__ void kv_write_##SUFFIX(const T* qkv, const float* rope, T* cache, int heads, int kv,     \
                                               int d, int cap, int b, const unsigned* pos_dev, int pos) {        \
    kv_write<T>(qkv, rope, cache, heads, kv, d, cap, b, pos_dev, pos);                                           \
  }                                                                                                              \
  extern "C" __global__ void attn_decode_part_##SUFFIX(const T* qkv, const float* rope, const T* cache,          \
                                                       float* part, int heads, int kv, int d, int cap, int b,   \
                                                       const unsigned* pos_dev, int pos, int window,            \
                                                       float scale) {                                           \
    attn_decode_part<T>(qkv, rope, cache, part, heads, kv, d, cap, b, pos_dev, pos, window, scale);              \
  }                                                                                                              \
  extern "C" __global__ void attn_decode_merge_##SUFFIX(const float* part, T* out, int heads, int d,             \
                                                        int splits) {                                            \
    attn_decode_merge<T>(part, out, heads, d, splits);                                                           \
  }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)

// ---- Decoding: single-row products against frozen weights ----
#include "gemv.cuh"
#include "qgemv.cuh"
#include "dequantize.cuh"

// ---- Decoding: the index of a row's largest logit (greedy sampling), in two launches ----
// Ties go to the first index and NaN is never the largest, as the CPU's `sampler::argmax` has it.
#define ARGMAX_THREADS 256
__device__ __forceinline__ void argmax_pick(float v, unsigned i, float* best, unsigned* at) {
  if (v > *best || (v == *best && i < *at)) {
    *best = v;
    *at = i;
  }
}
// Reduce every thread's (best, at) over the block: thread 0 ends with the block's.
__device__ void argmax_block(float* best, unsigned* at) {
  __shared__ float vs[ARGMAX_THREADS];
  __shared__ unsigned is[ARGMAX_THREADS];
  for (int s = ARGMAX_THREADS / 2; s > 0; s >>= 1) {
    vs[threadIdx.x] = *best;
    is[threadIdx.x] = *at;
    __syncthreads();
    if (threadIdx.x < s) argmax_pick(vs[threadIdx.x + s], is[threadIdx.x + s], best, at);
    __syncthreads();
  }
}
// Each block's (largest value, its index) over a grid-stride share of x (n values) into pmax/pidx[blockIdx.x].
extern "C" __global__ void argmax_partial_f32(const float* x, int n, float* pmax, unsigned* pidx) {
  float best = -INFINITY;
  unsigned at = 0xffffffffu;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) argmax_pick(x[i], i, &best, &at);
  argmax_block(&best, &at);
  if (threadIdx.x == 0) {
    pmax[blockIdx.x] = best;
    pidx[blockIdx.x] = at;
  }
}
// One block: the partials' winner, or 0 when every value was NaN.
extern "C" __global__ void argmax_final_f32(const float* pmax, const unsigned* pidx, int parts, unsigned* out) {
  float best = -INFINITY;
  unsigned at = 0xffffffffu;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) argmax_pick(pmax[i], pidx[i], &best, &at);
  argmax_block(&best, &at);
  if (threadIdx.x == 0) *out = at == 0xffffffffu ? 0u : at;
}

// ---- Training: attention probabilities, element-wise blocks and their input gradients, the head's loss ----
#include "training.cuh"

// ---- Splitting projections into heads with the rotary embedding, and back ----
#include "heads.cuh"

// ---- Fused (flash-style) attention: training forward and backward, prefill ----
#include "flash_attention.cuh"

// ---- Decoding: single-row products against Q4_K weights on the tensor cores (after the attention, whose
// mma16816 they use) ----
#include "qgemv_mma.cuh"

// ---- The optimizer: multi-tensor AdamW in place, the gradient norm and the step's guard, all on the device
// (src/engine/ops/cuda/optimizer.rs) ----

// Up to OPT_TENSORS parameters per launch, their addresses passed by value (blockIdx.y picks one), OPT_BLOCKS
// blocks of 256 threads each.
#define OPT_TENSORS 24
#define OPT_BLOCKS 64
struct OptChunk {
  float* p[OPT_TENSORS];
  float* m[OPT_TENSORS];
  float* v[OPT_TENSORS];
  const float* g[OPT_TENSORS];
  int n[OPT_TENSORS];
};

// The squares of gradient y of the chunk, one partial sum per block into partial[(first + y) * OPT_BLOCKS + x].
extern "C" __global__ void sum_squares_f32(OptChunk c, int first, float* partial) {
  __shared__ float scratch[32];
  const float* g = c.g[blockIdx.y];
  const int n = c.n[blockIdx.y];
  float s = 0.f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += g[i] * g[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[(first + blockIdx.y) * OPT_BLOCKS + blockIdx.x] = s;
}

// One block of 256: stats = [loss, squared gradient norm, clipping coefficient, skipped]. The partials are added in
// double in a fixed order, so the norm is the same in every run. The coefficient is torch's clip_grad_norm_ (as
// train/optimizer.rs clip_coefficient): max_norm / (norm + 1e-6) when below 1; max_norm <= 0 turns clipping off. A
// non-finite loss or norm sets skipped, and the update kernels then change nothing.
extern "C" __global__ void optimizer_guard(const float* partial, int count, const float* loss, float max_norm,
                                           double* stats) {
  __shared__ double scratch[256];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += (double)partial[i];
  scratch[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) scratch[threadIdx.x] += scratch[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double sumsq = scratch[0], l = (double)loss[0];
    double coef = 1.0;
    if (max_norm > 0.f) {
      const double c = (double)max_norm / (sqrt(sumsq) + 1e-6);
      if (c < 1.0) coef = c;
    }
    stats[0] = l;
    stats[1] = sumsq;
    stats[2] = coef;
    stats[3] = isfinite(l) && isfinite(sumsq) ? 0.0 : 1.0;
  }
}

// One AdamW step on the chunk's f32 parameters in place, with the arithmetic of train/optimizer.rs: the gradient
// times the guard's clipping coefficient, the moments, then p * decay - lr * m_hat / (sqrt(v_hat) + eps), decay =
// 1 - lr * weight_decay. Nothing when the guard skipped the step.
extern "C" __global__ void adamw_f32(OptChunk c, float lr, float b1, float b2, float eps, float decay, float bias1,
                                     float bias2, const double* stats) {
  if (stats[3] != 0.0) return;
  const float gscale = (float)stats[2];
  const int t = blockIdx.y, n = c.n[t];
  float *p = c.p[t], *m = c.m[t], *v = c.v[t];
  const float* g = c.g[t];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float gi = g[i] * gscale;
    const float mi = m[i] * b1 + gi * (1.f - b1);
    const float vi = v[i] * b2 + gi * gi * (1.f - b2);
    const float update = (mi / bias1) / (sqrtf(vi / bias2) + eps);
    p[i] = p[i] * decay - update * lr;
    m[i] = mi;
    v[i] = vi;
  }
}

// ---- Many f32 tensors cast to the compute dtype in one launch (src/engine/ops/cuda/cast.rs): the adapters' A and
// B for a training step, where a cast per matrix was two launches per adapter ----
struct CastChunk {
  const float* src[OPT_TENSORS];
  void* dst[OPT_TENSORS];
  int n[OPT_TENSORS];
};
template <typename T> __device__ void cast_many(const CastChunk& c) {
  const int t = blockIdx.y, n = c.n[t];
  const float* src = c.src[t];
  T* dst = static_cast<T*>(c.dst[t]);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = from_f<T>(src[i]);
}
extern "C" __global__ void cast_many_f32_bf16(CastChunk c) { cast_many<__nv_bfloat16>(c); }
extern "C" __global__ void cast_many_f32_f16(CastChunk c) { cast_many<__half>(c); }
