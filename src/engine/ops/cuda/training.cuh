// The training pass's element-wise kernels (included by fused.cu, after the shared helpers it defines; loaded by
// src/engine/ops/cuda/training.rs): attention probabilities, the SwiGLU gate, the input gradients of softmax, RMS
// norm (with the residual gradient added; launched by residual.rs) and the SwiGLU gate, scattering the head's
// row gradients back, and the head's cross-entropy. Math in f32 for every storage type.

// ---- Training: forward attention probabilities and the element-wise blocks' input gradients ----

// softmax(scale * x + mask[row % t]) per row of `cols`; mask (t, cols) f32 or null. One block per row.
template <typename T>
__device__ void masked_softmax(const T* x, const float* mask, T* out, int cols, int t, float scale) {
  __shared__ float scratch[32];
  const size_t row = blockIdx.x;
  const T* xr = x + row * cols;
  const float* mr = mask ? mask + (size_t)(row % t) * cols : nullptr;
  T* o = out + row * cols;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, to_f(xr[i]) * scale + (mr ? mr[i] : 0.f));
  m = block_max(m, scratch);
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += __expf(to_f(xr[i]) * scale + (mr ? mr[i] : 0.f) - m);
  s = block_sum(s, scratch);
  const float inv = 1.f / s;
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    o[i] = from_f<T>(__expf(to_f(xr[i]) * scale + (mr ? mr[i] : 0.f) - m) * inv);
}

// Input gradient of softmax(scale * x + mask) from its output p: scale * p * (dp - sum(dp * p)).
template <typename T>
__device__ void softmax_backward(const T* p, const T* dp, T* dx, int cols, float scale) {
  __shared__ float scratch[32];
  const size_t row = blockIdx.x;
  const T *pr = p + row * cols, *gr = dp + row * cols;
  float dot = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) dot += to_f(pr[i]) * to_f(gr[i]);
  dot = block_sum(dot, scratch);
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    dx[row * cols + i] = from_f<T>(scale * to_f(pr[i]) * (to_f(gr[i]) - dot));
}

// RMS norm's input gradient (frozen weight): inv * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * inv; with
// `addend` non-null its row is added (the residual branch's gradient, summed in the same pass).
template <typename T>
__device__ void rms_norm_backward(const T* x, const T* dy, const T* w, const T* addend, T* dx, int cols, float eps) {
  __shared__ float scratch[32];
  constexpr int V = Group16<T>::V;
  const size_t row = blockIdx.x;
  const T *xr = x + row * cols, *gr = dy + row * cols, *ar = addend == nullptr ? nullptr : addend + row * cols;
  T* out = dx + row * cols;
  const bool wide = cols % V == 0 && aligned16(xr) && aligned16(gr) && aligned16(w) && aligned16(out) &&
                    (ar == nullptr || aligned16(ar));
  float sq = 0.f, gx = 0.f;
  if (wide) {
    for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
      float xv[V], gv[V], wv[V];
      load16(xr + c, xv);
      load16(gr + c, gv);
      load16(w + c, wv);
#pragma unroll
      for (int k = 0; k < V; k++) {
        sq += xv[k] * xv[k];
        gx += gv[k] * wv[k] * xv[k];
      }
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
      const float v = to_f(xr[i]);
      sq += v * v;
      gx += to_f(gr[i]) * to_f(w[i]) * v;
    }
  }
  sq = block_sum(sq, scratch);
  gx = block_sum(gx, scratch);
  const float inv = rsqrtf(sq / cols + eps);
  const float dot = gx * inv / cols;
  auto grad = [&](float xi, float gi, float wi, float ai) { return ai + inv * (gi * wi - xi * inv * dot); };
  if (wide) {
    for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
      float xv[V], gv[V], wv[V], av[V];
      load16(xr + c, xv);
      load16(gr + c, gv);
      load16(w + c, wv);
      if (ar != nullptr) {
        load16(ar + c, av);
      } else {
#pragma unroll
        for (int k = 0; k < V; k++) av[k] = 0.f;
      }
#pragma unroll
      for (int k = 0; k < V; k++) av[k] = grad(xv[k], gv[k], wv[k], av[k]);
      store16(out + c, av);
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
      out[i] = from_f<T>(grad(to_f(xr[i]), to_f(gr[i]), to_f(w[i]), ar == nullptr ? 0.f : to_f(ar[i])));
  }
}

