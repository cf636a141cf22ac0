// Qwen3's per-head RMSNorm of the queries and keys followed by RoPE, in one launch instead of
// three (q-norm, k-norm, rotary): in place on q [tokens, q_heads * head_dim] and
// k [tokens, k_heads * head_dim], rows `q_stride` / `k_stride` elements apart (views into the
// fused qkv projection). Rounds where the reference ops round: the normalised value to the
// model's dtype before the weight multiplies it, that product, and the rotated result.
#include <cmath>

#include "cuda_model.h"

constexpr int kMaxHalfDim = 128;  // head_dim up to 256

// x stored in T and read back: where the reference ops keep an intermediate in the model's dtype.
template <typename T>
__device__ inline float rounded(float x) { return to_float(from_float<T>(x)); }

// One block per (token, head); thread i owns the pair (i, i + head_dim / 2) that RoPE rotates
// together ("neox" layout), so after the block-wide sum of squares each thread finishes its
// pair alone.
template <typename T>
__global__ void qk_norm_rope_kernel(T* __restrict__ q, T* __restrict__ k, int64_t q_stride,
                                    int64_t k_stride, int64_t q_heads, int64_t head_dim,
                                    const T* __restrict__ q_weight, const T* __restrict__ k_weight,
                                    const float* __restrict__ cos_sin,
                                    const int64_t* __restrict__ positions, float eps) {
  __shared__ float partial[kMaxHalfDim];
  const int64_t token = blockIdx.x, head = blockIdx.y, half = head_dim / 2;
  const bool is_q = head < q_heads;
  T* x = is_q ? q + token * q_stride + head * head_dim
              : k + token * k_stride + (head - q_heads) * head_dim;
  const T* weight = is_q ? q_weight : k_weight;
  const int i = threadIdx.x;
  const float a = to_float(x[i]), b = to_float(x[i + half]);

  // Sum of squares over the head: a tree in shared memory, halving the active threads.
  partial[i] = a * a + b * b;
  __syncthreads();
  for (int active = blockDim.x / 2; active > 0; active /= 2) {
    if (i < active) partial[i] += partial[i + active];
    __syncthreads();
  }
  const float inv_rms = 1.0f / sqrtf(partial[0] / static_cast<float>(head_dim) + eps);

  const float na = rounded<T>(rounded<T>(a * inv_rms) * to_float(weight[i]));
  const float nb = rounded<T>(rounded<T>(b * inv_rms) * to_float(weight[i + half]));
  const float* row = cos_sin + positions[token] * head_dim;  // cos in the first half, sin after
  const float cos_i = row[i], sin_i = row[i + half];
  x[i] = from_float<T>(na * cos_i - nb * sin_i);
  x[i + half] = from_float<T>(nb * cos_i + na * sin_i);
}

template <typename T>
static void launch_qk_norm_rope(void* q, void* k, int64_t q_stride, int64_t k_stride,
                                int64_t num_tokens, int64_t q_heads, int64_t k_heads,
                                int64_t head_dim, const void* q_weight, const void* k_weight,
                                const float* cos_sin, const int64_t* positions, float eps,
                                void* stream) {
  LAUNCH(qk_norm_rope_kernel<T>, dim3(num_tokens, q_heads + k_heads), dim3(head_dim / 2), stream,
         static_cast<T*>(q), static_cast<T*>(k), q_stride, k_stride, q_heads, head_dim,
         static_cast<const T*>(q_weight), static_cast<const T*>(k_weight), cos_sin, positions,
         eps);
}

// dtype: 0 float32, 1 bfloat16. Returns a CUDA error code (0: none); -1 for a shape the kernel
// does not take (head_dim odd, above 256, or half of it not a power of two).
extern "C" int minisgl_qk_norm_rope(void* q, void* k, int64_t q_stride, int64_t k_stride,
                                    int64_t num_tokens, int64_t q_heads, int64_t k_heads,
                                    int64_t head_dim, const void* q_weight, const void* k_weight,
                                    const float* cos_sin, const int64_t* positions, float eps,
                                    int dtype, void* stream) {
  const int64_t half = head_dim / 2;
  if (head_dim % 2 != 0 || half > kMaxHalfDim || (half & (half - 1)) != 0) return -1;
  if (num_tokens == 0) return 0;
  if (dtype == 0)
    launch_qk_norm_rope<float>(q, k, q_stride, k_stride, num_tokens, q_heads, k_heads, head_dim,
                               q_weight, k_weight, cos_sin, positions, eps, stream);
  else
    launch_qk_norm_rope<bf16>(q, k, q_stride, k_stride, num_tokens, q_heads, k_heads, head_dim,
                              q_weight, k_weight, cos_sin, positions, eps, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
