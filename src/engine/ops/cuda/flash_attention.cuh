// Fused (flash-style) attention for the training pass and the prefill, included by fused.cu (loaded by
// src/engine/ops/cuda/attention.rs). Nothing of size (T x T) is stored: the forward streams tiles of keys
// through shared memory with an online softmax in f32 and keeps only the output and each row's logsumexp; the
// backward recomputes the probabilities tile by tile from that logsumexp.
//
// Layouts (elements of the storage type T, math in f32):
//   q      (b, heads, tq, D) contiguous;
//   k, v   (b, kv_heads, tk, D) with rows of D contiguous, batch stride `bs` and head stride `hs` (a KV cache
//          view is strided); the backward takes them contiguous (bs = kv_heads * tk * D, hs = tk * D);
//   out    (b, tq, heads * D): the layout o_proj reads, so no transpose follows; d_out the same;
//   lse    (b, heads, tq) f32, in the base-2 domain: log2 of the row's sum of 2^(s * log2 e) (s: scaled score);
//   dq     (b, heads, tq, D); dk, dv (b, kv_heads, tk, D) summed over the query heads that share a KV head.
// Query i sits at position q_offset + i; it sees key j when j <= q_offset + i and, with a sliding window w > 0,
// q_offset + i - j < w. Rows past the causal edge of right-padded batches are computed like any other row (the
// loss masks them), so no per-row lengths are needed.
// Packed rows (several examples concatenated in one row of the batch; training, so q_offset 0 and tq == tk): with
// `starts` (b, t) u32 (null without packing), query i of batch row r also sees no key before starts[r * t + i], the
// first token of its own example, so attention never crosses an example. A start never passes its query and never
// decreases along a row: like the window it is a per-query lower bound on the keys that grows with the query, and
// the loop bounds and tile tests below use it the same way (the smallest start of a tile of queries is its first
// row's, the largest its last row's). Without starts every bound and mask is what it was (a start of 0).
//
// Threads: each row (a query in the forward and dQ, a key in dK/dV) belongs to D / FA_SLICE adjacent threads
// that each hold FA_SLICE of its D elements in registers; dot products are reduced across them by shuffles.
#include <cuda_fp16.h>

#define FA_ROWS 64   // rows a block owns
#define FA_TILE 32   // rows of the other side streamed per shared-memory tile
#define FA_SLICE 16  // elements of a row per thread
#define FA_LOG2E 1.4426950408889634f

__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

// Sum over the THREADS adjacent lanes that share a row.
template <int THREADS> __device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = THREADS / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

template <typename T> __device__ __forceinline__ void load_slice(const T* src, float* dst) {
#pragma unroll
  for (int e = 0; e < FA_SLICE; e++) dst[e] = to_f(src[e]);
}

// Copy `rows` rows of D elements starting at row `first` of `src` (row stride D) into shared `dst` in f32,
// zeros past `limit`.
template <typename T, int D>
__device__ __forceinline__ void load_tile(const T* src, float (*dst)[D], int first, int limit) {
  for (int idx = threadIdx.x; idx < FA_TILE * D; idx += blockDim.x) {
    const int r = idx / D, c = idx % D, row = first + r;
    dst[r][c] = row < limit ? to_f(src[(size_t)row * D + c]) : 0.f;
  }
}

template <int D> __device__ __forceinline__ float dot_shared(const float* mine, const float* shared_row) {
  const float4* s4 = reinterpret_cast<const float4*>(shared_row);
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < FA_SLICE / 4; e++) {
    const float4 x = s4[e];
    acc += mine[4 * e] * x.x + mine[4 * e + 1] * x.y + mine[4 * e + 2] * x.z + mine[4 * e + 3] * x.w;
  }
  return row_sum<D / FA_SLICE>(acc);
}

// Whether query position `pos`, whose example starts at key `start` (0 unpacked), sees key j. Bitwise, not
// short-circuit: every term is a cheap compare, and `&&` made the compiler branch once per element of a tile.
__device__ __forceinline__ bool fa_visible(int pos, int j, int limit, int window, int start) {
  return (j < limit) & (j <= pos) & (j >= start) & ((window <= 0) | (pos - j < window));
}

