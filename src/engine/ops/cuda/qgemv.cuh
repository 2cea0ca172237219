// Single-row products against a GGML-quantized frozen weight, for token-by-token decoding with a quantized base
// (included by fused.cu; launched by ops/cuda/qgemv.rs): y = W x for one input row x (k) of f32 or bf16, W held
// as Q4_K, Q6_K or Q8_0 blocks, y in x's type. Also the rows of such a weight dequantized (the embedding lookup
// of a quantized vocabulary, with the token ids read on the device so that a captured decode step can replay it).
//
// The weight may be several tensors end to end (QSegments): attention's q|k|v, the MLP's gate|up, or the vocabulary's
// blocks of rows are one launch. Each warp takes 1, 2 or 4 consecutive rows and walks them together, so the input
// values a lane loads serve each of them; for the middling products a block's four warps share two rows, each walking a
// quarter of their blocks (qgemv_rows' SPLIT). A lane takes 32 weights of a row per step: for Q4_K, 16 low and 16 high
// nibbles of one 16-byte load (one sub-block pair); for Q6_K, four groups of 8 (one per 32-weight quarter of a half
// block); for Q8_0, one whole 32-weight block. Math is in f32 with the activations as given (no 8-bit quantization of
// x, unlike llama.cpp's and Candle's kernels), so the result is the dequantized product up to the order of the f32
// sums. Per block, scale and offset leave the inner loop: for Q4_K, sum(x (d sc q - dmin m)) = d sc sum(x q) - dmin m
// sum(x); Q6_K's and Q8_0's zero points (32, and 128 after flipping the sign bit) likewise come out as a multiple of
// sum(x).
//
// Layouts are ggml's (ggml-common.h; candle-core's k_quants.rs holds the same structs):
//   Q4_K: 144 bytes per 256 weights: half d, half dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
//   Q6_K: 210 bytes per 256 weights: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, half d.
//   Q8_0: 34 bytes per 32 weights: half d, 32 int8.
// Only Q4_K's blocks are 16-byte aligned (rows of k / 256 * 144 bytes); Q6_K and Q8_0 blocks are read with 2-byte
// loads, the alignment their sizes allow.
#include <cuda_fp16.h>

#define QSEG_MAX 48
// Up to QSEG_MAX tensors whose rows follow one another: rows first[s] .. first[s + 1] are tensor s's.
struct QSegments {
  const uint8_t* w[QSEG_MAX];
  int first[QSEG_MAX + 1];
  int count;
};

// The bytes of `row` (0 <= row < first[count]).
__device__ __forceinline__ const uint8_t* segment_row(const QSegments& s, int row, size_t row_bytes) {
  int seg = 0;
  while (seg + 1 < s.count && row >= s.first[seg + 1]) seg++;
  return s.w[seg] + (size_t)(row - s.first[seg]) * row_bytes;
}

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}
// Four bytes at a 2-byte aligned address.
__device__ __forceinline__ uint32_t u32_at2(const uint8_t* p) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}
// Byte `e` (0..3; a constant or a lane's own) of `w` as a float, exactly: the byte under the exponent of 2^23, then
// 2^23 taken off (a byte permute and an add, where a conversion instruction would run at a sixteenth of the rate).
__device__ __forceinline__ float byte_at(uint32_t w, int e) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | e)) - 8388608.f;
}
// sum(x[e] * byte e of w[e / 4]) over n bytes of w.
template <int n> __device__ __forceinline__ float dot_bytes(const uint32_t* w, const float* x) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < n / 4; j++) {
    s = fmaf(x[4 * j + 0], byte_at(w[j], 0), s);
    s = fmaf(x[4 * j + 1], byte_at(w[j], 1), s);
    s = fmaf(x[4 * j + 2], byte_at(w[j], 2), s);
    s = fmaf(x[4 * j + 3], byte_at(w[j], 3), s);
  }
  return s;
}
template <int n> __device__ __forceinline__ float sum_of(const float* x) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < n; e++) s += x[e];
  return s;
}
// n consecutive values of x from element `at` (n a multiple of 16 bytes' worth, `at` aligned to it) as floats.
template <typename T, int n> __device__ __forceinline__ void load_x(const T* x, int at, float* out) {
  constexpr int V = 16 / sizeof(T);
#pragma unroll
  for (int c = 0; c < n / V; c++) load16<T>(x + at + c * V, out + c * V);
}

