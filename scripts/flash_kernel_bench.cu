// Times the fused attention kernels (src/engine/ops/cuda/flash_attention*.cuh) alone, at the Llama-3.2-1B
// attention shape (32 heads, 8 KV heads, head_dim 64, bf16, causal, random inputs; HEAD_DIM=128 in the environment
// for Llama-3.1-8B's: head_dim 128, the same heads): forward, dQ (which also writes
// each row's delta) and dK/dV, in ms and TFLOP/s, the mean of REPS launches after one warm-up launch. A causal
// T x T x D product counts T (T + 64) / 2 x D x 2 flops (the forward has two, dQ three, dK/dV four). With PREFIX it
// also writes out, lse, delta, dq, dk and dv to PREFIX-NAME.bin, so that two builds' outputs can be compared
// (scripts/gpu_flash_bench.sh).
//
// Build here (no GPU needed; the CUDA 13 toolkit of ../shared/cuda/README.md, CUDA_LIBS = the wheel's lib folder
// that holds libcudart_static.a), from the scripts folder:
//   nvcc -O3 -arch=sm_90a -std=c++17 flash_kernel_bench.cu -o flash_kernel_bench -cudart static -L$CUDA_LIBS
// sm_90a builds the kernels an H100 runs (warpgroup MMA); -arch=sm_90 the portable mma.sync ones (run it with
// MMA_SYNC=1 in the environment, so the grids are mma.sync's).
// (Add -DFUSED='"/other/checkout/src/engine/ops/cuda/fused.cu"' to build another version of the kernels of the
// same signatures: until 2026-11-24 a separate flash_delta kernel computed delta, built by that commit's copy.)
// Run on the lent GPU: flash_kernel_bench B T [REPS [PREFIX]]
#ifndef FUSED
#define FUSED "../src/engine/ops/cuda/fused.cu"
#endif
#include FUSED
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <string>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
typedef __nv_bfloat16 bf;
static bf* rnd(size_t n, float s, unsigned seed) {
  std::vector<bf> h(n); srand(seed);
  for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(s * ((rand() / (float)RAND_MAX) * 2.f - 1.f));
  bf* d; CK(cudaMalloc(&d, n * sizeof(bf))); CK(cudaMemcpy(d, h.data(), n * sizeof(bf), cudaMemcpyHostToDevice)); return d;
}
template <typename F> static float timeit(F f, int reps) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  f(); CK(cudaDeviceSynchronize());
  cudaEventRecord(a); for (int i = 0; i < reps; i++) f(); cudaEventRecord(b); CK(cudaEventSynchronize(b));
  float ms; cudaEventElapsedTime(&ms, a, b); CK(cudaGetLastError()); return ms / reps;
}
int main(int argc, char** argv) {
  int B = argc > 1 ? atoi(argv[1]) : 1, T = argc > 2 ? atoi(argv[2]) : 4096, reps = argc > 3 ? atoi(argv[3]) : 20;
  const int H = 32, KV = 8, D = getenv("HEAD_DIM") && atoi(getenv("HEAD_DIM")) == 128 ? 128 : 64;
  const float scale = 1.f / sqrtf((float)D);
  size_t nq = (size_t)B * H * T * D, nk = (size_t)B * KV * T * D;
  bf *q = rnd(nq, 1.f, 1), *k = rnd(nk, 1.f, 2), *v = rnd(nk, 1.f, 3), *dout = rnd(nq, 1.f, 4);
  bf *out, *dq, *dk, *dv; float *lse, *delta;
  CK(cudaMalloc(&out, nq * 2)); CK(cudaMalloc(&dq, nq * 2)); CK(cudaMalloc(&dk, nk * 2)); CK(cudaMalloc(&dv, nk * 2));
  CK(cudaMalloc(&lse, (size_t)B * H * T * 4)); CK(cudaMalloc(&delta, (size_t)B * H * T * 4));
  long long bs = (long long)KV * T * D, hs = (long long)T * D;
  dim3 gk((T + 63) / 64, KV, B);
  const double causal = 0.5 * (double)T * (T + 64) * D * H * B * 2;  // flops of one T x T x D product, causal
  // Rows a block owns: the sm_90a kernels' (R_WGMMA) on a 9.0 device of an sm_90a build, mma.sync's (R_MMA) else;
  // as cuda_attention.rs's query_grid (this host code cannot see which device build runs).
  int major = 0;
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  const bool wg = major == 9 && getenv("MMA_SYNC") == nullptr;  // MMA_SYNC=1 for a -arch=sm_90 build
  // Warpgroups a block on the sm_90a kernels: one, unless the kernels are built with the two-warpgroup blocks
  // measured and set aside on 2026-11-30 (bench-results/attention-two-warpgroups-h200-20261130/, its patch applied:
  // WgGroups, FA_WG64_GROUPS / FA_WG128_GROUPS at build time).
#ifdef FA_WG128_GROUPS
  const int groups = wg ? (D == 64 ? WgGroups<64>::value : WgGroups<128>::value) : 1, threads = 128 * groups;
#else
  const int groups = 1, threads = 128;
#endif
  const int fr = 64 * groups * (wg ? FwdTiles<64>::R_WGMMA : D == 64 ? FwdTiles<64>::R_MMA : FwdTiles<128>::R_MMA);
  const int qr = 64 * groups * (wg ? DqTiles<64>::R_WGMMA : D == 64 ? DqTiles<64>::R_MMA : DqTiles<128>::R_MMA);
  dim3 gf((T + fr - 1) / fr, H, B), gd((T + qr - 1) / qr, H, B);
  gk.x = (T + 64 * groups - 1) / (64 * groups);
  auto fwd = [&] {
    if (D == 64) flash_forward_d64_bf16<<<gf, threads>>>(q, k, v, out, lse, H, KV, T, T, bs, hs, 0, 0, nullptr, scale);
    else flash_forward_d128_bf16<<<gf, threads>>>(q, k, v, out, lse, H, KV, T, T, bs, hs, 0, 0, nullptr, scale);
  };
  auto bdq = [&] {
    if (D == 64) flash_backward_dq_d64_bf16<<<gd, threads>>>(q, k, v, out, dout, lse, delta, dq, H, KV, T, 0, nullptr, scale);
    else flash_backward_dq_d128_bf16<<<gd, threads>>>(q, k, v, out, dout, lse, delta, dq, H, KV, T, 0, nullptr, scale);
  };
  // The sm_90a head_dim 128 dK/dV kernel takes dynamic shared memory (builds of the kernels before it: none).
#ifdef FA_WG_DKV128_SMEM
  const int dkv128_smem = FA_WG_DKV128_SMEM;
  CK(cudaFuncSetAttribute(flash_backward_dkv_d128_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, dkv128_smem));
#else
  const int dkv128_smem = 0;
#endif
  auto bkv = [&] {
    if (D == 64) flash_backward_dkv_d64_bf16<<<gk, threads>>>(q, k, v, dout, lse, delta, dk, dv, H, KV, T, 0, nullptr, scale);
    else flash_backward_dkv_d128_bf16<<<gk, threads, dkv128_smem>>>(q, k, v, dout, lse, delta, dk, dv, H, KV, T, 0, nullptr, scale);
  };
  fwd(); bdq(); CK(cudaDeviceSynchronize());
  printf("shape b=%d T=%d heads=%d kv=%d D=%d\n", B, T, H, KV, D);
  float t;
  t = timeit(fwd, reps); printf("%-28s %8.3f ms %7.1f TFLOP/s\n", "forward", t, 2 * causal / t / 1e9);
  t = timeit(bdq, reps); printf("%-28s %8.3f ms %7.1f TFLOP/s\n", "dq", t, 3 * causal / t / 1e9);
  t = timeit(bkv, reps); printf("%-28s %8.3f ms %7.1f TFLOP/s\n", "dkv", t, 4 * causal / t / 1e9);
  if (argc > 4) {  // dump outputs for comparison between builds
    auto dump = [&](const char* name, const void* d, size_t bytes) {
      std::vector<char> h(bytes); CK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
      std::string p = std::string(argv[4]) + "-" + name + ".bin"; FILE* f = fopen(p.c_str(), "wb"); fwrite(h.data(), 1, bytes, f); fclose(f);
    };
    dump("out", out, nq * 2); dump("lse", lse, (size_t)B * H * T * 4); dump("delta", delta, (size_t)B * H * T * 4); dump("dq", dq, nq * 2); dump("dk", dk, nk * 2); dump("dv", dv, nk * 2);
  }
  return 0;
}
