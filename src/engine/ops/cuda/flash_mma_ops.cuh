// Tensor-core building blocks of the fused attention kernels (flash_attention_mma.cuh): mma.sync m16n8k16 on
// 16-bit operands with f32 accumulation, packing f32 pairs to 16 bits and back, ldmatrix, row copies into padded
// shared-memory tiles (plain and cp.async, zero-filled past the end), and the two product shapes the kernels use:
// A (registers) times a tile's rows transposed (mma_abt_rows) and accumulator-layout P times a tile read along its
// columns (mma_pb_rows), for one or more 16-row tiles sharing every B fragment read.

#define MMA_WARPS 4
#define MMA_THREADS (MMA_WARPS * 32)  // the block size of every kernel here
#define MMA_PAD 8

template <typename T> __device__ __forceinline__ void mma16816(float* c, const uint32_t* a, const uint32_t* b);
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma16816<__half>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// The two 16-bit values of a packed pair, in f32 (low half first).
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t v);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

template <typename T> __device__ __forceinline__ uint32_t ld2(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Whether rows starting at `src`, `stride` elements apart, are all 16-byte aligned (16-byte copies then apply).
template <typename T> __device__ __forceinline__ bool rows_aligned16(const T* src, long long stride) {
  return ((reinterpret_cast<uintptr_t>(src) | (uintptr_t)(stride * sizeof(T))) & 15) == 0;
}

// Rows first.. of `src` (row stride `stride` elements, D per row) into dst[R][D + MMA_PAD]; zeros past `limit`.
// 16-byte reads when the rows are 16-byte aligned, 4-byte reads otherwise.
template <typename T, int D, int R>
__device__ __forceinline__ void mma_rows(const T* src, long long stride, int first, int limit, T (*dst)[D + MMA_PAD]) {
  constexpr int V = 16 / sizeof(T);
  static_assert(R * D / V % MMA_THREADS == 0, "a tile is a whole number of 16-byte copies per thread");
  if (rows_aligned16(src, stride)) {
#pragma unroll 1
    for (int k = 0; k < R * D / V / MMA_THREADS; k++) {
      const int idx = threadIdx.x + k * MMA_THREADS, r = idx / (D / V), c = (idx % (D / V)) * V, row = first + r;
      *reinterpret_cast<uint4*>(&dst[r][c]) =
          row < limit ? *reinterpret_cast<const uint4*>(src + row * stride + c) : make_uint4(0u, 0u, 0u, 0u);
    }
    return;
  }
#pragma unroll 1
  for (int k = 0; k < R * D / 2 / MMA_THREADS; k++) {
    const int idx = threadIdx.x + k * MMA_THREADS, r = idx / (D / 2), c = (idx % (D / 2)) * 2, row = first + r;
    *reinterpret_cast<uint32_t*>(&dst[r][c]) = row < limit ? ld2(src + row * stride + c) : 0u;
  }
}

// Four 8 x 8 matrices of 16-bit elements from shared memory (lane l gives the address of row l % 8 of matrix
// l / 8); `.trans` hands each lane the transposed elements, the B operand of a product that reads the tile along
// its columns.
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// A operand (16 rows x D) of a row-major matrix in global memory, rows row0.. (zeros past limit).
template <typename T, int D>
__device__ __forceinline__ void mma_a_global(const T* src, long long stride, int row0, int limit, uint32_t (*a)[4]) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const bool lo = row0 + g < limit, hi = row0 + g + 8 < limit;
  const T* r0 = src + (long long)(row0 + g) * stride;
  const T* r1 = src + (long long)(row0 + g + 8) * stride;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const int c = kk * 16 + 2 * t;
    a[kk][0] = lo ? ld2(r0 + c) : 0u;
    a[kk][1] = hi ? ld2(r1 + c) : 0u;
    a[kk][2] = lo ? ld2(r0 + c + 8) : 0u;
    a[kk][3] = hi ? ld2(r1 + c + 8) : 0u;
  }
}

// One thread's part of a tile copy as cp.async of 16 bytes (zero-filled past `limit`; the caller commits and
// waits): the 16 bytes from element col of rows first + r0 + k * STEP of `src` (row stride
// `stride`), k < PASSES, to shared addresses to0 + k * to_step. Unrolled, each offset computed once: the copy runs
// every step of the attention kernels, and a loop's index arithmetic was about a fifth of their instructions.
template <typename T, int STEP, int PASSES>
__device__ __forceinline__ void cp_async_rows(const T* src, long long stride, int first, int limit, unsigned r0,
                                              unsigned col, unsigned to0, unsigned to_step) {
  const T* from0 = src + (long long)(first + (int)r0) * stride + col;
#pragma unroll
  for (int k = 0; k < PASSES; k++) {
    const bool in = first + (int)r0 + k * STEP < limit;
    const T* from = in ? from0 + (long long)k * STEP * stride : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to0 + k * to_step), "l"(from),
                 "r"(in ? 16 : 0));
  }
}