// 6-bit scale and min j (0..7) of a Q4_K block's 12 scale bytes (ggml's get_scale_min_k4).
__device__ __forceinline__ void q4k_scale_min(const uint8_t* q, int j, float* sc, float* m) {
  if (j < 4) {
    *sc = (float)(q[j] & 63);
    *m = (float)(q[j + 4] & 63);
  } else {
    *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// What a lane holds of the input for one step: its 32 values and the sums the block offsets need.
struct Q4KInput {
  float lo[16], hi[16], sum_lo, sum_hi;
};
struct Q4K {
  static constexpr int BLOCK = 256, BYTES = 144, LANES_PER_BLOCK = 8;
  typedef Q4KInput Input;
  // Lane slot `sub` (0..7) of block `b`: sub-blocks 2g (low nibbles) and 2g + 1 (high), 16 weights of each.
  template <typename T> static __device__ __forceinline__ void input(const T* x, int b, int sub, Input& in) {
    const int at = b * BLOCK + 64 * (sub >> 1) + 16 * (sub & 1);
    load_x<T, 16>(x, at, in.lo);
    load_x<T, 16>(x, at + 32, in.hi);
    in.sum_lo = sum_of<16>(in.lo);
    in.sum_hi = sum_of<16>(in.hi);
  }
  static __device__ __forceinline__ float dot(const uint8_t* row, int b, int sub, const Input& in) {
    const uint8_t* blk = row + (size_t)b * BYTES;
    const uint4 head = *reinterpret_cast<const uint4*>(blk);
    const uint4 q = *reinterpret_cast<const uint4*>(blk + 16 + 16 * sub);
    const uint8_t* hb = reinterpret_cast<const uint8_t*>(&head);
    const float d = __half2float(__ushort_as_half((unsigned short)(head.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(head.x >> 16)));
    float sc0, m0, sc1, m1;
    q4k_scale_min(hb + 4, 2 * (sub >> 1), &sc0, &m0);
    q4k_scale_min(hb + 4, 2 * (sub >> 1) + 1, &sc1, &m1);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      lo[j] = w[j] & 0x0F0F0F0Fu;
      hi[j] = (w[j] >> 4) & 0x0F0F0F0Fu;
    }
    const float dot_lo = dot_bytes<16>(lo, in.lo), dot_hi = dot_bytes<16>(hi, in.hi);
    return d * (sc0 * dot_lo + sc1 * dot_hi) - dmin * (m0 * in.sum_lo + m1 * in.sum_hi);
  }
};

struct Q6KInput {
  float x[4][8], sum[4];
};
struct Q6K {
  static constexpr int BLOCK = 256, BYTES = 210, LANES_PER_BLOCK = 8;
  typedef Q6KInput Input;
  // Lane slot `sub` (0..7) of block `b`: half n = sub / 4 (128 weights), l0 = 8 (sub % 4); weights
  // n * 128 + l0 + 32 i + (0..7) for i = 0..3.
  template <typename T> static __device__ __forceinline__ void input(const T* x, int b, int sub, Input& in) {
    const int at = b * BLOCK + 128 * (sub >> 2) + 8 * (sub & 3);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      load_x<T, 8>(x, at + 32 * i, in.x[i]);
      in.sum[i] = sum_of<8>(in.x[i]);
    }
  }
  static __device__ __forceinline__ float dot(const uint8_t* row, int b, int sub, const Input& in) {
    const uint8_t* blk = row + (size_t)b * BYTES;
    const int n = sub >> 2, l0 = 8 * (sub & 3);
    const uint8_t* ql = blk + 64 * n + l0;
    const uint8_t* qh = blk + 128 + 32 * n + l0;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n + (l0 >> 4));
    const float d = half_at(blk + 208);
    const uint32_t l[4] = {u32_at2(ql), u32_at2(ql + 4), u32_at2(ql + 32), u32_at2(ql + 36)};
    const uint32_t h[2] = {u32_at2(qh), u32_at2(qh + 4)};
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      // Quarter i: low nibbles of ql[0..32) (i = 0) or ql[32..64) (i = 1), high nibbles of them (2, 3); bits
      // 2i, 2i + 1 of qh above them; minus 32.
      uint32_t q[2];
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const uint32_t low = (i < 2 ? l[2 * (i & 1) + j] : l[2 * (i & 1) + j] >> 4) & 0x0F0F0F0Fu;
        q[j] = low | (((h[j] >> (2 * i)) & 0x03030303u) << 4);
      }
      acc += (float)sc[2 * i] * (dot_bytes<8>(q, in.x[i]) - 32.f * in.sum[i]);
    }
    return d * acc;
  }
};

