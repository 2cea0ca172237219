// Hopper warpgroup-MMA (wgmma, sm_90a) versions of the fused attention forward and dK/dV at head_dim 64, included by
// flash_attention_mma.cuh: the contract, layouts and base-2 logsumexp of flash_attention.cuh, and the softmax of
// flash_forward_mma. A block is one warpgroup (the 4 warps of MMA_THREADS) that owns FwdTiles<64>::ROWS = 128
// query rows as two tiles of 64; a warp holds 16 rows of each. wgmma m64n64k16 multiplies the warpgroup's A in
// registers (mma.m16n8k16's A fragment layout in every warp) by B read by the tensor cores straight from shared
// memory, once per warpgroup instead of once per warp (ldmatrix), which is what bounds the mma.sync kernels.
// Accumulators come back in mma's accumulator layout, so scores, probabilities and output stay as they are.
//
// B tiles sit in shared memory in wgmma's canonical layout without swizzling: 8 x 8 "core matrices" of 16-bit
// elements, each 8 rows of 16 contiguous bytes. The K tile (B of S = Q K^T; keys are B's N, head dims its K:
// "K-major") keeps a key's 8-dim chunk c at (key / 8) * 1024 + c * 128 + (key % 8) * 16 bytes; the V tile (B of
// O = P V; keys are K, dims N: "MN-major", imm-trans-b) keeps it at c * 1024 + key * 16. In both, core matrices
// adjacent along K are 128 bytes apart (the descriptor's leading byte offset) and along N/MN 1024 apart (its
// stride byte offset), and the k16 slice kk starts kk * 256 bytes in.
//
// Compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL: build.rs asks nvcc for compute_90a on compute capability
// 9.0); other targets keep flash_forward_mma.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_WGMMA 1

// A shared-memory matrix descriptor (no swizzling) for the tile at `tile`.
__device__ __forceinline__ uint64_t wg_desc(const void* tile, unsigned lead_bytes, unsigned stride_bytes) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lead_bytes >> 4) << 16) | ((uint64_t)(stride_bytes >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
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
__device__ __forceinline__ void wgmma_64x64x16(float (*d)[4], const uint32_t* a, uint64_t desc, int accumulate);
template <>
__device__ __forceinline__ void wgmma_64x64x16<__nv_bfloat16, 0>(float (*d)[4], const uint32_t* a, uint64_t desc,
                                                                 int accumulate) {
  constexpr int TRANS_B = 0;
  WG_MMA("bf16.bf16");
}
template <>
__device__ __forceinline__ void wgmma_64x64x16<__nv_bfloat16, 1>(float (*d)[4], const uint32_t* a, uint64_t desc,
                                                                 int accumulate) {
  constexpr int TRANS_B = 1;
  WG_MMA("bf16.bf16");
}
template <>
__device__ __forceinline__ void wgmma_64x64x16<__half, 0>(float (*d)[4], const uint32_t* a, uint64_t desc,
                                                          int accumulate) {
  constexpr int TRANS_B = 0;
  WG_MMA("f16.f16");
}
template <>
__device__ __forceinline__ void wgmma_64x64x16<__half, 1>(float (*d)[4], const uint32_t* a, uint64_t desc,
                                                          int accumulate) {
  constexpr int TRANS_B = 1;
  WG_MMA("f16.f16");
}

// Byte offset of key `r`'s 8-element chunk `c` in a 64-key tile: K-major (the K tile) or MN-major (the V tile).
template <bool K_MAJOR> __device__ __forceinline__ unsigned wg_chunk(int r, int c) {
  return K_MAJOR ? ((r >> 3) << 10) | (c << 7) | ((r & 7) << 4) : (c << 10) | (r << 4);
}

// 64 rows first.. of `src` (row stride `stride`, 64 elements each) into a canonical tile (zeros past `limit`):
// cp.async of 16 bytes when rows are 16-byte aligned (the caller commits and waits), plain 4-byte loads otherwise.
template <typename T, bool K_MAJOR>
__device__ __forceinline__ void wg_tile_async(const T* src, long long stride, int first, int limit, T* tile) {
  char* base = reinterpret_cast<char*>(tile);
  if (rows_aligned16(src, stride)) {
#pragma unroll 1
    for (int k = 0; k < 64 * 8 / MMA_THREADS; k++) {
      const int idx = threadIdx.x + k * MMA_THREADS, r = idx >> 3, c = idx & 7, row = first + r;
      const T* from = row < limit ? src + row * stride + c * 8 : src;
      const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(base + wg_chunk<K_MAJOR>(r, c)));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(row < limit ? 16 : 0));
    }
    return;
  }
#pragma unroll 1
  for (int k = 0; k < 64 * 32 / MMA_THREADS; k++) {
    const int idx = threadIdx.x + k * MMA_THREADS, r = idx >> 5, e = (idx & 31) * 2, row = first + r;
    *reinterpret_cast<uint32_t*>(base + wg_chunk<K_MAJOR>(r, e >> 3) + (e & 7) * 2) =
        row < limit ? ld2(src + row * stride + e) : 0u;
  }
}

