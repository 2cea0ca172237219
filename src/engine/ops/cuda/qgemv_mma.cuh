// Single-row products against Q4_K weights on the tensor cores, for bf16 activations (included by fused.cu after
// the attention kernels, whose mma16816 it uses; launched by ops/cuda/qgemv.rs): y = W x for one row x (k bf16),
// W in Q4_K blocks (qgemv.cuh has the layout and the QSegments several weights travel in), y bf16.
//
// Why: qgemv.cuh's kernel turns each 4-bit weight into an f32 and multiplies it on the FMA units, five
// instructions a weight with the scales, and at 8B its largest products ran at a third of the memory's speed with
// the schedulers full. Here a nibble becomes a bf16 in one instruction and the multiply-adds are mma.sync
// m16n8k16 (bf16 in, f32 sums): about two instructions a weight. Nothing is rounded that the f32 kernel keeps:
// x is bf16 already, the weights' integer codes are exact in bf16, products of two bf16 are exact in f32.
//
// The trick that makes a matrix-vector product fit a matrix unit: B is not x repeated but x cut by sub-block. A
// Q4_K block has eight sub-blocks of 32 weights, each with its own 6-bit scale and min; column s of B holds x's
// values of sub-block s and zeros elsewhere, so after the block's 16 products the accumulator's column s is each
// row's dot product with sub-block s alone, and a lane holds the columns whose scales it applies (2t, 2t + 1 of
// rows g and g + 8 in the m16n8 accumulator layout). k-row pairs (2t, 2t + 1) of every product come from
// sub-block t and pairs (2t + 8, 2t + 9) from sub-block t + 4, so B's lane (g, t) holds x only when g is t or
// t + 4, and A's lane (g, t) reads sub-blocks t and t + 4 of its rows: nibble halves of groups t / 2 and t / 2 + 2.
//
// A nibble q becomes the bf16 128 + q by an OR under bf16's exponent of 128; the 128 is not taken off per weight
// but once a sub-block, as 128 times the sub-block's sum of x: sum(x (d sc q - dmin m)) = d sc C - (128 d sc +
// dmin m) X, with C = sum(x (128 + q)) from the tensor cores and X = sum(x). Which weights pair up in a register
// does not matter as long as A and B agree: a 32-bit word of nibbles gives the pairs (bytes 0, 2) and (1, 3), and
// the block stages x in shared memory once in that order, with every sub-block's sum.
//
// Taken with `--q4k-tensor-cores` only, until it has run on a GPU: tools/q4k_mma_emulate.py replays its index math
// lane by lane (keep the two in step), and tests/cuda_quantized_decode.rs and scripts/gpu_q4k_mma.sh are ready for
// the first lent GPU.
#define QMMA_WARPS 4

// Shared memory of the kernel (dynamic; qgemv.rs sizes it, k / 2 + k / 32 + 16 words): x as bf16 pairs in the
// weights' pair order (k / 2 words), the sub-blocks' sums of x (k / 32 floats), and 16 zero words the lanes outside
// B's diagonal read.

// Stage x into shared memory: per 32-value sub-block s, words 16 s .. 16 s + 15 hold the pairs (x[4m], x[4m + 2])
// at 2m and (x[4m + 1], x[4m + 3]) at 2m + 1, and sums[s] = sum of the 32 values.
__device__ __forceinline__ void qmma_stage(const __nv_bfloat16* x, int k, uint32_t* pairs, float* sums,
                                           uint32_t* zeros) {
  for (int s = threadIdx.x; s < k / 32; s += blockDim.x) {
    const uint4* src = reinterpret_cast<const uint4*>(x + 32 * s);
    uint32_t nat[16];
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const uint4 v = src[c];
      nat[4 * c] = v.x;
      nat[4 * c + 1] = v.y;
      nat[4 * c + 2] = v.z;
      nat[4 * c + 3] = v.w;
    }
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&nat[i]));
      sum += f.x + f.y;
    }
    uint4* dst = reinterpret_cast<uint4*>(pairs + 16 * s);
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const uint32_t a = nat[4 * c], b = nat[4 * c + 1], e = nat[4 * c + 2], f = nat[4 * c + 3];
      dst[c] = make_uint4(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632), __byte_perm(e, f, 0x5410),
                          __byte_perm(e, f, 0x7632));
    }
    sums[s] = sum;
  }
  if (threadIdx.x < 16) zeros[threadIdx.x] = 0u;
  __syncthreads();
}

