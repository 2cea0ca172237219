// Hopper warpgroup-MMA (wgmma, sm_90a) versions of the fused attention kernels, included by
// flash_attention_mma.cuh: the contract, layouts and arithmetic of flash_forward_mma / flash_backward_dq_mma /
// flash_backward_dkv_mma (outputs bit-identical), with every product on wgmma (flash_wgmma_ops.cuh), at head_dim
// 64 and 128 (dK/dV at 128 reads K and V from shared memory: with dK and dV they would not fit one warpgroup's
// registers). A block is one warpgroup (the 4 warps of MMA_THREADS); A operands sit in registers in
// mma.m16n8k16's A fragment layout (each warp 16 rows of a 64-row tile), B is read by the tensor cores straight
// from shared memory, once per warpgroup instead of once per warp through ldmatrix, which bounds the mma.sync
// kernels. Accumulators come back in mma's accumulator layout, so the element-wise code is shared. Products go
// out in several commit groups so the element-wise work on one product's result overlaps the next product
// (wg_wait<N>). Every key tile is computed, also past the causal edge (masked): products under a data-dependent
// branch make ptxas serialize them ("C7514" with -Xptxas -v). Packed rows' starts bound the loops and enter the masks
// and the interior test as in the mma.sync kernels; a tile before some of a block's rows' examples is computed and
// masked for them like one past their causal edge.
//
// Compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL: build.rs also asks nvcc for compute_90a on capability
// 9.0, and launch.rs `ptx` loads that build on 9.0 devices only); other targets keep mma.sync.

// Dynamic shared memory of the head_dim 128 dK/dV kernel on sm_90a (its Tiles, 66,560 bytes, and 1024 bytes of
// slack to align them); attention.rs asks for the same (WGMMA_DKV128_SMEM).
#define FA_WG_DKV128_SMEM 67584

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_WGMMA 1

#include "flash_wgmma_ops.cuh"

// The forward of flash_forward_mma on wgmma: a block is one warpgroup owning FwdTiles<D>::ROWS query rows as
// FwdTiles<D>::R tiles of 64 (Q as A in registers), over tiles of MmaTile<D>::N keys. All tiles' scores are issued
// at once, each as its own group; each tile's softmax then runs while the tensor cores work on a later tile's
// scores or an earlier tile's P V. R is 1 (QueryTiles): the overlap comes from the blocks that share an SM.
// Grid (ceil(tq / FwdTiles<D>::ROWS), heads, b), block MMA_THREADS.
template <typename T, int D>
__device__ void flash_forward_wgmma(const T* q, const T* k, const T* v, T* out, float* lse, int heads, int kv_heads,
                                    int tq, int tk, long long bs, long long hs, int q_offset, int window,
                                    const unsigned int* starts, float scale) {
  constexpr int N = MmaTile<D>::N, R = FwdTiles<D>::R, ROWS = FwdTiles<D>::ROWS;
  static_assert(ROWS == 64 * R, "a warpgroup's tiles are 64 rows");
  __shared__ __align__(1024) T ks[2][N * D];
  __shared__ __align__(1024) T vs[2][N * D];
  const int warp = threadIdx.x >> 5;
  const FaBlock blk = fa_block_longest_first(true);
  const int h = blk.head, bi = blk.batch, first = blk.tile * ROWS;
  const T* kb = k + bi * bs + (h / (heads / kv_heads)) * hs;
  const T* vb = v + bi * bs + (h / (heads / kv_heads)) * hs;
  const float c = scale * FA_LOG2E;
  const unsigned int* st = fa_row_starts(starts, bi, tq);
  uint32_t qf[R][D / 16][4];
  float o[R][D / 8][4], m[R][2], l[R][2];
  int pos[R][2], start[R][2];
#pragma unroll
  for (int r = 0; r < R; r++)
    fwd_tile_setup<T, D>(q + ((size_t)bi * heads + h) * tq * D, first + 64 * r + 16 * warp, tq, q_offset, st, qf[r],
                         o[r], m[r], l[r], pos[r], start[r]);
  const int hi = min(tk, q_offset + min(first + ROWS, tq));
  const int lo = max(window > 0 ? max(0, q_offset + first - window + 1) : 0, fa_start(st, first, tq));
  if (lo < hi) wg_kv_tiles_async<T, N, D>(kb, vb, lo, tk, ks[0], vs[0]);
  for (int j0 = lo, buf = 0; j0 < hi; j0 += N, buf ^= 1) {
    const bool next = j0 + N < hi;
    if (next) wg_kv_tiles_async<T, N, D>(kb, vb, j0 + N, tk, ks[buf ^ 1], vs[buf ^ 1]);
    wg_tiles_ready(next);
    const char* kt = reinterpret_cast<const char*>(ks[buf]);
    const char* vt = reinterpret_cast<const char*>(vs[buf]);
    float s[R][N / 8][4];
    uint32_t pa[R][N / 16][4];
#pragma unroll
    for (int r = 0; r < R; r++) {
      wg_fence();
      wg_abt<T, N, D>(s[r], qf[r], kt);
      wg_commit();
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      // Groups still allowed in flight: the later tiles' scores and the earlier tiles' P V.
      wg_wait<R - 1>();
      wg_hold<N>(s[r]);
      if (r > 0) wg_keep<N / 16>(pa[r - 1]);
      const int row0 = first + 64 * r + 16 * warp, warp_pos = q_offset + row0;
      float mx[2];
      auto mask = [&](auto masked) {
        fwd_mask_max<decltype(masked)::value, N>(s[r], pos[r], start[r], j0, tk, window, mx);
      };
      fa_tile_loop(row0 + 16 <= tq && j0 + N <= tk &&
                       fa_tile_visible(warp_pos, warp_pos + 15, j0, j0 + N - 1, window, fa_last_start(start[r])),
                   mask);
      fwd_softmax_step<N, D>(s[r], o[r], m[r], l[r], mx, c);
      wg_pb_group<T, N, D>(o[r], s[r], pa[r], vt);
    }
    wg_drain<R, N, D>(o, pa);
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; r++)
    fwd_store_tile<T, D>(out, lse, o[r], m[r], l[r], first + 64 * r + 16 * warp, bi, h, heads, tq);
}

