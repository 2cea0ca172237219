// Tensor-core versions of the fused attention (flash_attention.cuh) for bf16 and f16 storage with head_dim 64
// or 128: the same contract, layouts and base-2 logsumexp, with every product on mma.sync m16n8k16 (f32
// accumulation). A warp owns tiles of 16 rows (queries in the forward and dQ, keys in dK/dV): one in dK/dV and at
// head_dim 128, two in the forward and dQ at 64 (FwdTiles, DqTiles), where every B fragment read from shared
// memory then serves both (the reads, not the tensor cores, bound these kernels); a block is 4 warps. Scores,
// probabilities and accumulators stay in registers in the mma accumulator layout, whose rows
// and columns for lane = 4 g + t are (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). The accumulator of
// one product is the A operand of the next once packed to 16 bits (as in FlashAttention-2). Streamed tiles
// sit in shared memory row-major, rows padded by 8 elements so the 8 rows a warp reads at once fall in distinct
// banks, loaded with 16-byte reads; mma operands come out of them through ldmatrix (.trans where the product
// reads a tile along its columns, so no tile is ever stored transposed). Packed rows' starts (flash_attention.cuh)
// are one more per-row lower bound on the keys: a row's start sits in a register beside its position in the forward
// and dQ, and the starts of a streamed tile's queries in shared memory beside their logsumexps in dK/dV.

#include "flash_mma_ops.cuh"

// 2^x on the special-function unit, subnormal results flushed to zero (probabilities below 2^-126 do not
// matter); exp2f adds a range fix-up of three instructions per element.
__device__ __forceinline__ float fa_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// Whether every key j0..j1 is visible from every query position p0..p1 (the interior of the causal band, inside
// the window, and inside the example of every row: `last_start`, the start of row p1's example, is the largest of
// the rows' starts; 0 unpacked): such a tile needs no per-element mask, the common case at long lengths. Bounds
// (rows and keys inside the tensors) are the caller's part of the test.
__device__ __forceinline__ bool fa_tile_visible(int p0, int p1, int j0, int j1, int window, int last_start) {
  return j1 <= p0 && j0 >= last_start && (window <= 0 || p1 - j0 < window);
}
// A compile-time flag for the generic lambdas that run a tile's element loop with and without the mask.
template <bool B> struct FaMasked {
  static constexpr bool value = B;
};
// `body(FaMasked<false>)` for an interior tile, `body(FaMasked<true>)` otherwise: two compiled element loops, the
// choice made once per tile (the same for the whole warp).
template <typename F> __device__ __forceinline__ void fa_tile_loop(bool interior, F body) {
  if (interior)
    body(FaMasked<false>{});
  else
    body(FaMasked<true>{});
}

// Keys per tile: 64 at head_dim 64, 32 at 128 (shared memory stays under 48 KiB).
template <int D> struct MmaTile {
  static constexpr int N = D == 128 ? 32 : 64;
};

// Row tiles of 16 a warp owns in the forward and in dQ. On mma.sync two at head_dim 64, so every K or V fragment read
// from shared memory serves 32 rows (the products are otherwise bound by shared-memory reads), one at 128
// (registers). On wgmma (sm_90a) one: the tensor cores read K and V from shared memory once per warpgroup whatever
// the rows, and one 64-row tile takes 128 (forward) and 157 (dQ) registers a thread where two took 223 and 242, so
// four and three blocks share an SM instead of two, one block's softmax running while another's products do (1 x
// 4096 at the 1B shape: forward 0.216 -> 0.192 ms, dQ 0.243 -> 0.219). ROWS sizes the grid (attention.rs:
// query_grid); host code picks R_MMA or R_WGMMA itself (it cannot see which device build runs).
template <int D> struct QueryTiles {
  static constexpr int R_MMA = D == 64 ? 2 : 1, R_WGMMA = 1;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static constexpr int R = R_WGMMA;
#else
  static constexpr int R = R_MMA;
#endif
  static constexpr int ROWS = MMA_WARPS * 16 * R;  // rows a block owns (the grid's x: ceil(tq / ROWS))
};
template <int D> struct FwdTiles : QueryTiles<D> {};