// The forward of flash_forward_mma at head_dim 64 on wgmma. Grid (ceil(tq / FwdTiles<64>::ROWS), heads, b),
// block MMA_THREADS (one warpgroup).
template <typename T>
__device__ void flash_forward_wgmma(const T* q, const T* k, const T* v, T* out, float* lse, int heads, int kv_heads,
                                    int tq, int tk, long long bs, long long hs, int q_offset, int window,
                                    float scale) {
  constexpr int D = 64, N = 64, R = 2, ROWS = 128;
  static_assert(FwdTiles<D>::ROWS == ROWS, "the grid's rows per block");
  __shared__ __align__(128) T ks[2][N * D];
  __shared__ __align__(128) T vs[2][N * D];
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
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
  for (int r = 0; r < R; r++) {
    const int row0 = first + 64 * r + 16 * warp;
    mma_a_global<T, D>(q + ((size_t)bi * heads + h) * tq * D, D, row0, tq, qf[r]);
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[r][n][0] = o[r][n][1] = o[r][n][2] = o[r][n][3] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; half++) {
      m[r][half] = -INFINITY;
      l[r][half] = 0.f;
      pos[r][half] = q_offset + row0 + 8 * half + g;
      valid[r][half] = row0 + 8 * half + g < tq;
    }
  }
  const int hi = min(tk, q_offset + min(first + ROWS, tq));
  const int lo = window > 0 ? max(0, q_offset + first - window + 1) : 0;
  auto load = [&](int j0, int buf) {
    wg_tile_async<T, true>(kb, D, j0, tk, ks[buf]);
    wg_tile_async<T, false>(vb, D, j0, tk, vs[buf]);
    cp_async_commit();
  };
  if (lo < hi) load(lo, 0);
  for (int j0 = lo, buf = 0; j0 < hi; j0 += N, buf ^= 1) {
    const bool next = j0 + N < hi;
    if (next) load(j0 + N, buf ^ 1);
    cp_async_wait(next);
    wg_proxy_fence();
    __syncthreads();
    float s[R][N / 8][4];
    // Both tiles' scores are issued at once; each tile's softmax then runs while the tensor cores work on the other
    // tile's product (its scores, or the first tile's P V), one commit group per product. Every tile is computed,
    // also past the causal edge (masked): products under a data-dependent branch make ptxas serialize them.
#pragma unroll
    for (int r = 0; r < R; r++) {
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++)
        wgmma_64x64x16<T, 0>(s[r], qf[r][kk], wg_desc(reinterpret_cast<const char*>(ks[buf]) + kk * 256, 128, 1024),
                             kk > 0);
      wg_commit();
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      // Groups still allowed in flight: the other tile's scores (r = 0), or the first tile's P V (r = 1).
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      wg_hold(s[r]);
      const int row0 = first + 64 * r + 16 * warp, warp_pos = q_offset + row0;
      float mx[2] = {-INFINITY, -INFINITY};
      auto mask = [&](auto masked) {
#pragma unroll
        for (int n = 0; n < N / 8; n++) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int half = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1);
            const bool keep = !decltype(masked)::value || (valid[r][half] & fa_visible(pos[r][half], j, tk, window));
            if (!keep) s[r][n][e] = -INFINITY;
            mx[half] = fmaxf(mx[half], s[r][n][e]);
          }
        }
      };
      fa_tile_loop(row0 + 16 <= tq && j0 + N <= tk && fa_tile_visible(warp_pos, warp_pos + 15, j0, j0 + N - 1, window),
                   mask);
      float base[2], corr[2];
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const float m_new = fmaxf(m[r][half], quad_max(mx[half]) * c);
        base[half] = m_new == -INFINITY ? 0.f : m_new;
        corr[half] = fa_exp2(m[r][half] - base[half]);
        m[r][half] = m_new;
        l[r][half] *= corr[half];
      }
      uint32_t p[N / 16][4];