// The same copy as mma_rows, issued as cp.async (cp_async_rows) so it overlaps the products on the previous tile;
// the caller commits the group and waits for it (cp_async_wait) before a __syncthreads. Rows that are not 16-byte
// aligned take mma_rows' plain loads instead (done at once). A thread copies chunk threadIdx.x % (D / 8) of every
// (MMA_THREADS / (D / 8))-th row.
template <typename T, int D, int R>
__device__ __forceinline__ void mma_rows_async(const T* src, long long stride, int first, int limit,
                                               T (*dst)[D + MMA_PAD]) {
  constexpr int V = 16 / sizeof(T), C = D / V, STEP = MMA_THREADS / C;
  static_assert(R % STEP == 0, "a tile is a whole number of passes");
  if (!rows_aligned16(src, stride)) {
    mma_rows<T, D, R>(src, stride, first, limit, dst);
    return;
  }
  const unsigned r0 = threadIdx.x / C, c = (threadIdx.x % C) * V;
  const unsigned to0 = static_cast<unsigned>(__cvta_generic_to_shared(&dst[r0][c]));
  cp_async_rows<T, STEP, R / STEP>(src, stride, first, limit, r0, c, to0, STEP * (D + MMA_PAD) * (unsigned)sizeof(T));
}
// src[index] (4 bytes: a logsumexp, a delta, a packed row's start) into shared `dst` as cp.async, zero-filled when
// `ok` is false (nothing past src is read).
template <typename E> __device__ __forceinline__ void cp_async_4(E* dst, const E* src, size_t index, bool ok) {
  static_assert(sizeof(E) == 4, "a 4-byte element");
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(ok ? src + index : src),
               "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most `pending` committed groups are still in flight (0 or 1).
__device__ __forceinline__ void cp_async_wait(bool pending) {
  if (pending)
    asm volatile("cp.async.wait_group 1;\n" ::);
  else
    asm volatile("cp.async.wait_group 0;\n" ::);
}

// The tiles of K and V starting at key `j0` (rows of D, contiguous) into ks, vs as one committed cp.async group.
template <typename T, int D, int N>
__device__ __forceinline__ void kv_tiles_async(const T* k, const T* v, int j0, int limit, T (*ks)[D + MMA_PAD],
                                               T (*vs)[D + MMA_PAD]) {
  mma_rows_async<T, D, N>(k, D, j0, limit, ks);
  mma_rows_async<T, D, N>(v, D, j0, limit, vs);
  cp_async_commit();
}

// acc[r][N/8][4] += A_r (16 x D, fragments a[r]) times B^T for R row tiles r, where B is tile rows
// [N][D + MMA_PAD] (row n = column n). One ldmatrix gives the B fragments of two 8-column blocks, used by all R
// tiles: a warp with more rows reads shared memory less per product.
template <typename T, int D, int N, int R>
__device__ __forceinline__ void mma_abt_rows(const uint32_t (*a)[D / 16][4], const T (*b)[D + MMA_PAD],
                                             float (*acc)[N / 8][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < N / 8; n += 2) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      uint32_t r[4];
      ldsm_x4(r, &b[n * 8 + (lane & 7) + ((lane >> 4) << 3)][kk * 16 + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int t = 0; t < R; t++) {
        mma16816<T>(acc[t][n], a[t][kk], r);
        mma16816<T>(acc[t][n + 1], a[t][kk], r + 2);
      }
    }
  }
}

// acc[r][D/8][4] += P_r (16 x K, accumulator layout p[r][K/8][4], packed to T here) times B (K x D) for R row
// tiles r, B a row-major tile b[K][D + MMA_PAD] read along its columns (ldmatrix .trans), shared by the tiles.
template <typename T, int D, int K, int R>
__device__ __forceinline__ void mma_pb_rows(const float (*p)[K / 8][4], const T (*b)[D + MMA_PAD],
                                            float (*acc)[D / 8][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kc = 0; kc < K / 16; kc++) {
    uint32_t a[R][4];
#pragma unroll
    for (int t = 0; t < R; t++) {
      const float(*q)[4] = p[t];
      a[t][0] = pack2<T>(q[2 * kc][0], q[2 * kc][1]);
      a[t][1] = pack2<T>(q[2 * kc][2], q[2 * kc][3]);
      a[t][2] = pack2<T>(q[2 * kc + 1][0], q[2 * kc + 1][1]);
      a[t][3] = pack2<T>(q[2 * kc + 1][2], q[2 * kc + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t r[4];
      ldsm_x4_trans(r, &b[kc * 16 + (lane & 15)][n * 8 + (lane >> 4) * 8]);
#pragma unroll
      for (int t = 0; t < R; t++) {
        mma16816<T>(acc[t][n], a[t], r);
        mma16816<T>(acc[t][n + 1], a[t], r + 2);
      }
    }
  }
}

// One row tile (16 rows) of the two products above.
template <typename T, int D, int N>
__device__ __forceinline__ void mma_abt(const uint32_t (*a)[4], const T (*b)[D + MMA_PAD], float (*acc)[4]) {
  mma_abt_rows<T, D, N, 1>(reinterpret_cast<const uint32_t(*)[D / 16][4]>(a), b,
                           reinterpret_cast<float(*)[N / 8][4]>(acc));
}
template <typename T, int D, int K>
__device__ __forceinline__ void mma_pb(const float (*p)[4], const T (*b)[D + MMA_PAD], float (*acc)[4]) {
  mma_pb_rows<T, D, K, 1>(reinterpret_cast<const float(*)[K / 8][4]>(p), b, reinterpret_cast<float(*)[D / 8][4]>(acc));
}