// The start of the first and of the last row of a warp's 16-row tiles, the smallest and the largest of their rows'
// starts, from the first or the last tile's per-row starts (`start` as fwd_tile_setup / dq_tile_setup give them:
// lane 0 holds the first row, lane 31 the last).
__device__ __forceinline__ int fa_first_start(const int* start) { return __shfl_sync(0xffffffff, start[0], 0); }
__device__ __forceinline__ int fa_last_start(const int* start) { return __shfl_sync(0xffffffff, start[1], 31); }

// Whether any key j0..j1 may be visible from some query position p0..p1 (false: the tile is wholly masked for them).
// `first_start`, the start of row p0's example (0 unpacked), is the smallest of the rows' starts.
__device__ __forceinline__ bool fa_tile_any(int p0, int p1, int j0, int j1, int window, int first_start) {
  return j0 <= p1 && j1 >= first_start && (window <= 0 || p0 - j1 < window);
}

// The forward's per-tile steps, shared by the mma.sync and wgmma kernels, on one 16-row tile's scores s[N/8][4]
// (keys j0 + column) for rows g and g + 8 (pos[half], their examples' start[half]: INT_MAX for a row past the end).
// Scores stay unscaled until the exponent (one FMA each); masked ones become -inf (MASKED: the per-element test runs;
// an interior tile skips it). mx gets each row's largest score of the tile (this thread's columns).
template <bool MASKED, int N>
__device__ __forceinline__ void fwd_mask_max(float (*s)[4], const int* pos, const int* start, int j0, int tk,
                                             int window, float* mx) {
  const int t = threadIdx.x & 3;
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < N / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int half = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1);
      const bool keep = !MASKED || fa_visible(pos[half], j, tk, window, start[half]);
      if (!keep) s[n][e] = -INFINITY;
      mx[half] = fmaxf(mx[half], s[n][e]);
    }
  }
}
// The online softmax step: the running maximum m (base 2, scaled) and sum l move to this tile, s becomes the
// probabilities 2^(s c - m) and the output accumulator o[D/8][4] is rescaled to the new maximum.
template <int N, int D>
__device__ __forceinline__ void fwd_softmax_step(float (*s)[4], float (*o)[4], float* m, float* l, const float* mx,
                                                 float c) {
  float base[2], corr[2];
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const float m_new = fmaxf(m[half], quad_max(mx[half]) * c);
    base[half] = m_new == -INFINITY ? 0.f : m_new;
    corr[half] = fa_exp2(m[half] - base[half]);
    m[half] = m_new;
    l[half] *= corr[half];
  }
#pragma unroll
  for (int n = 0; n < N / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      s[n][e] = fa_exp2(fmaf(s[n][e], c, -base[e >> 1]));
      l[e >> 1] += s[n][e];
    }
  }
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
}
// The start of a 16-row tile (query rows row0 + 8 half + g of the head's q, rows D apart): Q as A fragments, the
// output accumulator zeroed, the running maximum and sum reset, each row's position (pos) and where its example
// starts (start, from the batch row's starts `st`: 0 unpacked, INT_MAX for a row past the end).
template <typename T, int D>
__device__ __forceinline__ void fwd_tile_setup(const T* q, int row0, int tq, int q_offset, const unsigned int* st,
                                               uint32_t (*qf)[4], float (*o)[4], float* m, float* l, int* pos,
                                               int* start) {
  const int g = (threadIdx.x & 31) >> 2;
  mma_a_global<T, D>(q, D, row0, tq, qf);
#pragma unroll
  for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    m[half] = -INFINITY;
    l[half] = 0.f;
    pos[half] = q_offset + row0 + 8 * half + g;
    start[half] = fa_start(st, row0 + 8 * half + g, tq);
  }
}
// The end of a 16-row tile (query rows row0 + 8 half + g of head h, batch bi): O / l into `out` (rows heads * D
// apart) and the base-2 logsumexp into `lse` (INFINITY for a row that saw no key).
template <typename T, int D>
__device__ __forceinline__ void fwd_store_tile(T* out, float* lse, const float (*o)[4], const float* m, const float* l,
                                               int row0, int bi, int h, int heads, int tq) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const float sum = quad_sum(l[half]);
    const int i = row0 + 8 * half + g;
    if (i >= tq) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* orow = out + (((size_t)bi * tq + i) * heads + h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * t) = pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    if (t == 0) lse[((size_t)bi * heads + h) * tq + i] = sum > 0.f ? m[half] + log2f(sum) : INFINITY;
  }
}

