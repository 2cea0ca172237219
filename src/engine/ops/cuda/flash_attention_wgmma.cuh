// Hopper warpgroup-MMA (wgmma, sm_90a) versions of the fused attention's forward, dQ and dK/dV at head_dim 64,
// included by flash_attention_mma.cuh: the contract, layouts and arithmetic of flash_forward_mma /
// flash_backward_dq_mma / flash_backward_dkv_mma (outputs bit-identical), with every product on wgmma m64n64k16.
// A block is one warpgroup (the 4 warps of MMA_THREADS); A operands sit in registers in mma.m16n8k16's A fragment
// layout (each warp 16 rows of a 64-row tile), B is read by the tensor cores straight from shared memory, once per
// warpgroup instead of once per warp through ldmatrix, which bounds the mma.sync kernels. Accumulators come back
// in mma's accumulator layout, so the element-wise code is shared. Products go out in several commit groups so
// the element-wise work on one product's result overlaps the next product (wg_wait<N>).
//
// Streamed tiles of 64 rows x 64 elements sit in shared memory in wgmma's 128-byte swizzled layout: rows of 128
// bytes, row r's 16-byte chunk c at r * 128 + (c ^ (r % 8)) * 16, the tile 1024-byte aligned. (The non-swizzled
// canonical layout measured 14-19% slower in dQ and dK/dV: the tensor cores' reads of it conflict in banks.) Read
// K-major (the tile's rows are B's N, its columns B's K: S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T), the
// k16 slice kk starts 32 bytes into the rows; read MN-major from the same copy (the rows are B's K: O += P V, dQ +=
// dS K, dV += P^T dO, dK += dS^T Q), the slice of 16 rows kc starts at kc * 2048; 8-row groups are 1024 bytes
// apart in both (wg_desc_k, wg_desc_mn).
//
// Compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL: build.rs also asks nvcc for compute_90a on capability
// 9.0, and cuda_kernels::launch::ptx loads that build on 9.0 devices only); other targets keep mma.sync.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_WGMMA 1

// A shared-memory matrix descriptor with 128-byte swizzling (layout type 1 in bits 62-63) for the tile at `tile`.
__device__ __forceinline__ uint64_t wg_desc(const void* tile, unsigned lead_bytes, unsigned stride_bytes) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lead_bytes >> 4) << 16) | ((uint64_t)(stride_bytes >> 4) << 32) |
         (1ull << 62);
}
// B read K-major from a 64 x 64 tile (its rows are B's N, its columns B's K), the k16 slice kk: 32 bytes into each
// 128-byte row (the hardware applies the swizzle to the address), 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t wg_desc_k(const char* tile, int kk) { return wg_desc(tile + kk * 32, 16, 1024); }
// B read MN-major from the same tile (its rows are B's K, its columns B's N), the slice of 16 rows kc: 2048 bytes
// in; 8-row groups 1024 bytes apart (the one 64-element swizzle atom along N needs no lead offset).
__device__ __forceinline__ uint64_t wg_desc_mn(const char* tile, int kc) { return wg_desc(tile + kc * 2048, 8192, 1024); }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Wait until at most `N` of the most recently committed groups are in flight (groups finish in order).
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the A operands `a` of products still in flight in their registers until here (the compiler sees an asm
// statement read them at issue and could otherwise reuse the registers before the tensor cores are done).
template <int K> __device__ __forceinline__ void wg_keep(const uint32_t (*a)[4]) {
#pragma unroll
  for (int k = 0; k < K; k++) asm volatile("" ::"r"(a[k][0]), "r"(a[k][1]), "r"(a[k][2]), "r"(a[k][3]) : "memory");
}
// An accumulator tile (N/8 x 4 f32 in mma's layout) packed to 16 bits as the A operand of a product over its N
// columns (N/16 k16 slices).
template <typename T, int N> __device__ __forceinline__ void wg_pack_a(const float (*s)[4], uint32_t (*a)[4]) {
#pragma unroll
  for (int kc = 0; kc < N / 16; kc++) {
    a[kc][0] = pack2<T>(s[2 * kc][0], s[2 * kc][1]);
    a[kc][1] = pack2<T>(s[2 * kc][2], s[2 * kc][3]);
    a[kc][2] = pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
    a[kc][3] = pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
  }
}
// Tells the compiler an accumulator's registers changed behind its back (after wg_wait_all), so no read of them
// is moved across the wait.
__device__ __forceinline__ void wg_hold(float (*d)[4]) {
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}
// Shared memory written through the generic proxy (cp.async, plain stores) made visible to wgmma's reads.
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define WG_ACC32                                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_ACC_OUT(d)                                                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),     \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define WG_MMA(TYPES)                                                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                    \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " " WG_ACC32                                \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                               \
               : WG_ACC_OUT(d)                                                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(TRANS_B))

