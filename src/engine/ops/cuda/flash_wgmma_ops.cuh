// Hopper warpgroup-MMA (wgmma, sm_90a) building blocks of the fused attention kernels in flash_attention_wgmma.cuh:
// shared-memory matrix descriptors for 128-byte swizzled tiles, wgmma m64nNk16 (N = 32, 64, 128) with A in
// registers in mma.m16n8k16's fragment layout and f32 accumulators in mma's accumulator layout, the fence / commit
// / wait of the asynchronous products, and the cp.async copy of row tiles into the swizzled layout.
//
// A tile of `rows` x D 16-bit elements (D = 64 or 128) sits in shared memory as D / 64 column blocks of `rows` x 128
// bytes (block b at b * rows * 128), each in wgmma's 128-byte swizzle: row r's 16-byte chunk c of a block at r *
// 128 + (c ^ (r % 8)) * 16; blocks 1024-byte aligned. (The non-swizzled canonical layout measured 14-19% slower in
// dQ and dK/dV: the tensor cores' reads of it conflict in banks.) B read K-major (the tile's rows are B's N, its
// columns B's K, e.g. S = Q K^T): the k16 slice kk starts 32 bytes into the rows of block kk / 4; read MN-major
// from the same copy (the rows are B's K, e.g. O += P V): the slice of 16 rows kc starts at kc * 2048, the column
// blocks (64 elements of N each) rows * 128 bytes apart (the lead offset); 8-row groups are 1024 bytes apart in
// both.

// A shared-memory matrix descriptor with 128-byte swizzling (layout type 1 in bits 62-63) for the tile at `tile`.
__device__ __forceinline__ uint64_t wg_desc(const void* tile, unsigned lead_bytes, unsigned stride_bytes) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lead_bytes >> 4) << 16) | ((uint64_t)(stride_bytes >> 4) << 32) |
         (1ull << 62);
}
// B read K-major from a tile of ROWS rows, the k16 slice kk (the hardware applies the swizzle to the address). The
// slice's offset is added to the tile's descriptor (the address field holds bytes / 16 and shared memory is under
// 256 KiB, so it never carries), which leaves one descriptor per tile to compute and a constant add per product.
template <int ROWS> __device__ __forceinline__ uint64_t wg_desc_k(const char* tile, int kk) {
  return wg_desc(tile, 16, 1024) + (((kk >> 2) * ROWS * 128 + (kk & 3) * 32) >> 4);
}
// B read MN-major from a tile of ROWS rows, the slice of 16 rows kc.
template <int ROWS> __device__ __forceinline__ uint64_t wg_desc_mn(const char* tile, int kc) {
  return wg_desc(tile, ROWS * 128, 1024) + ((kc * 2048) >> 4);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
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
// Tells the compiler an accumulator's registers (N columns) changed behind its back (after a wait), so no read of
// them is moved across the wait.
template <int N = 64> __device__ __forceinline__ void wg_hold(float (*d)[4]) {
#pragma unroll
  for (int n = 0; n < N / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}
// Shared memory written through the generic proxy (cp.async, plain stores) made visible to wgmma's reads.
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define WG_ACC32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WG_OUT32(d) \
      "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
#define WG_ACC64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_OUT64(d) \
      "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
#define WG_ACC128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, " \
  "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
  "%61, %62, %63}"
#define WG_OUT128(d) \
      "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), \
      "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
      "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define WG_MMA(N, TYPES)                                                                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" WG_PRED_##N ", 0;\n"                                        \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPES " " WG_ACC##N ", {%" WG_A0_##N ", %"      \
               WG_A1_##N ", %" WG_A2_##N ", %" WG_A3_##N "}, %" WG_DESC_##N ", p, 1, 1, %" WG_TRANS_##N ";\n}\n"  \
               : WG_OUT##N(d)                                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(TRANS_B))
// Operand numbers after the N / 2 accumulators: A's four registers, the descriptor, the accumulate flag, TRANS_B.
#define WG_A0_32 "16"
#define WG_A1_32 "17"
#define WG_A2_32 "18"
#define WG_A3_32 "19"
#define WG_DESC_32 "20"
#define WG_PRED_32 "21"
#define WG_TRANS_32 "22"
#define WG_A0_64 "32"
#define WG_A1_64 "33"
#define WG_A2_64 "34"
#define WG_A3_64 "35"
#define WG_DESC_64 "36"
#define WG_PRED_64 "37"
#define WG_TRANS_64 "38"
#define WG_A0_128 "64"
#define WG_A1_128 "65"
#define WG_A2_128 "66"
#define WG_A3_128 "67"
#define WG_DESC_128 "68"
#define WG_PRED_128 "69"
#define WG_TRANS_128 "70"

// d (64 x N over the warpgroup, [N/8][4] per thread in mma's accumulator layout) = A B + (accumulate ? d : 0) for
// A (64 x 16) in registers and B (16 x N) in shared memory at `desc`; TRANS_B 1 reads B MN-major.
template <typename T, int N, int TRANS_B>
__device__ __forceinline__ void wgmma_64xn(float (*d)[4], const uint32_t* a, uint64_t desc, int accumulate) {
  static_assert(N == 32 || N == 64 || N == 128, "the product widths the kernels use");
  if constexpr (N == 32) {
    if constexpr (std::is_same<T, __half>::value)
      WG_MMA(32, "f16.f16");
    else
      WG_MMA(32, "bf16.bf16");
  } else if constexpr (N == 64) {
    if constexpr (std::is_same<T, __half>::value)
      WG_MMA(64, "f16.f16");
    else
      WG_MMA(64, "bf16.bf16");
  } else {
    if constexpr (std::is_same<T, __half>::value)
      WG_MMA(128, "f16.f16");
    else
      WG_MMA(128, "bf16.bf16");
  }
}

// The two products of the kernels, issued (the caller fences before and commits after): S = A B^T, for A (64 x D)
// in registers (a[D/16][4]) and B^T the N rows of `tile` read K-major ...
template <typename T, int N, int D>
__device__ __forceinline__ void wg_abt(float (*s)[4], const uint32_t (*a)[4], const char* tile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) wgmma_64xn<T, N, 0>(s, a[kk], wg_desc_k<N>(tile, kk), kk > 0);
}
// ... and acc += P B, for P (64 x N) in registers (p[N/16][4], a packed accumulator) and B the N rows of `tile`
// (D wide) read MN-major.
template <typename T, int N, int D>
__device__ __forceinline__ void wg_pb(float (*acc)[4], const uint32_t (*p)[4], const char* tile) {
#pragma unroll
  for (int kc = 0; kc < N / 16; kc++) wgmma_64xn<T, D, 1>(acc, p[kc], wg_desc_mn<N>(tile, kc), 1);
}

// P (an accumulator, f32) packed into `a`, then acc += P B (as wg_pb) issued as its own commit group; `a` stays
// untouched until that group is waited for (wg_keep after the wait).
template <typename T, int N, int D>
__device__ __forceinline__ void wg_pb_group(float (*acc)[4], const float (*p)[4], uint32_t (*a)[4], const char* tile) {
  wg_pack_a<T, N>(p, a);
  wg_fence();
  wg_pb<T, N, D>(acc, a, tile);
  wg_commit();
}
// Waits for every group in flight, then marks R accumulators (D wide) changed and their A operands (N/16 slices)
// free: the end of a step whose products on R row tiles were still running.
template <int R, int N, int D>
__device__ __forceinline__ void wg_drain(float (*acc)[D / 8][4], const uint32_t (*a)[N / 16][4]) {
  wg_wait<0>();
#pragma unroll
  for (int r = 0; r < R; r++) {
    wg_hold<D>(acc[r]);
    wg_keep<N / 16>(a[r]);
  }
}

// The same product with A (64 x 16) also read from shared memory, K-major, at `desc_a` (N = 32, B K-major).
template <typename T>
__device__ __forceinline__ void wgmma_64x32_ss(float (*d)[4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#define WG_MMA_SS(TYPES)                                                                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                   \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPES " " WG_ACC32 ", %16, %17, p, 1, 1, 0, 0;\n}\n" \
               : WG_OUT32(d)                                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))
  if constexpr (std::is_same<T, __half>::value)
    WG_MMA_SS("f16.f16");
  else
    WG_MMA_SS("bf16.bf16");
#undef WG_MMA_SS
}