// Grid (ceil(tq / FwdTiles<D>::ROWS), heads, b), block 128; a warp owns 16 * FwdTiles<D>::R query rows.
template <typename T, int D>
__device__ void flash_forward_mma(const T* q, const T* k, const T* v, T* out, float* lse, int heads, int kv_heads,
                                  int tq, int tk, long long bs, long long hs, int q_offset, int window,
                                  const unsigned int* starts, float scale) {
  constexpr int N = MmaTile<D>::N, R = FwdTiles<D>::R, ROWS = FwdTiles<D>::ROWS;
  // Two buffers per tile: the next tile's copy is in flight while the products run on this one.
  __shared__ __align__(16) T ks[2][N][D + MMA_PAD];
  __shared__ __align__(16) T vs[2][N][D + MMA_PAD];
  const int warp = threadIdx.x >> 5;
  // The last rows see the most keys under the causal mask: their blocks go first, so no long block starts last.
  const FaBlock blk = fa_block_longest_first(true);
  const int h = blk.head, bi = blk.batch, first = blk.tile * ROWS, row0 = first + warp * 16 * R;
  const T* kb = k + bi * bs + (h / (heads / kv_heads)) * hs;
  const T* vb = v + bi * bs + (h / (heads / kv_heads)) * hs;
  const float c = scale * FA_LOG2E;
  const unsigned int* st = fa_row_starts(starts, bi, tq);
  uint32_t qf[R][D / 16][4];
  float o[R][D / 8][4], m[R][2], l[R][2];
  int pos[R][2], start[R][2];
#pragma unroll
  for (int r = 0; r < R; r++)
    fwd_tile_setup<T, D>(q + ((size_t)bi * heads + h) * tq * D, row0 + 16 * r, tq, q_offset, st, qf[r], o[r], m[r],
                         l[r], pos[r], start[r]);
  const int warp_first = q_offset + row0, warp_last = warp_first + 16 * R - 1;
  const int hi = min(tk, q_offset + min(first + ROWS, tq));
  const int lo = max(window > 0 ? max(0, q_offset + first - window + 1) : 0, fa_start(st, first, tq));
  if (lo < hi) kv_tiles_async<T, D, N>(kb, vb, lo, tk, ks[0], vs[0]);
  for (int j0 = lo, buf = 0; j0 < hi; j0 += N, buf ^= 1) {
    const bool next = j0 + N < hi;
    if (next) kv_tiles_async<T, D, N>(kb, vb, j0 + N, tk, ks[buf ^ 1], vs[buf ^ 1]);
    cp_async_wait(next);
    __syncthreads();
    // A tile that none of this warp's rows sees (past the causal edge of its rows, behind their window, or before
    // their examples) is skipped by the warp; the block still loads it for its other warps.
    if (fa_tile_any(warp_first, warp_last, j0, j0 + N - 1, window, fa_first_start(start[0]))) {
      float s[R][N / 8][4];
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N / 8; n++) s[r][n][0] = s[r][n][1] = s[r][n][2] = s[r][n][3] = 0.f;
      mma_abt_rows<T, D, N, R>(qf, ks[buf], s);
      float mx[R][2];
      auto mask = [&](auto masked) {
#pragma unroll
        for (int r = 0; r < R; r++)
          fwd_mask_max<decltype(masked)::value, N>(s[r], pos[r], start[r], j0, tk, window, mx[r]);
      };
      fa_tile_loop(row0 + 16 * R <= tq && j0 + N <= tk &&
                       fa_tile_visible(warp_first, warp_last, j0, j0 + N - 1, window, fa_last_start(start[R - 1])),
                   mask);
#pragma unroll
      for (int r = 0; r < R; r++) fwd_softmax_step<N, D>(s[r], o[r], m[r], l[r], mx[r], c);
      mma_pb_rows<T, D, N, R>(s, vs[buf], o);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; r++) fwd_store_tile<T, D>(out, lse, o[r], m[r], l[r], row0 + 16 * r, bi, h, heads, tq);
}