// Batch row bi's starts of packed rows of length t, or null without packing.
__device__ __forceinline__ const unsigned int* fa_row_starts(const unsigned int* starts, int bi, int t) {
  return starts ? starts + (size_t)bi * t : nullptr;
}
// Where query i's example starts in a row (`row` from fa_row_starts; 0 without packing), or INT_MAX past the row's
// end: the kernels keep this one bound per query row, and a row that does not exist sees no key (fa_visible).
__device__ __forceinline__ int fa_start(const unsigned int* row, int i, int t) {
  return i < t ? (row ? (int)row[i] : 0) : INT_MAX;
}
// The end of key j's example in a row: the first query after j whose example starts after j (`hi` if none before
// it). Queries j.. before it may see key j, later ones do not (starts never decrease). Without packing: `hi`.
__device__ __forceinline__ int fa_example_end(const unsigned int* row, int j, int hi) {
  if (!row) return hi;
  int lo = j;  // a query whose example starts at or before j (j's own), the end in (lo, hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if ((int)row[mid] <= j)
      lo = mid;
    else
      hi = mid;
  }
  return hi;
}

// The end of the queries a dK/dV block of keys up to `last_key` may matter to in a packed row: the first query in
// (last_key, hi) whose example starts after last_key, or `hi` (also without packing). Starts never decrease, so no
// later query sees the block either, and the block stops there instead of streaming later examples' queries. A
// search by the whole block (every thread calls it, and gets the answer): each round tests blockDim.x evenly spaced
// queries of the interval left, two rounds up to 128^2 queries on the tensor-core kernels.
__device__ __forceinline__ int fa_queries_end(const unsigned int* row, int last_key, int hi) {
  if (!row) return hi;
  int lo = last_key;  // a query the block matters to (its own start is at most last_key); the answer is in (lo, hi]
  while (hi - lo > 1) {
    const int step = (hi - lo + (int)blockDim.x - 1) / (int)blockDim.x, i = lo + (int)threadIdx.x * step;
    // The tested queries lo, lo + step, ... that start at or before last_key are a prefix (at least lo itself).
    const int seen = __syncthreads_count(i < hi && (int)row[i] <= last_key);
    hi = min(hi, lo + seen * step);
    lo += (seen - 1) * step;
  }
  return hi;
}

// This block's (row tile, head, batch) in a grid (tiles, heads, b), numbered so that blocks are started longest
// first across the whole grid, not only within one head: the hardware starts blocks in linear order (x fastest),
// so with (tile, head) taken straight from (x, y) the last heads' longest causal blocks started last and ran on
// alone at the end of the launch. `longest_last` says the longest blocks own the last row tiles (queries see
// more keys the later they sit) rather than the first (keys are seen by more queries the earlier they sit).
struct FaBlock {
  int tile, head, batch;
};
__device__ __forceinline__ FaBlock fa_block_longest_first(bool longest_last) {
  const int others = gridDim.y * gridDim.z;
  const int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int rank = linear / others, rest = linear % others;
  return {longest_last ? (int)gridDim.x - 1 - rank : rank, rest % (int)gridDim.y, rest / (int)gridDim.y};
}