// Gradients of silu(gate) * up: out[0 .. n] = d gate, out[n .. 2n] = d up.
template <typename T>
__device__ void silu_mul_backward(const T* gate, const T* up, const T* dm, T* out, size_t n) {
  auto grads = [](float g, float u, float d, float* dg, float* du) {
    const float sig = 1.f / (1.f + __expf(-g));
    *dg = d * u * sig * (1.f + g * (1.f - sig));
    *du = d * g * sig;
  };
  constexpr int V = Group16<T>::V;
  const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  if (n % V == 0 && aligned16(gate) && aligned16(up) && aligned16(dm) && aligned16(out)) {
    for (size_t c = first * V; c < n; c += stride * V) {
      float g[V], u[V], d[V], dg[V], du[V];
      load16(gate + c, g);
      load16(up + c, u);
      load16(dm + c, d);
#pragma unroll
      for (int k = 0; k < V; k++) grads(g[k], u[k], d[k], &dg[k], &du[k]);
      store16(out + c, dg);
      store16(out + n + c, du);
    }
    return;
  }
  for (size_t i = first; i < n; i += stride) {
    float dg, du;
    grads(to_f(gate[i]), to_f(up[i]), to_f(dm[i]), &dg, &du);
    out[i] = from_f<T>(dg);
    out[n + i] = from_f<T>(du);
  }
}

// silu(gate) * up, one pass (f32 math, one rounding).
template <typename T>
__device__ void silu_mul(const T* gate, const T* up, T* out, size_t n) {
  constexpr int V = Group16<T>::V;
  const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  if (n % V == 0 && aligned16(gate) && aligned16(up) && aligned16(out)) {
    for (size_t c = first * V; c < n; c += stride * V) {
      float g[V], u[V];
      load16(gate + c, g);
      load16(up + c, u);
#pragma unroll
      for (int k = 0; k < V; k++) g[k] = g[k] / (1.f + __expf(-g[k])) * u[k];
      store16(out + c, g);
    }
    return;
  }
  for (size_t i = first; i < n; i += stride) {
    const float g = to_f(gate[i]);
    out[i] = from_f<T>(g / (1.f + __expf(-g)) * to_f(up[i]));
  }
}

// One row of `cols` elements copied by the block's threads: 16 bytes at a time when both rows allow it.
template <typename T>
__device__ __forceinline__ void copy_row(const T* from, T* to, int cols) {
  constexpr int V = 16 / sizeof(T);
  if (cols % V == 0 && aligned16(from) && aligned16(to)) {
    const uint4* f = reinterpret_cast<const uint4*>(from);
    uint4* t = reinterpret_cast<uint4*>(to);
    for (int i = threadIdx.x; i < cols / V; i += blockDim.x) t[i] = f[i];
    return;
  }
  for (int i = threadIdx.x; i < cols; i += blockDim.x) to[i] = from[i];
}

// Row i of src (n rows of `cols`) into row index[i] of out, which holds zeros elsewhere (the indices are distinct:
// the positions that have a target). Grid (n), block 256.
template <typename T>
__device__ void scatter_rows(const T* src, const uint32_t* index, T* out, int cols) {
  copy_row(src + (size_t)blockIdx.x * cols, out + (size_t)index[blockIdx.x] * cols, cols);
}

// Row index[i] of src (`rows` rows of `cols`) into row i of out: the embedding's lookup, the head's target
// positions. An index past the rows stops the kernel (a device assert, as Candle's index_select). Grid (n),
// block 256.
template <typename T>
__device__ void gather_rows(const T* src, const uint32_t* index, T* out, int cols, unsigned int rows) {
  const unsigned int row = index[blockIdx.x];
  assert(row < rows);
  copy_row(src + (size_t)row * cols, out + (size_t)blockIdx.x * cols, cols);
}

#define INSTANTIATE_TRAINING(T, SUFFIX)                                                                          \
  extern "C" __global__ void masked_softmax_##SUFFIX(const T* x, const float* mask, T* out, int cols, int t,     \
                                                     float scale) {                                              \
    masked_softmax<T>(x, mask, out, cols, t, scale);                                                             \
  }                                                                                                              \
  extern "C" __global__ void softmax_backward_##SUFFIX(const T* p, const T* dp, T* dx, int cols, float scale) {  \
    softmax_backward<T>(p, dp, dx, cols, scale);                                                                 \
  }                                                                                                              \
  extern "C" __global__ void rms_norm_backward_##SUFFIX(const T* x, const T* dy, const T* w, const T* addend,    \
                                                        T* dx, int cols, float eps) {                            \
    rms_norm_backward<T>(x, dy, w, addend, dx, cols, eps);                                                       \
  }                                                                                                              \
  extern "C" __global__ void silu_mul_backward_##SUFFIX(const T* gate, const T* up, const T* dm, T* out,        \
                                                        unsigned long long n) {                                  \
    silu_mul_backward<T>(gate, up, dm, out, (size_t)n);                                                          \
  }                                                                                                              \
  extern "C" __global__ void silu_mul_##SUFFIX(const T* gate, const T* up, T* out, unsigned long long n) {       \
    silu_mul<T>(gate, up, out, (size_t)n);                                                                       \
  }                                                                                                              \
  extern "C" __global__ void scatter_rows_##SUFFIX(const T* src, const uint32_t* index, T* out, int cols) {      \
    scatter_rows<T>(src, index, out, cols);                                                                      \
  }                                                                                                              \
  extern "C" __global__ void gather_rows_##SUFFIX(const T* src, const uint32_t* index, T* out, int cols,         \
                                                  unsigned int rows) {                                           \
    gather_rows<T>(src, index, out, cols, rows);                                                                 \
  }