// Word i (0..3) of a 16-byte load.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// What one row's block adds for sub-blocks 2t and 2t + 1: c0, c1 are the accumulator's C of those columns, x0, x1
// the sub-blocks' sums of x; head is the block's first 16 bytes (d, dmin, the 12 bytes of 6-bit scales and mins).
__device__ __forceinline__ float q4k_mma_fold(const uint4& head, int t, float c0, float c1, float x0, float x1) {
  const float d = __half2float(__ushort_as_half((unsigned short)(head.x & 0xFFFF)));
  const float dmin = __half2float(__ushort_as_half((unsigned short)(head.x >> 16)));
  // The eight 6-bit scales and mins four to a word (ggml's get_scale_min_k4 for all j at once): j < 4 from the
  // low six bits of bytes j and j + 4; j >= 4 from the nibbles of byte j + 4 and the top two bits of bytes j - 4, j.
  const uint32_t sc = t < 2 ? head.y & 0x3F3F3F3Fu : (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u);
  const uint32_t mn = t < 2 ? head.z & 0x3F3F3F3Fu : ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u);
  const int e = 2 * (t & 1);
  const float ds0 = d * byte_at(sc, e), ds1 = d * byte_at(sc, e + 1);
  const float dm0 = dmin * byte_at(mn, e), dm1 = dmin * byte_at(mn, e + 1);
  return ds0 * c0 + ds1 * c1 - fmaf(128.f, ds0, dm0) * x0 - fmaf(128.f, ds1, dm1) * x1;
}