// d (64 x 64 over the warpgroup, [8][4] per thread in mma's accumulator layout) = A B + (accumulate ? d : 0) for
// A (64 x 16) in registers and B (16 x 64) in shared memory at `desc`; TRANS_B 1 reads B MN-major.
template <typename T, int TRANS_B>
__device__ __forceinline__ void wgmma_64x64x16(float (*d)[4], const uint32_t* a, uint64_t desc, int accumulate) {
  if constexpr (std::is_same<T, __half>::value)
    WG_MMA("f16.f16");
  else
    WG_MMA("bf16.bf16");
}

// Byte offset of row `r`'s 8-element chunk `c` in a 64 x 64 tile with 128-byte swizzling: rows of 128 bytes, the
// chunks of row r permuted by r % 8 (so the 8 rows of a group read or written at one column hit distinct banks).
__device__ __forceinline__ unsigned wg_chunk(int r, int c) { return (r << 7) | ((c ^ (r & 7)) << 4); }

// 64 rows first.. of `src` (row stride `stride`, 64 elements each) into the swizzled tile (zeros past `limit`):
// cp.async of 16 bytes when rows are 16-byte aligned (the caller commits and waits), plain 4-byte loads otherwise.
template <typename T>
__device__ __forceinline__ void wg_tile_async(const T* src, long long stride, int first, int limit, T* tile) {
  char* base = reinterpret_cast<char*>(tile);
  if (rows_aligned16(src, stride)) {
#pragma unroll 1
    for (int k = 0; k < 64 * 8 / MMA_THREADS; k++) {
      const int idx = threadIdx.x + k * MMA_THREADS, r = idx >> 3, c = idx & 7, row = first + r;
      const T* from = row < limit ? src + row * stride + c * 8 : src;
      const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(base + wg_chunk(r, c)));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(row < limit ? 16 : 0));
    }
    return;
  }
#pragma unroll 1
  for (int k = 0; k < 64 * 32 / MMA_THREADS; k++) {
    const int idx = threadIdx.x + k * MMA_THREADS, r = idx >> 5, e = (idx & 31) * 2, row = first + r;
    *reinterpret_cast<uint32_t*>(base + wg_chunk(r, e >> 3) + (e & 7) * 2) =
        row < limit ? ld2(src + row * stride + e) : 0u;
  }
}