// One 16-row tile of dQ's rows row0.. (query rows of head `h`: q at rows_base, O and dO at out_base, rows heads *
// D apart): Q and dO as A fragments, and for rows g and g + 8 of the tile (row[half]) their logsumexp (li), their
// examples' starts (start, from the batch row's starts `st`: 0 unpacked, INT_MAX for a row past the end) and delta
// = rowsum(dO * O) (di; from O in dO's fragment layout: registers 0 and 2 of a fragment hold row g, 1 and 3 row
// g + 8, summed over the quad's four column pairs), which is also written to `delta` for the dK/dV kernel.
template <typename T, int D>
__device__ __forceinline__ void dq_tile_setup(const T* q, const T* out, const T* d_out, const float* lse,
                                              float* delta, const unsigned int* st, size_t rows_base, size_t out_base,
                                              int heads, int tlen, int row0, uint32_t (*qf)[4], uint32_t (*df)[4],
                                              float* li, float* di, int* row, int* start) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  mma_a_global<T, D>(q + rows_base * D, D, row0, tlen, qf);
  mma_a_global<T, D>(d_out + out_base, (long long)heads * D, row0, tlen, df);
  uint32_t of[D / 16][4];
  mma_a_global<T, D>(out + out_base, (long long)heads * D, row0, tlen, of);
  di[0] = di[1] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float2 o = unpack2<T>(of[kk][e]), d = unpack2<T>(df[kk][e]);
      di[e & 1] = fmaf(o.x, d.x, fmaf(o.y, d.y, di[e & 1]));
    }
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    row[half] = row0 + 8 * half + g;
    di[half] = quad_sum(di[half]);
    li[half] = row[half] < tlen ? lse[rows_base + row[half]] : INFINITY;
    start[half] = fa_start(st, row[half], tlen);
    if (t == 0 && row[half] < tlen) delta[rows_base + row[half]] = di[half];
  }
}

// Rows row[0], row[1] (g and g + 8 of a 16-row tile) of an accumulator acc[D/8][4], times `scale`, into `dst`'s
// rows (D elements each) that exist.
template <typename T, int D>
__device__ __forceinline__ void store_tile_rows(T* dst, const int* row, int tlen, const float (*acc)[4], float scale) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    if (row[half] >= tlen) continue;
    T* r = dst + (size_t)row[half] * D;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *reinterpret_cast<uint32_t*>(r + n * 8 + 2 * t) = pack2<T>(acc[n][2 * half] * scale, acc[n][2 * half + 1] * scale);
  }
}