#pragma unroll
      for (int n = 0; n < N / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          s[r][n][e] = fa_exp2(fmaf(s[r][n][e], c, -base[e >> 1]));
          l[r][e >> 1] += s[r][n][e];
        }
      }
#pragma unroll
      for (int kc = 0; kc < N / 16; kc++) {
        p[kc][0] = pack2<T>(s[r][2 * kc][0], s[r][2 * kc][1]);
        p[kc][1] = pack2<T>(s[r][2 * kc][2], s[r][2 * kc][3]);
        p[kc][2] = pack2<T>(s[r][2 * kc + 1][0], s[r][2 * kc + 1][1]);
        p[kc][3] = pack2<T>(s[r][2 * kc + 1][2], s[r][2 * kc + 1][3]);
      }
#pragma unroll
      for (int n = 0; n < D / 8; n++) {
        o[r][n][0] *= corr[0];
        o[r][n][1] *= corr[0];
        o[r][n][2] *= corr[1];
        o[r][n][3] *= corr[1];
      }
      wg_fence();
#pragma unroll
      for (int kc = 0; kc < N / 16; kc++)
        wgmma_64x64x16<T, 1>(o[r], p[kc], wg_desc(reinterpret_cast<const char*>(vs[buf]) + kc * 256, 128, 1024), 1);
      wg_commit();
    }
    wg_wait_all();
#pragma unroll
    for (int r = 0; r < R; r++) wg_hold(o[r]);
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const float sum = quad_sum(l[r][half]);
      if (!valid[r][half]) continue;
      const int i = first + 64 * r + 16 * warp + 8 * half + g;
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      T* orow = out + (((size_t)bi * tq + i) * heads + h) * D;
#pragma unroll
      for (int n = 0; n < D / 8; n++)
        *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * t) =
            pack2<T>(o[r][n][2 * half] * inv, o[r][n][2 * half + 1] * inv);
      if (t == 0) lse[((size_t)bi * heads + h) * tq + i] = sum > 0.f ? m[r][half] + log2f(sum) : INFINITY;
    }
  }
}