// Grid and split as qgemv_rows: with SPLIT 1 each warp takes 16 rows alone (64 rows a block); with SPLIT
// QMMA_WARPS the block's warps share 16 rows, each taking every fourth block of k, and meet in shared memory.
// k is a multiple of 256 and x 16-byte aligned.
template <int SPLIT>
__device__ void qgemv_q4k_mma(const __nv_bfloat16* x, const QSegments& segs, __nv_bfloat16* y, int n, int k) {
  static_assert(SPLIT == 1 || SPLIT == QMMA_WARPS, "a group of warps is one warp or the whole block");
  extern __shared__ __align__(16) uint32_t qmma_smem[];
  uint32_t* pairs = qmma_smem;
  float* sums = reinterpret_cast<float*>(qmma_smem + k / 2);
  uint32_t* zeros = qmma_smem + k / 2 + k / 32;
  qmma_stage(x, k, pairs, sums, zeros);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = (SPLIT == 1 ? blockIdx.x * QMMA_WARPS + warp : blockIdx.x) * 16;
  if (row0 >= n) return;  // with SPLIT > 1 the whole block returns together
  const int blocks = k / 256;
  const size_t row_bytes = (size_t)blocks * 144;
  const uint8_t* ra = segment_row(segs, min(row0 + g, n - 1), row_bytes);
  const uint8_t* rb = segment_row(segs, min(row0 + g + 8, n - 1), row_bytes);
  // Sub-blocks t and t + 4 are one nibble half (t % 2) of groups t / 2 and t / 2 + 2 (32 bytes each).
  const int shift = 4 * (t & 1), group = 16 + 32 * (t >> 1);
  const bool own0 = g == t, own1 = g == t + 4;
  float acc_a = 0.f, acc_b = 0.f;
#pragma unroll 2
  for (int b = warp % SPLIT; b < blocks; b += SPLIT) {
    const uint8_t* ba = ra + (size_t)b * 144;
    const uint8_t* bb = rb + (size_t)b * 144;
    const uint4 ha = *reinterpret_cast<const uint4*>(ba), hb = *reinterpret_cast<const uint4*>(bb);
    uint4 qa[4], qb[4];  // [0, 1]: group t / 2, [2, 3]: group t / 2 + 2
#pragma unroll
    for (int h = 0; h < 2; h++) {
      qa[h] = *reinterpret_cast<const uint4*>(ba + group + 16 * h);
      qa[2 + h] = *reinterpret_cast<const uint4*>(ba + group + 64 + 16 * h);
      qb[h] = *reinterpret_cast<const uint4*>(bb + group + 16 * h);
      qb[2 + h] = *reinterpret_cast<const uint4*>(bb + group + 64 + 16 * h);
    }
    const uint4* x0 = reinterpret_cast<const uint4*>(own0 ? pairs + 16 * (8 * b + t) : zeros);
    const uint4* x1 = reinterpret_cast<const uint4*>(own1 ? pairs + 16 * (8 * b + t + 4) : zeros);
    uint4 b0[4], b1[4];
#pragma unroll
    for (int c = 0; c < 4; c++) {
      b0[c] = x0[c];
      b1[c] = x1[c];
    }
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int m = i >> 1, sh = shift + 8 * (i & 1);
      const uint32_t wa0 = word_of(qa[m >> 2], m & 3), wb0 = word_of(qb[m >> 2], m & 3);
      const uint32_t wa1 = word_of(qa[2 + (m >> 2)], m & 3), wb1 = word_of(qb[2 + (m >> 2)], m & 3);
      const uint32_t a[4] = {((wa0 >> sh) & 0x000F000Fu) | 0x43004300u, ((wb0 >> sh) & 0x000F000Fu) | 0x43004300u,
                             ((wa1 >> sh) & 0x000F000Fu) | 0x43004300u, ((wb1 >> sh) & 0x000F000Fu) | 0x43004300u};
      const uint32_t bv[2] = {word_of(b0[i >> 2], i & 3), word_of(b1[i >> 2], i & 3)};
      mma16816<__nv_bfloat16>(c, a, bv);
    }
    const float2 xs = *reinterpret_cast<const float2*>(sums + 8 * b + 2 * t);
    acc_a += q4k_mma_fold(ha, t, c[0], c[1], xs.x, xs.y);
    acc_b += q4k_mma_fold(hb, t, c[2], c[3], xs.x, xs.y);
  }
  // The four lanes of a row hold its sub-blocks two by two.
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    acc_a += __shfl_xor_sync(0xffffffffu, acc_a, o);
    acc_b += __shfl_xor_sync(0xffffffffu, acc_b, o);
  }
  if (SPLIT > 1) {
    __shared__ float partial[QMMA_WARPS][16];
    if (t == 0) {
      partial[warp][g] = acc_a;
      partial[warp][g + 8] = acc_b;
    }
    __syncthreads();
    if (warp != 0 || lane >= 16) return;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < SPLIT; w++) sum += partial[w][lane];
    if (row0 + lane < n) y[row0 + lane] = __float2bfloat16(sum);
    return;
  }
  if (t == 0) {
    if (row0 + g < n) y[row0 + g] = __float2bfloat16(acc_a);
    if (row0 + g + 8 < n) y[row0 + g + 8] = __float2bfloat16(acc_b);
  }
}

extern "C" __global__ void qgemv_q4k_mma_s1_bf16(const __nv_bfloat16* x, QSegments s, __nv_bfloat16* y, int n,
                                                  int k) {
  qgemv_q4k_mma<1>(x, s, y, n, k);
}
extern "C" __global__ void qgemv_q4k_mma_s4_bf16(const __nv_bfloat16* x, QSegments s, __nv_bfloat16* y, int n,
                                                  int k) {
  qgemv_q4k_mma<QMMA_WARPS>(x, s, y, n, k);
}