// Byte offset of row `r`'s 8-element chunk `c` in a swizzled tile of ROWS rows (see the top of this file).
template <int ROWS> __device__ __forceinline__ unsigned wg_chunk(unsigned r, unsigned c) {
  return (c >> 3) * ROWS * 128 + (r << 7) + (((c & 7) ^ (r & 7)) << 4);
}

// ROWS rows first.. of `src` (row stride `stride`, D elements each) into the swizzled tile (zeros past `limit`):
// cp.async of 16 bytes when rows are 16-byte aligned (the caller commits and waits), plain 4-byte loads otherwise.
// A thread copies chunk threadIdx.x % C of rows threadIdx.x / C + k * (MMA_THREADS / C) (cp_async_rows): a whole
// number of 8-row groups apart, so its chunks share one swizzle and sit k * 128 * MMA_THREADS / C bytes apart.
template <typename T, int ROWS, int D>
__device__ __forceinline__ void wg_tile_async(const T* src, long long stride, int first, int limit, T* tile) {
  constexpr int C = D / 8, STEP = MMA_THREADS / C;  // 16-byte chunks a row; rows between a thread's chunks
  static_assert(STEP % 8 == 0 && ROWS % STEP == 0, "whole 8-row groups per pass");
  char* base = reinterpret_cast<char*>(tile);
  if (rows_aligned16(src, stride)) {
    const unsigned r0 = threadIdx.x / C, c = threadIdx.x % C;
    const unsigned to0 = static_cast<unsigned>(__cvta_generic_to_shared(base + wg_chunk<ROWS>(r0, c)));
    cp_async_rows<T, STEP, ROWS / STEP>(src, stride, first, limit, r0, c * 8, to0, STEP * 128);
    return;
  }
#pragma unroll 1
  for (int k = 0; k < ROWS * D / 2 / MMA_THREADS; k++) {
    const unsigned idx = threadIdx.x + k * MMA_THREADS, r = idx / (D / 2), e = (idx % (D / 2)) * 2;
    const int row = first + r;
    *reinterpret_cast<uint32_t*>(base + wg_chunk<ROWS>(r, e >> 3) + (e & 7) * 2) =
        row < limit ? ld2(src + row * stride + e) : 0u;
  }
}

// The tiles of K and V starting at key `j0` (rows of D, contiguous) into ks, vs as one committed cp.async group.
template <typename T, int N, int D>
__device__ __forceinline__ void wg_kv_tiles_async(const T* k, const T* v, int j0, int limit, T* ks, T* vs) {
  wg_tile_async<T, N, D>(k, D, j0, limit, ks);
  wg_tile_async<T, N, D>(v, D, j0, limit, vs);
  cp_async_commit();
}
// The streamed tiles in use are in shared memory and visible to the tensor cores: at most `pending` (0 or 1)
// cp.async groups still in flight (the next tiles'), the copies made visible to wgmma, the block synchronised.
__device__ __forceinline__ void wg_tiles_ready(bool pending) {
  cp_async_wait(pending);
  wg_proxy_fence();
  __syncthreads();
}