// Grid (ceil(tq / FA_ROWS), heads, b), block FA_ROWS * D / FA_SLICE.
template <typename T, int D>
__device__ void flash_forward(const T* q, const T* k, const T* v, T* out, float* lse, int heads, int kv_heads,
                              int tq, int tk, long long bs, long long hs, int q_offset, int window,
                              const unsigned int* starts, float scale) {
  constexpr int TPR = D / FA_SLICE;
  __shared__ __align__(16) float ks[FA_TILE][D];
  __shared__ __align__(16) float vs[FA_TILE][D];
  const FaBlock blk = fa_block_longest_first(true);
  const int row = threadIdx.x / TPR, part = threadIdx.x % TPR, h = blk.head, bi = blk.batch;
  const int first = blk.tile * FA_ROWS, i = first + row, pos = q_offset + i;
  const unsigned int* st = fa_row_starts(starts, bi, tq);
  const int start = fa_start(st, i, tq);
  const T* kb = k + bi * bs + (h / (heads / kv_heads)) * hs;
  const T* vb = v + bi * bs + (h / (heads / kv_heads)) * hs;
  const float c = scale * FA_LOG2E;
  float qr[FA_SLICE], o[FA_SLICE];
  if (i < tq) load_slice(q + (((size_t)bi * heads + h) * tq + i) * D + part * FA_SLICE, qr);
#pragma unroll
  for (int e = 0; e < FA_SLICE; e++) {
    if (i >= tq) qr[e] = 0.f;
    qr[e] *= c;
    o[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int hi = min(tk, q_offset + min(first + FA_ROWS, tq));
  const int lo = max(window > 0 ? max(0, q_offset + first - window + 1) : 0, fa_start(st, first, tq));
  for (int j0 = lo; j0 < hi; j0 += FA_TILE) {
    __syncthreads();
    load_tile<T, D>(kb, ks, j0, tk);
    load_tile<T, D>(vb, vs, j0, tk);
    __syncthreads();
    float s[FA_TILE];
    float mt = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < FA_TILE; jj++) {
      const float d = dot_shared<D>(qr, &ks[jj][part * FA_SLICE]);
      s[jj] = fa_visible(pos, j0 + jj, tk, window, start) ? d : -INFINITY;  // (start INT_MAX past the end)
      mt = fmaxf(mt, s[jj]);
    }
    const float m_new = fmaxf(m, mt);
    if (m_new == -INFINITY) continue;
    const float corr = exp2f(m - m_new);
    l *= corr;
#pragma unroll
    for (int e = 0; e < FA_SLICE; e++) o[e] *= corr;
#pragma unroll
    for (int jj = 0; jj < FA_TILE; jj++) {
      const float p = exp2f(s[jj] - m_new);
      l += p;
      const float4* v4 = reinterpret_cast<const float4*>(&vs[jj][part * FA_SLICE]);
#pragma unroll
      for (int e = 0; e < FA_SLICE / 4; e++) {
        const float4 x = v4[e];
        o[4 * e] += p * x.x;
        o[4 * e + 1] += p * x.y;
        o[4 * e + 2] += p * x.z;
        o[4 * e + 3] += p * x.w;
      }
    }
    m = m_new;
  }
  if (i >= tq) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  T* orow = out + (((size_t)bi * tq + i) * heads + h) * D + part * FA_SLICE;
#pragma unroll
  for (int e = 0; e < FA_SLICE; e++) orow[e] = from_f<T>(o[e] * inv);
  if (part == 0) lse[((size_t)bi * heads + h) * tq + i] = l > 0.f ? m + log2f(l) : INFINITY;
}

// dQ, and each row's delta = rowsum(dO * O) (written to `delta` for the dK/dV kernel that runs next). Grid
// (ceil(tq / FA_ROWS), heads, b), block FA_ROWS * D / FA_SLICE. Training only: tq == tk, offset 0.
template <typename T, int D>
__device__ void flash_backward_dq(const T* q, const T* k, const T* v, const T* out, const T* d_out,
                                  const float* lse, float* delta, T* dq, int heads, int kv_heads, int t, int window,
                                  const unsigned int* starts, float scale) {
  constexpr int TPR = D / FA_SLICE;
  __shared__ __align__(16) float ks[FA_TILE][D];
  __shared__ __align__(16) float vs[FA_TILE][D];
  const FaBlock blk = fa_block_longest_first(true);
  const int row = threadIdx.x / TPR, part = threadIdx.x % TPR, h = blk.head, bi = blk.batch;
  const int first = blk.tile * FA_ROWS, i = first + row;
  const unsigned int* st = fa_row_starts(starts, bi, t);
  const int start = fa_start(st, i, t);
  const size_t kv_base = ((size_t)bi * kv_heads + h / (heads / kv_heads)) * t * D;
  const size_t row_id = ((size_t)bi * heads + h) * t + i;
  const float c = scale * FA_LOG2E;
  float qr[FA_SLICE], dor[FA_SLICE], dqr[FA_SLICE];
  float li = 0.f, di = 0.f;
  if (i < t) {
    const size_t out_at = (((size_t)bi * t + i) * heads + h) * D + part * FA_SLICE;
    load_slice(q + row_id * D + part * FA_SLICE, qr);
    load_slice(d_out + out_at, dor);
    load_slice(out + out_at, dqr);
    li = lse[row_id];
#pragma unroll
    for (int e = 0; e < FA_SLICE; e++) di = fmaf(dqr[e], dor[e], di);
  }
  di = row_sum<TPR>(di);
  if (i < t && part == 0) delta[row_id] = di;
#pragma unroll
  for (int e = 0; e < FA_SLICE; e++) {
    if (i >= t) qr[e] = dor[e] = 0.f;
    qr[e] *= c;
    dqr[e] = 0.f;
  }
  const int hi = min(t, first + FA_ROWS);
  const int lo = max(window > 0 ? max(0, first - window + 1) : 0, fa_start(st, first, t));
  for (int j0 = lo; j0 < hi; j0 += FA_TILE) {
    __syncthreads();
    load_tile<T, D>(k + kv_base, ks, j0, t);
    load_tile<T, D>(v + kv_base, vs, j0, t);
    __syncthreads();
#pragma unroll 4
    for (int jj = 0; jj < FA_TILE; jj++) {
      const float s = dot_shared<D>(qr, &ks[jj][part * FA_SLICE]);
      const float dp = dot_shared<D>(dor, &vs[jj][part * FA_SLICE]);
      const float p = fa_visible(i, j0 + jj, t, window, start) ? exp2f(s - li) : 0.f;
      const float ds = p * (dp - di);
#pragma unroll
      for (int e = 0; e < FA_SLICE; e++) dqr[e] += ds * ks[jj][part * FA_SLICE + e];
    }
  }
  if (i >= t) return;
  T* dst = dq + row_id * D + part * FA_SLICE;
#pragma unroll
  for (int e = 0; e < FA_SLICE; e++) dst[e] = from_f<T>(dqr[e] * scale);
}

// dK and dV, summed over the query heads of the group. Grid (ceil(t / FA_ROWS), kv_heads, b), block
// FA_ROWS * D / FA_SLICE; each thread group owns one key and streams the queries that can see it.
template <typename T, int D>
__device__ void flash_backward_dkv(const T* q, const T* k, const T* v, const T* d_out, const float* lse,
                                   const float* delta, T* dk, T* dv, int heads, int kv_heads, int t, int window,
                                   const unsigned int* starts, float scale) {
  constexpr int TPR = D / FA_SLICE;
  __shared__ __align__(16) float qs[FA_TILE][D];
  __shared__ __align__(16) float dos[FA_TILE][D];
  __shared__ float ls[FA_TILE], dls[FA_TILE];
  const FaBlock blk = fa_block_longest_first(false);
  const int row = threadIdx.x / TPR, part = threadIdx.x % TPR, kvh = blk.head, bi = blk.batch;
  const int first = blk.tile * FA_ROWS, j = first + row, rep = heads / kv_heads;
  const size_t key_id = ((size_t)bi * kv_heads + kvh) * t + j;
  const float c = scale * FA_LOG2E;
  const unsigned int* st = fa_row_starts(starts, bi, t);
  const int lo = first;
  const int hi = fa_queries_end(st, min(first + FA_ROWS, t) - 1, window > 0 ? min(t, first + FA_ROWS - 1 + window) : t);
  // The queries that may see this key: up to the end of its example (packed rows), of the row otherwise.
  const int q_end = min(t, fa_example_end(st, j, hi));
  float kr[FA_SLICE], vr[FA_SLICE], dkr[FA_SLICE], dvr[FA_SLICE];
  if (j < t) {
    load_slice(k + key_id * D + part * FA_SLICE, kr);
    load_slice(v + key_id * D + part * FA_SLICE, vr);
  }
#pragma unroll
  for (int e = 0; e < FA_SLICE; e++) {
    if (j >= t) kr[e] = vr[e] = 0.f;
    kr[e] *= c;
    dkr[e] = dvr[e] = 0.f;
  }
  for (int g = 0; g < rep; g++) {
    const int h = kvh * rep + g;
    const size_t q_base = ((size_t)bi * heads + h) * t;
    for (int i0 = lo; i0 < hi; i0 += FA_TILE) {
      __syncthreads();
      load_tile<T, D>(q + q_base * D, qs, i0, t);
      for (int idx = threadIdx.x; idx < FA_TILE * D; idx += blockDim.x) {
        const int r = idx / D, col = idx % D, i = i0 + r;
        dos[r][col] = i < t ? to_f(d_out[(((size_t)bi * t + i) * heads + h) * D + col]) : 0.f;
      }
      for (int r = threadIdx.x; r < FA_TILE; r += blockDim.x) {
        const int i = i0 + r;
        ls[r] = i < t ? lse[q_base + i] : 0.f;
        dls[r] = i < t ? delta[q_base + i] : 0.f;
      }
      __syncthreads();
#pragma unroll 4
      for (int ii = 0; ii < FA_TILE; ii++) {
        const float s = dot_shared<D>(kr, &qs[ii][part * FA_SLICE]);
        const float dp = dot_shared<D>(vr, &dos[ii][part * FA_SLICE]);
        const float p = fa_visible(i0 + ii, j, t, window, 0) && i0 + ii < q_end ? exp2f(s - ls[ii]) : 0.f;
        const float ds = p * (dp - dls[ii]);
#pragma unroll
        for (int e = 0; e < FA_SLICE; e++) {
          dvr[e] += p * dos[ii][part * FA_SLICE + e];
          dkr[e] += ds * qs[ii][part * FA_SLICE + e];
        }
      }
    }
  }
  if (j >= t) return;
#pragma unroll
  for (int e = 0; e < FA_SLICE; e++) {
    dk[key_id * D + part * FA_SLICE + e] = from_f<T>(dkr[e] * scale);
    dv[key_id * D + part * FA_SLICE + e] = from_f<T>(dvr[e]);
  }
}

#include "flash_attention_mma.cuh"

// Tensor cores for bf16 and f16 at head_dim 64 and 128; the f32-FMA kernels above otherwise (f32 stays exact).
template <typename T, int D> struct FlashMma {
  static constexpr bool value = false;
};
template <> struct FlashMma<__nv_bfloat16, 64> { static constexpr bool value = true; };
template <> struct FlashMma<__nv_bfloat16, 128> { static constexpr bool value = true; };
template <> struct FlashMma<__half, 64> { static constexpr bool value = true; };
template <> struct FlashMma<__half, 128> { static constexpr bool value = true; };

template <typename T, int D>
__device__ void flash_forward_any(const T* q, const T* k, const T* v, T* out, float* lse, int heads, int kv_heads,
                                  int tq, int tk, long long bs, long long hs, int q_offset, int window,
                                  const unsigned int* starts, float scale) {
#ifdef FA_WGMMA
  if constexpr (FlashMma<T, D>::value)
    flash_forward_wgmma<T, D>(q, k, v, out, lse, heads, kv_heads, tq, tk, bs, hs, q_offset, window, starts, scale);
  else
#endif
  if constexpr (FlashMma<T, D>::value)
    flash_forward_mma<T, D>(q, k, v, out, lse, heads, kv_heads, tq, tk, bs, hs, q_offset, window, starts, scale);
  else
    flash_forward<T, D>(q, k, v, out, lse, heads, kv_heads, tq, tk, bs, hs, q_offset, window, starts, scale);
}

template <typename T, int D>
__device__ void flash_backward_dq_any(const T* q, const T* k, const T* v, const T* out, const T* d_out,
                                      const float* lse, float* delta, T* dq, int heads, int kv_heads, int t,
                                      int window, const unsigned int* starts, float scale) {
#ifdef FA_WGMMA
  if constexpr (FlashMma<T, D>::value)
    flash_backward_dq_wgmma<T, D>(q, k, v, out, d_out, lse, delta, dq, heads, kv_heads, t, window, starts, scale);
  else
#endif
  if constexpr (FlashMma<T, D>::value)
    flash_backward_dq_mma<T, D>(q, k, v, out, d_out, lse, delta, dq, heads, kv_heads, t, window, starts, scale);
  else
    flash_backward_dq<T, D>(q, k, v, out, d_out, lse, delta, dq, heads, kv_heads, t, window, starts, scale);
}

template <typename T, int D>
__device__ void flash_backward_dkv_any(const T* q, const T* k, const T* v, const T* d_out, const float* lse,
                                       const float* delta, T* dk, T* dv, int heads, int kv_heads, int t, int window,
                                       const unsigned int* starts, float scale) {
#ifdef FA_WGMMA
  if constexpr (FlashMma<T, D>::value)
    flash_backward_dkv_wgmma<T, D>(q, k, v, d_out, lse, delta, dk, dv, heads, kv_heads, t, window, starts, scale);
  else
#endif
  if constexpr (FlashMma<T, D>::value)
    flash_backward_dkv_mma<T, D>(q, k, v, d_out, lse, delta, dk, dv, heads, kv_heads, t, window, starts, scale);
  else
    flash_backward_dkv<T, D>(q, k, v, d_out, lse, delta, dk, dv, heads, kv_heads, t, window, starts, scale);
}

// Threads a block of these kernels has (attention.rs launches the same): 4 warps on the tensor cores, d / FA_SLICE a
// row otherwise. Told to the compiler for the f32 dK/dV kernels (DKV_BOUNDS): without it, sm_80's ptxas gave the
// head_dim-128 one 134 registers at 512 threads, over a multiprocessor's 64K a block, which an A100 refuses to
// launch (sm_90's gives it 128 either way). The other kernels fit; a bound changed the compiler's code for them
// (the tensor-core ones included), so they are left as they were.
template <typename T, int D> struct FlashThreads {
  static constexpr int value = FlashMma<T, D>::value ? 128 : FA_ROWS * D / FA_SLICE;
};

// Kernel parameters: `starts` is packed rows' (b, t) u32 starts, or null (attention.rs passes 0).
#define INSTANTIATE_FLASH_D(T, SUFFIX, D)                                                                        \
  extern "C" __global__ void flash_forward_d##D##_##SUFFIX(const T* q, const T* k, const T* v, T* out,         \
                                                          float* lse, int heads, int kv_heads, int tq, int tk,   \
                                                          long long bs, long long hs, int q_offset, int window,  \
                                                          const unsigned int* starts, float scale) {             \
    flash_forward_any<T, D>(q, k, v, out, lse,                                                                   \
                            heads, kv_heads, tq, tk, bs, hs, q_offset, window, starts, scale);                   \
  }                                                                                                              \
  extern "C" __global__ void flash_backward_dq_d##D##_##SUFFIX(const T* q, const T* k, const T* v,             \
                                                              const T* out, const T* d_out, const float* lse,    \
                                                              float* delta, T* dq, int heads, int kv_heads,      \
                                                              int t, int window, const unsigned int* starts,     \
                                                              float scale) {                                     \
    flash_backward_dq_any<T, D>(q, k, v, out, d_out, lse, delta, dq,                                             \
                                heads, kv_heads, t, window, starts, scale);                                      \
  }                                                                                                              \
  extern "C" __global__ void DKV_BOUNDS(T, D) flash_backward_dkv_d##D##_##SUFFIX(const T* q, const T* k, const T* v,            \
                                                               const T* d_out, const float* lse,                 \
                                                               const float* delta, T* dk, T* dv, int heads,      \
                                                               int kv_heads, int t, int window,                  \
                                                               const unsigned int* starts, float scale) {        \
    flash_backward_dkv_any<T, D>(q, k, v, d_out, lse, delta, dk, dv,                                             \
                                 heads, kv_heads, t, window, starts, scale);                                     \
  }

#define INSTANTIATE_FLASH(T, SUFFIX)                                                                             \
  INSTANTIATE_FLASH_D(T, SUFFIX, 16)                                                                             \
  INSTANTIATE_FLASH_D(T, SUFFIX, 32)                                                                             \
  INSTANTIATE_FLASH_D(T, SUFFIX, 64)                                                                             \
  INSTANTIATE_FLASH_D(T, SUFFIX, 128)

#define DKV_BOUNDS(T, D) __launch_bounds__(FlashThreads<T, D>::value)
INSTANTIATE_FLASH(float, f32)
#undef DKV_BOUNDS
#define DKV_BOUNDS(T, D)
INSTANTIATE_FLASH(__nv_bfloat16, bf16)
INSTANTIATE_FLASH(__half, f16)
#undef DKV_BOUNDS
