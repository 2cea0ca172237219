// A whole GGML-quantized weight dequantized into f32, bf16 or f16 in one pass (included by fused.cu after
// qgemv.cuh, whose block readers it shares; launched by ops/cuda/dequantize.rs): what a quantized base's many-row
// product (training, prefill, scoring) multiplies through cuBLAS. Candle's path for the same weight is two launches,
// its dequantize to f32 (one 32-thread block per 256 weights) and a cast, so each weight went through memory three
// times at four bytes a value; here the blocks are read once and the values written once in the dtype asked.
//
// Each thread writes 8 consecutive values (one 16-byte store in bf16 / f16, two in f32), which lie in one block and
// share its scales. The arithmetic is Candle's (candle-kernels quantized.cu, dequantize_block_*), operation for
// operation, so the f32 values are bit for bit Candle's and the 16-bit ones its f32 values rounded once:
//   Q4_K: d1 = d sc and m1 = dmin m (both exact in f32), then d1 q - m1 as one fused multiply-add;
//   Q6_K: (d sc) q;  Q8_0: d q.

// Q4_K values i .. i + 7 (i a multiple of 8) of the block at `blk` (144 bytes, 16-byte aligned).
__device__ __forceinline__ void q4k_chunk8(const uint8_t* blk, int i, float* v) {
  const int g = i / 64, high = (i % 64) / 32, l = i % 32;
  float sc, m;
  q4k_scale_min(blk + 4, 2 * g + high, &sc, &m);
  const float d1 = half_at(blk) * sc, m1 = half_at(blk + 2) * m;
  const uint2 q = *reinterpret_cast<const uint2*>(blk + 16 + 32 * g + l);
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const uint32_t byte = ((e < 4 ? q.x : q.y) >> (8 * (e % 4))) & 0xFF;
    v[e] = fmaf(d1, (float)(high ? byte >> 4 : byte & 0xF), -m1);
  }
}

// Q6_K values i .. i + 7 of the block at `blk` (210 bytes: byte loads).
__device__ __forceinline__ void q6k_chunk8(const uint8_t* blk, int i, float* v) {
  const int n = i / 128, quarter = (i % 128) / 32, l = i % 32;
  const uint8_t* ql = blk + 64 * n + l + 32 * (quarter & 1);
  const uint8_t* qh = blk + 128 + 32 * n + l;
  const float ds = half_at(blk + 208) * (float)(int8_t)blk[192 + 8 * n + l / 16 + 2 * quarter];
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const int q = (((quarter < 2) ? ql[e] & 0xF : ql[e] >> 4) | (((qh[e] >> (2 * quarter)) & 3) << 4)) - 32;
    v[e] = ds * (float)q;
  }
}

// Q8_0 values i .. i + 7 of the block at `blk` (34 bytes).
__device__ __forceinline__ void q8_0_chunk8(const uint8_t* blk, int i, float* v) {
  const float d = half_at(blk);
#pragma unroll
  for (int e = 0; e < 8; e++) v[e] = (float)(int8_t)blk[2 + i + e] * d;
}

template <typename T> __device__ __forceinline__ void store8(T* out, const float* v);
template <> __device__ __forceinline__ void store8<float>(float* out, const float* v) {
  reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <> __device__ __forceinline__ void store8<__nv_bfloat16>(__nv_bfloat16* out, const float* v) {
  __nv_bfloat162 p[4];
#pragma unroll
  for (int e = 0; e < 4; e++) p[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(p);
}
template <> __device__ __forceinline__ void store8<__half>(__half* out, const float* v) {
  __half2 p[4];
#pragma unroll
  for (int e = 0; e < 4; e++) p[e] = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(p);
}

// All `chunks` runs of 8 values of the weight at `w` (blocks of BLOCK values in BYTES bytes, end to end) into `out`
// (16-byte aligned). Grid-stride over the chunks; any grid, any block size.
template <typename T, int BLOCK, int BYTES, void (*CHUNK)(const uint8_t*, int, float*)>
__device__ void dequantize_all(const uint8_t* w, T* out, long long chunks) {
  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks;
       c += (long long)gridDim.x * blockDim.x) {
    const long long first = c * 8;
    float v[8];
    CHUNK(w + (first / BLOCK) * BYTES, (int)(first % BLOCK), v);
    store8<T>(out + first, v);
  }
}

#define DEQUANTIZE_AS(QNAME, BLOCK, BYTES, T, SUFFIX)                                                             \
  extern "C" __global__ void dequantize_##QNAME##_##SUFFIX(const uint8_t* w, T* out, long long chunks) {          \
    dequantize_all<T, BLOCK, BYTES, QNAME##_chunk8>(w, out, chunks);                                              \
  }
#define DEQUANTIZE(QNAME, BLOCK, BYTES)                                                                           \
  DEQUANTIZE_AS(QNAME, BLOCK, BYTES, float, f32)                                                                  \
  DEQUANTIZE_AS(QNAME, BLOCK, BYTES, __nv_bfloat16, bf16)                                                         \
  DEQUANTIZE_AS(QNAME, BLOCK, BYTES, __half, f16)
DEQUANTIZE(q4k, 256, 144)
DEQUANTIZE(q6k, 256, 210)
DEQUANTIZE(q8_0, 32, 34)