// dQ (and each row's delta) of flash_backward_dq_mma at head_dim 64 on wgmma: a block is one warpgroup owning
// DqTiles<64>::ROWS query rows as DqTiles<64>::R tiles of 64 (one: see QueryTiles; Q, dO as A in registers), taken
// one after the other over each 64-key tile of K and V in shared memory: S = Q K^T and dP = dO V^T read both
// K-major, dQ += dS K reads K MN-major. Every key tile is computed for every row tile, also past the causal edge
// (masked): products under a data-dependent branch make ptxas serialize them. Grid (ceil(tq / DqTiles<64>::ROWS),
// heads, b), block MMA_THREADS.
template <typename T, int D>
__device__ void flash_backward_dq_wgmma(const T* q, const T* k, const T* v, const T* out, const T* d_out,
                                        const float* lse, float* delta, T* dq, int heads, int kv_heads, int tlen,
                                        int window, const unsigned int* starts, float scale) {
  // Keys per tile: 64 at head_dim 64 (the mma.sync kernel's 32 are for its registers), MmaTile's 32 at 128.
  constexpr int N = D == 64 ? 64 : MmaTile<D>::N, R = DqTiles<D>::R, ROWS = DqTiles<D>::ROWS;
  static_assert(ROWS == 64 * R, "a warpgroup's tiles are 64 rows");
  __shared__ __align__(1024) T ks[2][N * D];
  __shared__ __align__(1024) T vs[2][N * D];
  const int warp = threadIdx.x >> 5;
  const FaBlock blk = fa_block_longest_first(true);
  const int h = blk.head, bi = blk.batch, first = blk.tile * ROWS;
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
    dq_tile_setup<T, D>(q, out, d_out, lse, delta, st, rows_base, out_base, heads, tlen, first + 64 * r + 16 * warp,
                        qf[r], df[r], li[r], di[r], row[r], start[r]);
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.f;
  }
  const int hi = min(tlen, first + ROWS);
  const int lo = max(window > 0 ? max(0, first - window + 1) : 0, fa_start(st, first, tlen));
  if (lo < hi) wg_kv_tiles_async<T, N, D>(k + kv_base, v + kv_base, lo, tlen, ks[0], vs[0]);
  for (int j0 = lo, buf = 0; j0 < hi; j0 += N, buf ^= 1) {
    const bool next = j0 + N < hi;
    if (next) wg_kv_tiles_async<T, N, D>(k + kv_base, v + kv_base, j0 + N, tlen, ks[buf ^ 1], vs[buf ^ 1]);
    wg_tiles_ready(next);
    const char* kt = reinterpret_cast<const char*>(ks[buf]);
    const char* vt = reinterpret_cast<const char*>(vs[buf]);
    // Row tile r's S and dP go out as two groups: P is computed while dP is still on the tensor cores; tile r's
    // dQ product is still running while tile r + 1's S and dP are issued (its A operand kept in registers).
    uint32_t da[R][N / 16][4];
#pragma unroll
    for (int r = 0; r < R; r++) {
      float s[N / 8][4], dp[N / 8][4];
      wg_fence();
      wg_abt<T, N, D>(s, qf[r], kt);
      wg_commit();
      wg_abt<T, N, D>(dp, df[r], vt);
      wg_commit();
      wg_wait<1>();
      wg_hold<N>(s);
      const int row0 = first + 64 * r + 16 * warp;
      auto probs = [&](auto masked) {
        dq_scores_to_probs<decltype(masked)::value, N>(s, row[r], start[r], li[r], j0, tlen, window, c);
      };
      fa_tile_loop(row0 + 16 <= tlen && j0 + N <= tlen &&
                       fa_tile_visible(row0, row0 + 15, j0, j0 + N - 1, window, fa_last_start(start[r])),
                   probs);
      wg_wait<0>();
      wg_hold<N>(dp);
      if (r > 0) wg_keep<N / 16>(da[r - 1]);
      dq_probs_to_grad<N>(s, dp, di[r]);
      wg_pb_group<T, N, D>(acc[r], s, da[r], kt);
    }
    wg_drain<R, N, D>(acc, da);
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; r++) store_tile_rows<T, D>(dq + rows_base * D, row[r], tlen, acc[r], scale);
}