struct Q80Input {
  float x[32], sum;
};
struct Q80 {
  static constexpr int BLOCK = 32, BYTES = 34, LANES_PER_BLOCK = 1;
  typedef Q80Input Input;
  template <typename T> static __device__ __forceinline__ void input(const T* x, int b, int, Input& in) {
    load_x<T, 32>(x, b * BLOCK, in.x);
    in.sum = sum_of<32>(in.x);
  }
  static __device__ __forceinline__ float dot(const uint8_t* row, int b, int, const Input& in) {
    const uint8_t* blk = row + (size_t)b * BYTES;
    uint32_t q[8];
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] = u32_at2(blk + 2 + 4 * j) ^ 0x80808080u;  // int8 + 128, as bytes
    return half_at(blk) * (dot_bytes<32>(q, in.x) - 128.f * in.sum);
  }
};

#define QG_WARPS 4
// Grid ceil(n / (ROWS * QG_WARPS / SPLIT)), block 32 * QG_WARPS. Each group of SPLIT warps takes ROWS consecutive
// rows (the host picks ROWS 1, 2 or 4 and SPLIT 1 or QG_WARPS): with SPLIT 1 a warp walks the whole row; with
// SPLIT QG_WARPS the block's warps share its rows, each taking every SPLIT-th step of blocks, and their sums meet
// in shared memory. Splitting puts four times the loads in flight for the products with few rows (a layer's
// q|k|v, o and down at 8B have 4,096-6,144 rows: one or two warps an SM's scheduler short of hiding the memory's
// latency). k is a multiple of Q::BLOCK; x is 16-byte aligned.
template <typename T, typename Q, int ROWS, int SPLIT>
__device__ void qgemv_rows(const T* x, const QSegments& segs, T* y, int n, int k) {
  static_assert(SPLIT == 1 || SPLIT == QG_WARPS, "a group of warps is one warp or the whole block");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = ((blockIdx.x * QG_WARPS + warp) / SPLIT) * ROWS;
  if (row0 >= n) return;  // with SPLIT > 1 the whole block returns together
  const int blocks = k / Q::BLOCK;
  const size_t row_bytes = (size_t)blocks * Q::BYTES;
  const uint8_t* rows[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; r++) rows[r] = segment_row(segs, min(row0 + r, n - 1), row_bytes);
  constexpr int BLOCKS_PER_STEP = 32 / Q::LANES_PER_BLOCK;
  const int sub = lane % Q::LANES_PER_BLOCK;
  float acc[ROWS] = {};
  for (int b = lane / Q::LANES_PER_BLOCK + (warp % SPLIT) * BLOCKS_PER_STEP; b < blocks;
       b += BLOCKS_PER_STEP * SPLIT) {
    typename Q::Input in;
    Q::template input<T>(x, b, sub, in);
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] += Q::dot(rows[r], b, sub, in);
  }
#pragma unroll
  for (int r = 0; r < ROWS; r++) acc[r] = warp_sum(acc[r]);
  if (SPLIT > 1) {
    __shared__ float partial[QG_WARPS][ROWS];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; r++) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      acc[r] = 0.f;
#pragma unroll
      for (int w = 0; w < SPLIT; w++) acc[r] += partial[w][r];
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; r++)
      if (row0 + r < n) y[row0 + r] = from_f<T>(acc[r]);
  }
}