// dK and dV of flash_backward_dkv_mma at head_dim 64 on wgmma: a block is one warpgroup owning 64 keys (16 a warp,
// K and V as A in registers); the query tiles of the group's heads stream through shared memory in the canonical
// layout, read K-major by S^T = K Q^T and dP^T = V dO^T and MN-major (the same tile, the two strides swapped) by
// dV += P^T dO and dK += dS^T Q. Grid (ceil(t / 64), kv_heads, b), block MMA_THREADS.
template <typename T>
__device__ void flash_backward_dkv_wgmma(const T* q, const T* k, const T* v, const T* d_out, const float* lse,
                                         const float* delta, T* dk, T* dv, int heads, int kv_heads, int tlen,
                                         int window, float scale) {
  constexpr int D = 64, N = 64;
  __shared__ __align__(128) T qs[2][N * D];
  __shared__ __align__(128) T dos[2][N * D];
  __shared__ float ls[2][N], dls[2][N];
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const FaBlock blk = fa_block_longest_first(false);
  const int kvh = blk.head, bi = blk.batch, first = blk.tile * FA_ROWS, key0 = first + warp * 16;
  const int rep = heads / kv_heads;
  const size_t kv_base = ((size_t)bi * kv_heads + kvh) * tlen;
  const float c = scale * FA_LOG2E;
  uint32_t kf[D / 16][4], vf[D / 16][4];
  mma_a_global<T, D>(k + kv_base * D, D, key0, tlen, kf);
  mma_a_global<T, D>(v + kv_base * D, D, key0, tlen, vf);
  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
    dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
  }
  const int key[2] = {key0 + g, key0 + g + 8};
  const int hi = window > 0 ? min(tlen, first + FA_ROWS - 1 + window) : tlen;
  const int tiles = first < hi ? (hi - first + N - 1) / N : 0, steps = rep * tiles;
  int load_head = kvh * rep, load_tile = 0;
  auto load = [&](int buf) {
    const int i0 = first + load_tile * N;
    const size_t q_base = ((size_t)bi * heads + load_head) * tlen;
    wg_tile_async<T, true>(q + q_base * D, D, i0, tlen, qs[buf]);
    wg_tile_async<T, true>(d_out + ((size_t)bi * tlen * heads + load_head) * D, (long long)heads * D, i0, tlen,
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
    float s[N / 8][4], dp[N / 8][4];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_64x64x16<T, 0>(s, kf[kk], wg_desc(qt + kk * 256, 128, 1024), kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_64x64x16<T, 0>(dp, vf[kk], wg_desc(dot + kk * 256, 128, 1024), kk > 0);
    wg_commit();
    wg_wait_all();
    wg_hold(s);
    wg_hold(dp);
    auto grad = [&](auto masked) {
#pragma unroll
      for (int n = 0; n < N / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = e >> 1, col = n * 8 + 2 * t + (e & 1), i = i0 + col;
          const bool keep = !decltype(masked)::value || ((i < tlen) & fa_visible(i, key[r], tlen, window));
          const float p = keep ? fa_exp2(fmaf(s[n][e], c, -ls[buf][col])) : 0.f;
          s[n][e] = p;
          dp[n][e] = p * (dp[n][e] - dls[buf][col]);
        }
      }
    };
    fa_tile_loop(key0 + 16 <= tlen && i0 + N <= tlen && fa_tile_visible(i0, i0 + N - 1, key0, key0 + 15, window),
                 grad);
    uint32_t pa[N / 16][4], da[N / 16][4];
#pragma unroll
    for (int kc = 0; kc < N / 16; kc++) {
      pa[kc][0] = pack2<T>(s[2 * kc][0], s[2 * kc][1]);
      pa[kc][1] = pack2<T>(s[2 * kc][2], s[2 * kc][3]);
      pa[kc][2] = pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      pa[kc][3] = pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
      da[kc][0] = pack2<T>(dp[2 * kc][0], dp[2 * kc][1]);
      da[kc][1] = pack2<T>(dp[2 * kc][2], dp[2 * kc][3]);
      da[kc][2] = pack2<T>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
      da[kc][3] = pack2<T>(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
    }
    // The query slice kc (16 queries: two 8-row core-matrix groups, 2048 bytes in) as B read MN-major: K-adjacent
    // core matrices (the next 8 queries) 1024 bytes apart, MN-adjacent (the next 8 dims) 128.
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < N / 16; kc++) wgmma_64x64x16<T, 1>(dva, pa[kc], wg_desc(dot + kc * 2048, 1024, 128), 1);
#pragma unroll
    for (int kc = 0; kc < N / 16; kc++) wgmma_64x64x16<T, 1>(dka, da[kc], wg_desc(qt + kc * 2048, 1024, 128), 1);
    wg_commit();
    wg_wait_all();
    wg_hold(dva);
    wg_hold(dka);
    __syncthreads();
    i0 = i0 + N < first + tiles * N ? i0 + N : first;
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (key[r] >= tlen) continue;
    T* dkr = dk + (kv_base + key[r]) * D;
    T* dvr = dv + (kv_base + key[r]) * D;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      *reinterpret_cast<uint32_t*>(dkr + n * 8 + 2 * t) = pack2<T>(dka[n][2 * r] * scale, dka[n][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dvr + n * 8 + 2 * t) = pack2<T>(dva[n][2 * r], dva[n][2 * r + 1]);
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