INSTANTIATE_TRAINING(float, f32)
INSTANTIATE_TRAINING(__nv_bfloat16, bf16)

// ---- Cross-entropy over the head's logits, one block per row ----
// nll[row] = logsumexp(logits[row]) - logits[row][target[row]]; with dlogits non-null also
// dlogits[row] = scale * (softmax(logits[row]) - onehot(target[row])), the head's output gradient.
// Two passes over the row: the max and the sum of exponentials together (the sum rescaled when the max grows),
// then the gradient; 16-byte loads and stores when the rows allow them (a 128k vocabulary in bf16 is 256 KB a
// row, so the passes are bound by memory). dlogits may be logits itself (the gradient replaces the logits): each
// element is read and then written by the same thread, and the target's logit is read before the first barrier.
template <typename T>
__device__ void cross_entropy_rows(const T* logits, const uint32_t* targets, T* dlogits, float* nll, int vocab,
                                   float scale) {
  __shared__ float scratch[32];
  constexpr int V = Group16<T>::V;
  const size_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  T* d = dlogits == nullptr ? nullptr : dlogits + row * vocab;
  const bool wide = vocab % V == 0 && aligned16(x) && aligned16(d);
  const uint32_t target = targets[row];
  const float target_logit = threadIdx.x == 0 ? to_f(x[target]) : 0.f;
  float m = -INFINITY, s = 0.f;
  auto take = [&](const float* v, int count) {
    float top = v[0];
    for (int k = 1; k < count; k++) top = fmaxf(top, v[k]);
    if (top > m) {
      s *= __expf(m - top);
      m = top;
    }
    if (m == -INFINITY) return;  // every value so far is -inf
    for (int k = 0; k < count; k++) s += __expf(v[k] - m);
  };
  if (wide) {
    for (int c = threadIdx.x * V; c < vocab; c += blockDim.x * V) {
      float v[V];
      load16(x + c, v);
      take(v, V);
    }
  } else {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = to_f(x[i]);
      take(&v, 1);
    }
  }
  const float top = block_max(m, scratch);
  s = block_sum(m == -INFINITY ? 0.f : s * __expf(m - top), scratch);
  const float lse = top + __logf(s);
  if (threadIdx.x == 0) nll[row] = lse - target_logit;
  if (d == nullptr) return;
  auto grad = [&](float v, int i) { return scale * (__expf(v - lse) - (i == (int)target ? 1.f : 0.f)); };
  if (wide) {
    for (int c = threadIdx.x * V; c < vocab; c += blockDim.x * V) {
      float v[V];
      load16(x + c, v);
#pragma unroll
      for (int k = 0; k < V; k++) v[k] = grad(v[k], c + k);
      store16(d + c, v);
    }
  } else {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) d[i] = from_f<T>(grad(to_f(x[i]), i));
  }
}

extern "C" __global__ void cross_entropy_rows_f32(const float* logits, const uint32_t* targets, float* dlogits,
                                                  float* nll, int vocab, float scale) {
  cross_entropy_rows<float>(logits, targets, dlogits, nll, vocab, scale);
}
extern "C" __global__ void cross_entropy_rows_bf16(const __nv_bfloat16* logits, const uint32_t* targets,
                                                   __nv_bfloat16* dlogits, float* nll, int vocab, float scale) {
  cross_entropy_rows<__nv_bfloat16>(logits, targets, dlogits, nll, vocab, scale);
}

// Adapter dropout (ops/dropout.rs draws the same masks on the CPU, with the same integer arithmetic): element i of a
// mask is kept when the top 24 bits of splitmix64's output i + 1 from `base` fall below `threshold`.
__device__ __forceinline__ unsigned long long dropout_mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// x times its dropout mask, the mask never written: kept elements times `scale` as rounded to T, which is what
// multiplying by the mask tensor gives; dropped ones 0.
template <typename T>
__device__ void dropout_apply(const T* x, T* out, unsigned long long n, unsigned long long base, unsigned threshold,
                              float scale) {
  const float s = to_f(from_f<T>(scale));
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long z = dropout_mix(base + (i + 1) * 0x9E3779B97F4A7C15ull);
    out[i] = from_f<T>((unsigned)(z >> 40) < threshold ? to_f(x[i]) * s : 0.f);
  }
}
extern "C" __global__ void dropout_apply_f32(const float* x, float* out, unsigned long long n, unsigned long long base,
                                             unsigned threshold, float scale) {
  dropout_apply<float>(x, out, n, base, threshold, scale);
}
extern "C" __global__ void dropout_apply_bf16(const __nv_bfloat16* x, __nv_bfloat16* out, unsigned long long n,
                                              unsigned long long base, unsigned threshold, float scale) {
  dropout_apply<__nv_bfloat16>(x, out, n, base, threshold, scale);
}