// P = 2^(s * c - lse) in place of the scores of one 16-row tile of dQ (s[N/8][4]): query rows row[half] (their
// examples' start[half], INT_MAX past the end), keys j0 + column, logsumexps li; zero where masked (MASKED: the
// per-element test runs; an interior tile skips it).
template <bool MASKED, int N>
__device__ __forceinline__ void dq_scores_to_probs(float (*s)[4], const int* row, const int* start, const float* li,
                                                   int j0, int tlen, int window, float c) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < N / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int half = e >> 1, i = row[half], j = j0 + n * 8 + 2 * t + (e & 1);
      const bool keep = !MASKED || fa_visible(i, j, tlen, window, start[half]);
      s[n][e] = keep ? fa_exp2(fmaf(s[n][e], c, -li[half])) : 0.f;
    }
  }
}
// dS = P * (dP - delta) in place of P (rows' deltas di).
template <int N>
__device__ __forceinline__ void dq_probs_to_grad(float (*s)[4], const float (*dp)[4], const float* di) {
#pragma unroll
  for (int n = 0; n < N / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[n][e] = s[n][e] * (dp[n][e] - di[e >> 1]);
}
// Both: the scores of a dQ tile to dS.
template <bool MASKED, int N>
__device__ __forceinline__ void dq_scores_to_grad(float (*s)[4], const float (*dp)[4], const int* row,
                                                  const int* start, const float* li, const float* di, int j0,
                                                  int tlen, int window, float c) {
  dq_scores_to_probs<MASKED, N>(s, row, start, li, j0, tlen, window, c);
  dq_probs_to_grad<N>(s, dp, di);
}

// The same for a 16-key tile of dK/dV (keys key[half] are the rows, queries i0 + column): s becomes P^T, with the
// queries' logsumexps and their examples' starts from shared memory (ls, sts) ...
template <bool MASKED, int N>
__device__ __forceinline__ void dkv_scores_to_probs(float (*s)[4], const int* key, const float* ls, const int* sts,
                                                    int i0, int tlen, int window, float c) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < N / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int r = e >> 1, col = n * 8 + 2 * t + (e & 1), i = i0 + col;
      const bool keep = !MASKED || ((i < tlen) & fa_visible(i, key[r], tlen, window, sts[col]));
      s[n][e] = keep ? fa_exp2(fmaf(s[n][e], c, -ls[col])) : 0.f;
    }
  }
}
// ... and dp becomes dS^T = P^T * (dP^T - delta), the queries' deltas from shared memory (dls).
template <int N>
__device__ __forceinline__ void dkv_probs_to_grad(const float (*s)[4], float (*dp)[4], const float* dls) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < N / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dp[n][e] = s[n][e] * (dp[n][e] - dls[n * 8 + 2 * t + (e & 1)]);
}
template <bool MASKED, int N>
__device__ __forceinline__ void dkv_scores_to_grads(float (*s)[4], float (*dp)[4], const int* key, const float* ls,
                                                    const float* dls, const int* sts, int i0, int tlen, int window,
                                                    float c) {
  dkv_scores_to_probs<MASKED, N>(s, key, ls, sts, i0, tlen, window, c);
  dkv_probs_to_grad<N>(s, dp, dls);
}

// A dK/dV block's own 16 keys of a warp (key0..): K and V as A fragments, the dK and dV accumulators zeroed.
template <typename T, int D>
__device__ __forceinline__ void dkv_keys_setup(const T* k, const T* v, size_t kv_base, int key0, int tlen,
                                               uint32_t (*kf)[4], uint32_t (*vf)[4], float (*dka)[4], float (*dva)[4]) {
  mma_a_global<T, D>(k + kv_base * D, D, key0, tlen, kf);
  mma_a_global<T, D>(v + kv_base * D, D, key0, tlen, vf);
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
    dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
  }
}

// dQ's row tiles (QueryTiles) and keys per streamed tile: at head_dim 64 tiles of 32 keys, which keeps the scores,
// their gradient and dQ of two row tiles in registers on mma.sync; MmaTile's keys at 128.
template <int D> struct DqTiles : QueryTiles<D> {
  static constexpr int N = D == 64 ? 32 : MmaTile<D>::N;
};