// dK and dV of flash_backward_dkv_mma on wgmma: a block is one warpgroup owning 64 keys (16 a warp); the query
// tiles of the group's heads (MmaTile<D>::N queries each) stream through shared memory in the swizzled layout, read
// K-major by S^T = K Q^T and dP^T = V dO^T and MN-major (the same tile) by dV += P^T dO and dK += dS^T Q. K and V
// are the first products' A: in registers at head_dim 64; at 128 (where they and the dK, dV accumulators would not
// fit the registers) in shared memory, read by the tensor cores, and the block's shared memory is dynamic
// (FA_WG_DKV128_SMEM bytes, over the 48 KiB a static allocation may take). Grid (ceil(t / 64), kv_heads, b), block
// MMA_THREADS.
template <typename T, int D>
__device__ void flash_backward_dkv_wgmma(const T* q, const T* k, const T* v, const T* d_out, const float* lse,
                                         const float* delta, T* dk, T* dv, int heads, int kv_heads, int tlen,
                                         int window, const unsigned int* starts, float scale) {
  constexpr int N = MmaTile<D>::N;
  constexpr bool KV_SHARED = D == 128;
  struct Tiles {
    T q[2][N * D], d_out[2][N * D];
    float lse[2][N], delta[2][N];
    int start[2][N];  // the streamed queries' starts (packed rows; zeros otherwise)
    __align__(1024) T k[KV_SHARED ? 64 * D : 1];
    __align__(1024) T v[KV_SHARED ? 64 * D : 1];
  };
  Tiles* sm;
  if constexpr (KV_SHARED) {
    static_assert(sizeof(Tiles) + 1024 <= FA_WG_DKV128_SMEM, "the launch's dynamic shared memory");
    extern __shared__ char fa_dynamic_smem[];
    // Dynamic shared memory is 16-byte aligned; the swizzled tiles need 1024 (FA_WG_DKV128_SMEM has the slack).
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(fa_dynamic_smem));
    sm = reinterpret_cast<Tiles*>(fa_dynamic_smem + (((at + 1023) & ~1023u) - at));
  } else {
    __shared__ __align__(1024) Tiles tiles;
    sm = &tiles;
  }
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  const FaBlock blk = fa_block_longest_first(false);
  const int kvh = blk.head, bi = blk.batch, first = blk.tile * FA_ROWS, key0 = first + warp * 16;
  const int rep = heads / kv_heads;
  const size_t kv_base = ((size_t)bi * kv_heads + kvh) * tlen;
  const float c = scale * FA_LOG2E;
  uint32_t kf[KV_SHARED ? 1 : D / 16][4], vf[KV_SHARED ? 1 : D / 16][4];
  float dka[D / 8][4], dva[D / 8][4];
  if constexpr (KV_SHARED) {
    wg_tile_async<T, 64, D>(k + kv_base * D, D, first, tlen, sm->k);
    wg_tile_async<T, 64, D>(v + kv_base * D, D, first, tlen, sm->v);
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
  } else {
    dkv_keys_setup<T, D>(k, v, kv_base, key0, tlen, kf, vf, dka, dva);
  }
  const int key[2] = {key0 + g, key0 + g + 8};
  const unsigned int* row_starts = fa_row_starts(starts, bi, tlen);
  const int* st = reinterpret_cast<const int*>(row_starts);
  // Queries past the examples of the block's keys see none of them (fa_queries_end).
  const int hi = fa_queries_end(row_starts, min(first + FA_ROWS, tlen) - 1,
                                window > 0 ? min(tlen, first + FA_ROWS - 1 + window) : tlen);
  if (!st)
    for (int r = threadIdx.x; r < 2 * N; r += MMA_THREADS) sm->start[r / N][r % N] = 0;
  const int tiles = first < hi ? (hi - first + N - 1) / N : 0, steps = rep * tiles;
  int load_head = kvh * rep, load_tile = 0;
  auto load = [&](int buf) {
    const int i0 = first + load_tile * N;
    const size_t q_base = ((size_t)bi * heads + load_head) * tlen;
    wg_tile_async<T, N, D>(q + q_base * D, D, i0, tlen, sm->q[buf]);
    wg_tile_async<T, N, D>(d_out + ((size_t)bi * tlen * heads + load_head) * D, (long long)heads * D, i0, tlen,
                           sm->d_out[buf]);
    for (int r = threadIdx.x; r < N; r += MMA_THREADS) {
      cp_async_4(&sm->lse[buf][r], lse, q_base + i0 + r, i0 + r < tlen);
      cp_async_4(&sm->delta[buf][r], delta, q_base + i0 + r, i0 + r < tlen);
      if (st) cp_async_4(&sm->start[buf][r], st, i0 + r, i0 + r < tlen);
    }
    cp_async_commit();
    if (++load_tile == tiles) load_tile = 0, load_head++;
  };
  if (steps > 0) load(0);  // (with K and V at head_dim 128: one group)
  for (int step = 0, buf = 0, i0 = first; step < steps; step++, buf ^= 1) {
    const bool next = step + 1 < steps;
    if (next) load(buf ^ 1);
    wg_tiles_ready(next);
    const char* qt = reinterpret_cast<const char*>(sm->q[buf]);
    const char* dot = reinterpret_cast<const char*>(sm->d_out[buf]);
    // S^T and dP^T go out as two groups: P^T is computed while dP^T is on the tensor cores, and dV's product runs
    // while dS^T is computed.
    float s[N / 8][4], dp[N / 8][4];
    wg_fence();
    if constexpr (KV_SHARED) {
      const char *kt = reinterpret_cast<const char*>(sm->k), *vt = reinterpret_cast<const char*>(sm->v);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) wgmma_64x32_ss<T>(s, wg_desc_k<64>(kt, kk), wg_desc_k<N>(qt, kk), kk > 0);
      wg_commit();
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) wgmma_64x32_ss<T>(dp, wg_desc_k<64>(vt, kk), wg_desc_k<N>(dot, kk), kk > 0);
    } else {
      wg_abt<T, N, D>(s, kf, qt);
      wg_commit();
      wg_abt<T, N, D>(dp, vf, dot);
    }
    wg_commit();
    wg_wait<1>();
    wg_hold<N>(s);
    auto probs = [&](auto masked) {
      dkv_scores_to_probs<decltype(masked)::value, N>(s, key, sm->lse[buf], sm->start[buf], i0, tlen, window, c);
    };
    // The tile's last query has the largest start.
    fa_tile_loop(key0 + 16 <= tlen && i0 + N <= tlen &&
                     fa_tile_visible(i0, i0 + N - 1, key0, key0 + 15, window, sm->start[buf][N - 1]),
                 probs);
    uint32_t pa[N / 16][4], da[N / 16][4];
    wg_pb_group<T, N, D>(dva, s, pa, dot);  // dO and Q are B here, read MN-major
    wg_wait<1>();
    wg_hold<N>(dp);
    dkv_probs_to_grad<N>(s, dp, sm->delta[buf]);
    wg_pb_group<T, N, D>(dka, dp, da, qt);
    wg_wait<0>();
    wg_hold<D>(dva);
    wg_hold<D>(dka);
    wg_keep<N / 16>(pa);
    wg_keep<N / 16>(da);
    __syncthreads();
    i0 = i0 + N < first + tiles * N ? i0 + N : first;
  }
  store_tile_rows<T, D>(dk + kv_base * D, key, tlen, dka, scale);
  store_tile_rows<T, D>(dv + kv_base * D, key, tlen, dva, 1.f);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