#define QGEMV_ROWS(QNAME, Q, R, S)                                                                                \
  extern "C" __global__ void qgemv_##QNAME##_r##R##_s##S##_f32(const float* x, QSegments s, float* y, int n,      \
                                                               int k) {                                           \
    qgemv_rows<float, Q, R, S>(x, s, y, n, k);                                                                    \
  }                                                                                                               \
  extern "C" __global__ void qgemv_##QNAME##_r##R##_s##S##_bf16(const __nv_bfloat16* x, QSegments s,              \
                                                                __nv_bfloat16* y, int n, int k) {                 \
    qgemv_rows<__nv_bfloat16, Q, R, S>(x, s, y, n, k);                                                            \
  }
#define QGEMV_SPLITS(QNAME, Q, R) QGEMV_ROWS(QNAME, Q, R, 1) QGEMV_ROWS(QNAME, Q, R, 4)
#define QGEMV(QNAME, Q) QGEMV_SPLITS(QNAME, Q, 1) QGEMV_SPLITS(QNAME, Q, 2) QGEMV_SPLITS(QNAME, Q, 4)
QGEMV(q4k, Q4K)
QGEMV(q6k, Q6K)
QGEMV(q8_0, Q80)

// Weight i (0 <= i < 256 or 32) of one block, written out as ggml's dequantize_row_* loops do: the reference
// for the products above, and the embedding lookup below.
struct Q4KValue {
  static __device__ float at(const uint8_t* blk, int i) {
    const int g = i / 64, high = (i % 64) / 32, l = i % 32;
    float sc, m;
    q4k_scale_min(blk + 4, 2 * g + high, &sc, &m);
    const uint8_t q = blk[16 + 32 * g + l];
    return half_at(blk) * sc * (float)(high ? q >> 4 : q & 0xF) - half_at(blk + 2) * m;
  }
};
struct Q6KValue {
  static __device__ float at(const uint8_t* blk, int i) {
    const int n = i / 128, quarter = (i % 128) / 32, l = i % 32;
    const uint8_t ql = blk[64 * n + l + 32 * (quarter & 1)];
    const uint8_t qh = blk[128 + 32 * n + l];
    const int q = (((quarter < 2) ? ql & 0xF : ql >> 4) | (((qh >> (2 * quarter)) & 3) << 4)) - 32;
    const int8_t sc = (int8_t)blk[192 + 8 * n + l / 16 + 2 * quarter];
    return half_at(blk + 208) * (float)sc * (float)q;
  }
};
struct Q80Value {
  static __device__ float at(const uint8_t* blk, int i) { return half_at(blk) * (float)(int8_t)blk[2 + i]; }
};

// Rows ids[0..m) of the segments' rows (k weights each) dequantized into out (m, k); grid (m, any), block any.
// An id past the rows gives a row of zeros (the caller checks ids it has on the host).
template <typename T, typename V, int BLOCK, int BYTES>
__device__ void qrows(const QSegments& segs, const uint32_t* ids, T* out, int k) {
  const int n = segs.first[segs.count];
  const uint32_t id = ids[blockIdx.x];
  const size_t row_bytes = (size_t)(k / BLOCK) * BYTES;
  const uint8_t* row = id < (uint32_t)n ? segment_row(segs, (int)id, row_bytes) : nullptr;
  T* o = out + (size_t)blockIdx.x * k;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < k; i += gridDim.y * blockDim.x)
    o[i] = from_f<T>(row ? V::at(row + (size_t)(i / BLOCK) * BYTES, i % BLOCK) : 0.f);
}

#define QROWS(QNAME, V, BLOCK, BYTES)                                                                             \
  extern "C" __global__ void qrows_##QNAME##_f32(QSegments s, const uint32_t* ids, float* out, int k) {           \
    qrows<float, V, BLOCK, BYTES>(s, ids, out, k);                                                                \
  }                                                                                                               \
  extern "C" __global__ void qrows_##QNAME##_bf16(QSegments s, const uint32_t* ids, __nv_bfloat16* out, int k) {  \
    qrows<__nv_bfloat16, V, BLOCK, BYTES>(s, ids, out, k);                                                        \
  }
QROWS(q4k, Q4KValue, 256, 144)
QROWS(q6k, Q6KValue, 256, 210)
QROWS(q8_0, Q80Value, 32, 34)