// dQ, and each row's delta = rowsum(dO * O) that the softmax gradient subtracts, written to `delta` for the dK/dV
// kernel that runs next. Grid (ceil(tq / DqTiles<D>::ROWS), heads, b), block 128; a warp owns 16 * DqTiles<D>::R
// query rows. Training: tq == tk, offset 0, k/v contiguous.
template <typename T, int D>
__device__ void flash_backward_dq_mma(const T* q, const T* k, const T* v, const T* out, const T* d_out,
                                      const float* lse, float* delta, T* dq, int heads, int kv_heads, int tlen,
                                      int window, const unsigned int* starts, float scale) {
  constexpr int N = DqTiles<D>::N, R = DqTiles<D>::R, ROWS = DqTiles<D>::ROWS;
  __shared__ __align__(16) T ks[2][N][D + MMA_PAD];
  __shared__ __align__(16) T vs[2][N][D + MMA_PAD];
  const int warp = threadIdx.x >> 5;
  const FaBlock blk = fa_block_longest_first(true);
  const int h = blk.head, bi = blk.batch, first = blk.tile * ROWS, row0 = first + warp * 16 * R;
  const size_t kv_base = ((size_t)bi * kv_heads + h / (heads / kv_heads)) * tlen * D;
  const size_t rows_base = ((size_t)bi * heads + h) * tlen;
  const size_t out_base = ((size_t)bi * tlen * heads + h) * D;
  const float c = scale * FA_LOG2E;
  const unsigned int* st = fa_row_starts(starts, bi, tlen);
  uint32_t qf[R][D / 16][4], df[R][D / 16][4];
  float acc[R][D / 8][4], li[R][2], di[R][2];
  int row[R][2], start[R][2];
#pragma unroll
  for (int r = 0; r < R; r++) {
    dq_tile_setup<T, D>(q, out, d_out, lse, delta, st, rows_base, out_base, heads, tlen, row0 + 16 * r, qf[r], df[r],
                        li[r], di[r], row[r], start[r]);
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.f;
  }
  const int warp_last = row0 + 16 * R - 1;
  const int hi = min(tlen, first + ROWS);
  const int lo = max(window > 0 ? max(0, first - window + 1) : 0, fa_start(st, first, tlen));
  if (lo < hi) kv_tiles_async<T, D, N>(k + kv_base, v + kv_base, lo, tlen, ks[0], vs[0]);
  for (int j0 = lo, buf = 0; j0 < hi; j0 += N, buf ^= 1) {
    const bool next = j0 + N < hi;
    if (next) kv_tiles_async<T, D, N>(k + kv_base, v + kv_base, j0 + N, tlen, ks[buf ^ 1], vs[buf ^ 1]);
    cp_async_wait(next);
    __syncthreads();
    // A tile that none of this warp's rows sees is skipped by the warp (see the forward).
    if (fa_tile_any(row0, warp_last, j0, j0 + N - 1, window, fa_first_start(start[0]))) {
      float s[R][N / 8][4], dp[R][N / 8][4];
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N / 8; n++)
          s[r][n][0] = s[r][n][1] = s[r][n][2] = s[r][n][3] = dp[r][n][0] = dp[r][n][1] = dp[r][n][2] =
              dp[r][n][3] = 0.f;
      mma_abt_rows<T, D, N, R>(qf, ks[buf], s);
      mma_abt_rows<T, D, N, R>(df, vs[buf], dp);
      auto grad = [&](auto masked) {
#pragma unroll
        for (int r = 0; r < R; r++)
          dq_scores_to_grad<decltype(masked)::value, N>(s[r], dp[r], row[r], start[r], li[r], di[r], j0, tlen, window,
                                                        c);
      };
      fa_tile_loop(row0 + 16 * R <= tlen && j0 + N <= tlen &&
                       fa_tile_visible(row0, warp_last, j0, j0 + N - 1, window, fa_last_start(start[R - 1])),
                   grad);
      mma_pb_rows<T, D, N, R>(s, ks[buf], acc);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; r++) store_tile_rows<T, D>(dq + rows_base * D, row[r], tlen, acc[r], scale);
}

