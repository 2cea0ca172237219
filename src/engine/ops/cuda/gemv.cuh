// Single-row products against a frozen weight, for token-by-token decoding (included by fused.cu): y = W x for
// W (n, k) row-major and one input row x (k), or x = silu(gate) * up of a gate|up row (the MLP's down_proj). The pass is a read of W, so bandwidth sets its time; cuBLAS runs
// these as GEMMs with an 8-wide tile and reaches 1.3-2.5 TB/s of an H100's 3.35 (measured on the Llama-3.2-1B
// shapes). Here one warp reads one row with 16-byte streaming loads (eight in flight per lane), the input row
// sits in shared memory, and a warp sum ends the row. The host checks k % (16 / sizeof(T)) == 0, 16-byte
// aligned rows and k * sizeof(T) <= 48 KiB (ops/cuda/gemv.rs).

// sum(x[i] * w[i]) over one 16-byte chunk of each.
__device__ __forceinline__ float dot_chunk(uint4 w, uint4 x, float) {
  const float* wf = reinterpret_cast<const float*>(&w);
  const float* xf = reinterpret_cast<const float*>(&x);
  return wf[0] * xf[0] + wf[1] * xf[1] + wf[2] * xf[2] + wf[3] * xf[3];
}
__device__ __forceinline__ float dot_chunk(uint4 w, uint4 x, __nv_bfloat16) {
  const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const float2 a = __bfloat1622float2(wh[e]), b = __bfloat1622float2(xh[e]);
    s += a.x * b.x + a.y * b.y;
  }
  return s;
}

// One 16-byte chunk of the input row: x's own, or with `gated` (x holding a gate|up row of 2k elements) the
// chunk silu(gate) * up, rounded to T as the SwiGLU kernel (silu_mul_halves) rounds it.
template <typename T>
__device__ __forceinline__ uint4 input_chunk(const uint4* xg, int i, int chunks, bool gated) {
  if (!gated) return xg[i];
  uint4 g = xg[i], u = xg[chunks + i], out;
  const T* gt = reinterpret_cast<const T*>(&g);
  const T* ut = reinterpret_cast<const T*>(&u);
  T* ot = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) {
    const float gf = to_f(gt[e]);
    ot[e] = from_f<T>(gf / (1.f + __expf(-gf)) * to_f(ut[e]));
  }
  return out;
}

#define GEMV_UNROLL 8
// Grid ceil(n / warps per block), block a multiple of 32 threads, dynamic shared memory k * sizeof(T). Each
// lane keeps two batches of GEMV_UNROLL loads: the next is issued before the current is summed, and the first
// before the input row is staged, so the weight stream never waits on the host-side latency of x.
template <typename T>
__device__ void gemv_rows(const T* x, const T* w, T* y, int n, int k, bool gated) {
  extern __shared__ uint4 x_chunks[];
  const int chunks = k * (int)sizeof(T) / 16;
  const int lane = threadIdx.x & 31, row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const bool active = row < n;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)(active ? row : 0) * k);
  constexpr int STEP = 32 * GEMV_UNROLL;
  int c = lane;
  bool full = active && c + STEP - 32 < chunks;
  uint4 u[GEMV_UNROLL];
  if (full) {
#pragma unroll
    for (int e = 0; e < GEMV_UNROLL; e++) u[e] = __ldcs(wr + c + 32 * e);
  }
  const uint4* xg = reinterpret_cast<const uint4*>(x);
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) x_chunks[i] = input_chunk<T>(xg, i, chunks, gated);
  __syncthreads();
  if (!active) return;
  float s = 0.f;
  while (full) {
    const bool more = c + 2 * STEP - 32 < chunks;
    uint4 next[GEMV_UNROLL];
    if (more) {
#pragma unroll
      for (int e = 0; e < GEMV_UNROLL; e++) next[e] = __ldcs(wr + c + STEP + 32 * e);
    }
#pragma unroll
    for (int e = 0; e < GEMV_UNROLL; e++) s += dot_chunk(u[e], x_chunks[c + 32 * e], T());
    c += STEP;
    full = more;
    if (more) {
#pragma unroll
      for (int e = 0; e < GEMV_UNROLL; e++) u[e] = next[e];
    }
  }
  for (; c < chunks; c += 32) s += dot_chunk(__ldcs(wr + c), x_chunks[c], T());
  s = warp_sum(s);
  if (lane == 0) y[row] = from_f<T>(s);
}

extern "C" __global__ void gemv_rows_f32(const float* x, const float* w, float* y, int n, int k, int gated) {
  gemv_rows<float>(x, w, y, n, k, gated != 0);
}
extern "C" __global__ void gemv_rows_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int n,
                                          int k, int gated) {
  gemv_rows<__nv_bfloat16>(x, w, y, n, k, gated != 0);
}