// The forward of flash_forward_mma at head_dim 64 on wgmma: a block is one warpgroup owning FwdTiles<64>::ROWS =
// 128 query rows as two tiles of 64 (Q as A in registers). Both tiles' scores are issued at once, each as its own
// group; each tile's softmax then runs while the tensor cores work on the other tile's scores or the first tile's
// P V. Every key tile is computed, also past the causal edge (masked): products under a data-dependent branch make
// ptxas serialize them. Grid (ceil(tq / 128), heads, b), block MMA_THREADS.
template <typename T>
__device__ void flash_forward_wgmma(const T* q, const T* k, const T* v, T* out, float* lse, int heads, int kv_heads,
                                    int tq, int tk, long long bs, long long hs, int q_offset, int window,
                                    float scale) {
  constexpr int D = 64, N = 64, R = 2, ROWS = 128;
  static_assert(FwdTiles<D>::ROWS == ROWS, "the grid's rows per block");
  __shared__ __align__(1024) T ks[2][N * D];
  __shared__ __align__(1024) T vs[2][N * D];
  const int warp = threadIdx.x >> 5;
  const FaBlock blk = fa_block_longest_first(true);
  const int h = blk.head, bi = blk.batch, first = blk.tile * ROWS;
  const T* kb = k + bi * bs + (h / (heads / kv_heads)) * hs;
  const T* vb = v + bi * bs + (h / (heads / kv_heads)) * hs;
  const float c = scale * FA_LOG2E;
  uint32_t qf[R][D / 16][4];
  float o[R][D / 8][4], m[R][2], l[R][2];
  int pos[R][2];
  bool valid[R][2];
#pragma unroll
  for (int r = 0; r < R; r++)
    fwd_tile_setup<T, D>(q + ((size_t)bi * heads + h) * tq * D, first + 64 * r + 16 * warp, tq, q_offset, qf[r], o[r],
                         m[r], l[r], pos[r], valid[r]);
  const int hi = min(tk, q_offset + min(first + ROWS, tq));
  const int lo = window > 0 ? max(0, q_offset + first - window + 1) : 0;
  auto load = [&](int j0, int buf) {
    wg_tile_async<T>(kb, D, j0, tk, ks[buf]);
    wg_tile_async<T>(vb, D, j0, tk, vs[buf]);
    cp_async_commit();
  };
  if (lo < hi) load(lo, 0);
  for (int j0 = lo, buf = 0; j0 < hi; j0 += N, buf ^= 1) {
    const bool next = j0 + N < hi;
    if (next) load(j0 + N, buf ^ 1);
    cp_async_wait(next);
    wg_proxy_fence();
    __syncthreads();
    const char* kt = reinterpret_cast<const char*>(ks[buf]);
    const char* vt = reinterpret_cast<const char*>(vs[buf]);
    float s[R][N / 8][4];
    uint32_t pa[R][N / 16][4];
#pragma unroll
    for (int r = 0; r < R; r++) {
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) wgmma_64x64x16<T, 0>(s[r], qf[r][kk], wg_desc_k(kt, kk), kk > 0);
      wg_commit();
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      // Groups still allowed in flight: the other tile's scores (r = 0), or the first tile's P V (r = 1).
      wg_wait<1>();
      wg_hold(s[r]);
      if (r > 0) wg_keep<N / 16>(pa[r - 1]);
      const int row0 = first + 64 * r + 16 * warp, warp_pos = q_offset + row0;
      float mx[2];
      auto mask = [&](auto masked) {
        fwd_mask_max<decltype(masked)::value, N>(s[r], pos[r], valid[r], j0, tk, window, mx);
      };
      fa_tile_loop(row0 + 16 <= tq && j0 + N <= tk && fa_tile_visible(warp_pos, warp_pos + 15, j0, j0 + N - 1, window),
                   mask);
      fwd_softmax_step<N, D>(s[r], o[r], m[r], l[r], mx, c);
      wg_pack_a<T, N>(s[r], pa[r]);
      wg_fence();
#pragma unroll
      for (int kc = 0; kc < N / 16; kc++) wgmma_64x64x16<T, 1>(o[r], pa[r][kc], wg_desc_mn(vt, kc), 1);
      wg_commit();
    }
    wg_wait<0>();
#pragma unroll
    for (int r = 0; r < R; r++) {
      wg_hold(o[r]);
      wg_keep<N / 16>(pa[r]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; r++)
    fwd_store_tile<T, D>(out, lse, o[r], m[r], l[r], valid[r], first + 64 * r + 16 * warp, bi, h, heads, tq);
}

// dQ (and each row's delta) of flash_backward_dq_mma at head_dim 64 on wgmma: a block is one warpgroup owning
// DqTiles<64>::ROWS = 128 query rows as two tiles of 64 (Q, dO as A in registers), taken one after the other over
// each 64-key tile of K and V in shared memory: S = Q K^T and dP = dO V^T read both K-major, dQ += dS K reads K
// MN-major. Every key tile is computed for both row tiles, also past the causal edge (masked): products under a
// data-dependent branch make ptxas serialize them. Grid (ceil(tq / 128), heads, b), block MMA_THREADS.
template <typename T>
__device__ void flash_backward_dq_wgmma(const T* q, const T* k, const T* v, const T* out, const T* d_out,
                                        const float* lse, float* delta, T* dq, int heads, int kv_heads, int tlen,
                                        int window, float scale) {
  constexpr int D = 64, N = 64, R = 2, ROWS = 128;
  static_assert(DqTiles<D>::ROWS == ROWS, "the grid's rows per block");
  __shared__ __align__(1024) T ks[2][N * D];
  __shared__ __align__(1024) T vs[2][N * D];
  const int warp = threadIdx.x >> 5;
  const FaBlock blk = fa_block_longest_first(true);
  const int h = blk.head, bi = blk.batch, first = blk.tile * ROWS;
  const size_t kv_base = ((size_t)bi * kv_heads + h / (heads / kv_heads)) * tlen * D;
  const size_t rows_base = ((size_t)bi * heads + h) * tlen;
  const size_t out_base = ((size_t)bi * tlen * heads + h) * D;
  const float c = scale * FA_LOG2E;
  uint32_t qf[R][D / 16][4], df[R][D / 16][4];
  float acc[R][D / 8][4], li[R][2], di[R][2];
  int row[R][2];
#pragma unroll
  for (int r = 0; r < R; r++) {
    dq_tile_setup<T, D>(q, out, d_out, lse, delta, rows_base, out_base, heads, tlen, first + 64 * r + 16 * warp, qf[r],
                        df[r], li[r], di[r], row[r]);
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.f;
  }
  const int hi = min(tlen, first + ROWS);
  const int lo = window > 0 ? max(0, first - window + 1) : 0;
  auto load = [&](int j0, int buf) {
    wg_tile_async<T>(k + kv_base, D, j0, tlen, ks[buf]);
    wg_tile_async<T>(v + kv_base, D, j0, tlen, vs[buf]);
    cp_async_commit();
  };
  if (lo < hi) load(lo, 0);
  for (int j0 = lo, buf = 0; j0 < hi; j0 += N, buf ^= 1) {
    const bool next = j0 + N < hi;
    if (next) load(j0 + N, buf ^ 1);
    cp_async_wait(next);
    wg_proxy_fence();
    __syncthreads();
    const char* kt = reinterpret_cast<const char*>(ks[buf]);
    const char* vt = reinterpret_cast<const char*>(vs[buf]);
    // Row tile r's S and dP go out as two groups: P is computed while dP is still on the tensor cores; tile r's
    // dQ product is still running while tile r + 1's S and dP are issued (its A operand kept in registers).
    uint32_t da[R][N / 16][4];
#pragma unroll
    for (int r = 0; r < R; r++) {
      float s[N / 8][4], dp[N / 8][4];
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) wgmma_64x64x16<T, 0>(s, qf[r][kk], wg_desc_k(kt, kk), kk > 0);
      wg_commit();
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) wgmma_64x64x16<T, 0>(dp, df[r][kk], wg_desc_k(vt, kk), kk > 0);
      wg_commit();
      wg_wait<1>();
      wg_hold(s);
      const int row0 = first + 64 * r + 16 * warp;
      auto probs = [&](auto masked) {
        dq_scores_to_probs<decltype(masked)::value, N>(s, row[r], li[r], j0, tlen, window, c);
      };
      fa_tile_loop(row0 + 16 <= tlen && j0 + N <= tlen && fa_tile_visible(row0, row0 + 15, j0, j0 + N - 1, window),
                   probs);
      wg_wait<0>();
      wg_hold(dp);
      if (r > 0) wg_keep<N / 16>(da[r - 1]);
      dq_probs_to_grad<N>(s, dp, di[r]);
      wg_pack_a<T, N>(s, da[r]);
      wg_fence();
#pragma unroll
      for (int kc = 0; kc < N / 16; kc++) wgmma_64x64x16<T, 1>(acc[r], da[r][kc], wg_desc_mn(kt, kc), 1);
      wg_commit();
    }
    wg_wait<0>();
#pragma unroll
    for (int r = 0; r < R; r++) {
      wg_hold(acc[r]);
      wg_keep<N / 16>(da[r]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; r++) store_tile_rows<T, D>(dq + rows_base * D, row[r], tlen, acc[r], scale);
}

// dK and dV of flash_backward_dkv_mma at head_dim 64 on wgmma: a block is one warpgroup owning 64 keys (16 a warp,
// K and V as A in registers); the query tiles of the group's heads stream through shared memory in the swizzled
// layout, read K-major by S^T = K Q^T and dP^T = V dO^T and MN-major (the same tile, the two strides swapped) by
// dV += P^T dO and dK += dS^T Q. Grid (ceil(t / 64), kv_heads, b), block MMA_THREADS.
template <typename T>
__device__ void flash_backward_dkv_wgmma(const T* q, const T* k, const T* v, const T* d_out, const float* lse,
                                         const float* delta, T* dk, T* dv, int heads, int kv_heads, int tlen,
                                         int window, float scale) {
  constexpr int D = 64, N = 64;
  __shared__ __align__(1024) T qs[2][N * D];
  __shared__ __align__(1024) T dos[2][N * D];
  __shared__ float ls[2][N], dls[2][N];
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  const FaBlock blk = fa_block_longest_first(false);
  const int kvh = blk.head, bi = blk.batch, first = blk.tile * FA_ROWS, key0 = first + warp * 16;
  const int rep = heads / kv_heads;
  const size_t kv_base = ((size_t)bi * kv_heads + kvh) * tlen;
  const float c = scale * FA_LOG2E;
  uint32_t kf[D / 16][4], vf[D / 16][4];
  float dka[D / 8][4], dva[D / 8][4];
  dkv_keys_setup<T, D>(k, v, kv_base, key0, tlen, kf, vf, dka, dva);
  const int key[2] = {key0 + g, key0 + g + 8};
  const int hi = window > 0 ? min(tlen, first + FA_ROWS - 1 + window) : tlen;
  const int tiles = first < hi ? (hi - first + N - 1) / N : 0, steps = rep * tiles;
  int load_head = kvh * rep, load_tile = 0;
  auto load = [&](int buf) {
    const int i0 = first + load_tile * N;
    const size_t q_base = ((size_t)bi * heads + load_head) * tlen;
    wg_tile_async<T>(q + q_base * D, D, i0, tlen, qs[buf]);
    wg_tile_async<T>(d_out + ((size_t)bi * tlen * heads + load_head) * D, (long long)heads * D, i0, tlen,
                           dos[buf]);
    for (int r = threadIdx.x; r < N; r += MMA_THREADS) {
      cp_async_f32(&ls[buf][r], lse, q_base + i0 + r, i0 + r < tlen);
      cp_async_f32(&dls[buf][r], delta, q_base + i0 + r, i0 + r < tlen);
    }
    cp_async_commit();
    if (++load_tile == tiles) load_tile = 0, load_head++;
  };
  if (steps > 0) load(0);
  for (int step = 0, buf = 0, i0 = first; step < steps; step++, buf ^= 1) {
    const bool next = step + 1 < steps;
    if (next) load(buf ^ 1);
    cp_async_wait(next);
    wg_proxy_fence();
    __syncthreads();
    const char* qt = reinterpret_cast<const char*>(qs[buf]);
    const char* dot = reinterpret_cast<const char*>(dos[buf]);
    // S^T and dP^T go out as two groups: P^T is computed while dP^T is on the tensor cores, and dV's product runs
    // while dS^T is computed.
    float s[N / 8][4], dp[N / 8][4];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_64x64x16<T, 0>(s, kf[kk], wg_desc_k(qt, kk), kk > 0);
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_64x64x16<T, 0>(dp, vf[kk], wg_desc_k(dot, kk), kk > 0);
    wg_commit();
    wg_wait<1>();
    wg_hold(s);
    auto probs = [&](auto masked) {
      dkv_scores_to_probs<decltype(masked)::value, N>(s, key, ls[buf], i0, tlen, window, c);
    };
    fa_tile_loop(key0 + 16 <= tlen && i0 + N <= tlen && fa_tile_visible(i0, i0 + N - 1, key0, key0 + 15, window),
                 probs);
    uint32_t pa[N / 16][4], da[N / 16][4];
    wg_pack_a<T, N>(s, pa);
    // The query slice kc (16 queries) of dO and Q as B, read MN-major.
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < N / 16; kc++) wgmma_64x64x16<T, 1>(dva, pa[kc], wg_desc_mn(dot, kc), 1);
    wg_commit();
    wg_wait<1>();
    wg_hold(dp);
    dkv_probs_to_grad<N>(s, dp, dls[buf]);
    wg_pack_a<T, N>(dp, da);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < N / 16; kc++) wgmma_64x64x16<T, 1>(dka, da[kc], wg_desc_mn(qt, kc), 1);
    wg_commit();
    wg_wait<0>();
    wg_hold(dva);
    wg_hold(dka);
    wg_keep<N / 16>(pa);
    wg_keep<N / 16>(da);
    __syncthreads();
    i0 = i0 + N < first + tiles * N ? i0 + N : first;
  }
  store_tile_rows<T, D>(dk + kv_base * D, key, tlen, dka, scale);
  store_tile_rows<T, D>(dv + kv_base * D, key, tlen, dva, 1.f);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