// dK and dV summed over the group's query heads. Grid (ceil(t / FA_ROWS), kv_heads, b), block 128; a warp owns
// 16 keys and streams the queries that see them.
template <typename T, int D>
__device__ void flash_backward_dkv_mma(const T* q, const T* k, const T* v, const T* d_out, const float* lse,
                                       const float* delta, T* dk, T* dv, int heads, int kv_heads, int tlen,
                                       int window, const unsigned int* starts, float scale) {
  constexpr int N = MmaTile<D>::N;
  __shared__ __align__(16) T qs[2][N][D + MMA_PAD];
  __shared__ __align__(16) T dos[2][N][D + MMA_PAD];
  __shared__ float ls[2][N], dls[2][N];
  __shared__ int sts[2][N];  // the streamed queries' starts (packed rows; zeros otherwise)
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  const FaBlock blk = fa_block_longest_first(false);
  const int kvh = blk.head, bi = blk.batch, first = blk.tile * FA_ROWS, key0 = first + warp * 16;
  const int rep = heads / kv_heads;
  const size_t kv_base = ((size_t)bi * kv_heads + kvh) * tlen;
  const float c = scale * FA_LOG2E;
  const unsigned int* row_starts = fa_row_starts(starts, bi, tlen);
  const int* st = reinterpret_cast<const int*>(row_starts);
  // Queries past the examples of the block's keys see none of them (fa_queries_end).
  const int hi = fa_queries_end(row_starts, min(first + FA_ROWS, tlen) - 1,
                                window > 0 ? min(tlen, first + FA_ROWS - 1 + window) : tlen);
  if (!st)
    for (int r = threadIdx.x; r < 2 * N; r += MMA_THREADS) sts[r / N][r % N] = 0;
  uint32_t kf[D / 16][4], vf[D / 16][4];
  float dka[D / 8][4], dva[D / 8][4];
  dkv_keys_setup<T, D>(k, v, kv_base, key0, tlen, kf, vf, dka, dva);
  const int key[2] = {key0 + g, key0 + g + 8};
  // The (query head of the group, query tile) pairs in order; the next pair's tiles, logsumexps, deltas (and
  // starts) are copied (cp.async, zeros past the end) while the products run on this one.
  const int tiles = first < hi ? (hi - first + N - 1) / N : 0, steps = rep * tiles;
  int load_head = kvh * rep, load_tile = 0;
  auto load = [&](int buf) {
    const int i0 = first + load_tile * N;
    const size_t q_base = ((size_t)bi * heads + load_head) * tlen;
    mma_rows_async<T, D, N>(q + q_base * D, D, i0, tlen, qs[buf]);
    mma_rows_async<T, D, N>(d_out + ((size_t)bi * tlen * heads + load_head) * D, (long long)heads * D, i0, tlen,
                            dos[buf]);
    for (int r = threadIdx.x; r < N; r += MMA_THREADS) {
      cp_async_4(&ls[buf][r], lse, q_base + i0 + r, i0 + r < tlen);
      cp_async_4(&dls[buf][r], delta, q_base + i0 + r, i0 + r < tlen);
      if (st) cp_async_4(&sts[buf][r], st, i0 + r, i0 + r < tlen);
    }
    cp_async_commit();
    if (++load_tile == tiles) load_tile = 0, load_head++;
  };
  if (steps > 0) load(0);
  for (int step = 0, buf = 0, i0 = first; step < steps; step++, buf ^= 1) {
    const bool next = step + 1 < steps;
    if (next) load(buf ^ 1);
    cp_async_wait(next);
    __syncthreads();
    // A packed tile whose first query (the smallest start) starts after this warp's keys is skipped by the warp (the
    // tile still matters to the block's later keys); unpacked, every start is 0 and no tile is skipped here.
    if (key0 + 15 >= sts[buf][0]) {
      float s[N / 8][4], dp[N / 8][4];
#pragma unroll
      for (int n = 0; n < N / 8; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.f;
      mma_abt<T, D, N>(kf, qs[buf], s);
      mma_abt<T, D, N>(vf, dos[buf], dp);
      auto grad = [&](auto masked) {
        dkv_scores_to_grads<decltype(masked)::value, N>(s, dp, key, ls[buf], dls[buf], sts[buf], i0, tlen, window, c);
      };
      // The tile's last query has the largest start.
      fa_tile_loop(key0 + 16 <= tlen && i0 + N <= tlen &&
                       fa_tile_visible(i0, i0 + N - 1, key0, key0 + 15, window, sts[buf][N - 1]),
                   grad);
      mma_pb<T, D, N>(s, dos[buf], dva);
      mma_pb<T, D, N>(dp, qs[buf], dka);
    }
    __syncthreads();
    i0 = i0 + N < first + tiles * N ? i0 + N : first;
  }
  store_tile_rows<T, D>(dk + kv_base * D, key, tlen, dka, scale);
  store_tile_rows<T, D>(dv + kv_base * D, key, tlen, dva, 1.f);
}

#include "flash_attention_wgmma.cuh"
