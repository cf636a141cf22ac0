// Qwen3's per-head RMSNorm of the queries and keys followed by RoPE, in one launch instead of
// three (q-norm, k-norm, rotary): in place on q [tokens, q_heads * head_dim] and
// k [tokens, k_heads * head_dim], rows `q_stride` / `k_stride` elements apart (views into the
// fused qkv projection). Rounds where the reference ops round: the normalised value to the
// model's dtype before the weight multiplies it, that product, and the rotated result.
#include <cmath>

#include "cuda_model.h"

constexpr int kLanes = 32;  // a warp

// x stored in T and read back: where the reference ops keep an intermediate in the model's dtype.
template <typename T>
__device__ inline float rounded(float x) { return to_float(from_float<T>(x)); }

// One warp per (token, head); a block holds blockDim.x / 32 heads of one token. Lane l owns the
// pairs (i, i + head_dim / 2) that RoPE rotates together ("neox" layout) for i = l, l + 32, ...:
// kPairs of them, so its values stay in registers, and each load of the warp reads 32
// neighbouring elements of the row. Heads below 64 leave the lanes from head_dim / 2 on idle.
// The sum of squares is added up across the warp by shuffles: no shared memory, no barrier.
template <typename T, int kPairs>
__global__ void qk_norm_rope_kernel(T* __restrict__ q, T* __restrict__ k, int64_t q_stride,
                                    int64_t k_stride, int64_t q_heads, int64_t head_dim,
                                    const T* __restrict__ q_weight, const T* __restrict__ k_weight,
                                    const float* __restrict__ cos_sin,
                                    const int64_t* __restrict__ positions, float eps) {
  const int lane = threadIdx.x % kLanes, half = static_cast<int>(head_dim / 2);
  const int64_t token = blockIdx.x;
  const int64_t head = blockIdx.y * (blockDim.x / kLanes) + threadIdx.x / kLanes;
  const bool is_q = head < q_heads;
  T* x = is_q ? q + token * q_stride + head * head_dim
              : k + token * k_stride + (head - q_heads) * head_dim;
  const T* weight = is_q ? q_weight : k_weight;
  wait_for_previous_kernel();  // q and k: the projection's output
  const float* row = cos_sin + positions[token] * head_dim;  // cos in the first half, sin after

  // Every load first, the table's too, so that their latencies overlap.
  float a[kPairs], b[kPairs], cos_i[kPairs], sin_i[kPairs], sum = 0.0f;
  for (int p = 0; p < kPairs; ++p) {
    const int i = lane + p * kLanes;
    const bool mine = i < half;
    a[p] = mine ? to_float(x[i]) : 0.0f;
    b[p] = mine ? to_float(x[i + half]) : 0.0f;
    cos_i[p] = mine ? row[i] : 0.0f;
    sin_i[p] = mine ? row[i + half] : 0.0f;
    sum += a[p] * a[p] + b[p] * b[p];
  }
  // Butterfly: at each step every lane adds the partial sum of the lane `offset` away; after
  // five steps all 32 hold the total, bit for bit the same (each addition has the same two
  // terms, only swapped).
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float inv_rms = 1.0f / sqrtf(sum / static_cast<float>(head_dim) + eps);
  let_next_kernel_start();

  for (int p = 0; p < kPairs; ++p) {
    const int i = lane + p * kLanes;
    if (i >= half) break;
    const float na = rounded<T>(rounded<T>(a[p] * inv_rms) * to_float(weight[i]));
    const float nb = rounded<T>(rounded<T>(b[p] * inv_rms) * to_float(weight[i + half]));
    x[i] = from_float<T>(na * cos_i[p] - nb * sin_i[p]);
    x[i + half] = from_float<T>(nb * cos_i[p] + na * sin_i[p]);
  }
}

template <typename T>
static void launch_qk_norm_rope(void* q, void* k, int64_t q_stride, int64_t k_stride,
                                int64_t num_tokens, int64_t q_heads, int64_t k_heads,
                                int64_t head_dim, const void* q_weight, const void* k_weight,
                                const float* cos_sin, const int64_t* positions, float eps,
                                void* stream) {
  // Up to 8 heads a block, a number that divides the heads: every warp has a head, so the whole
  // block reaches the shuffles (which the emulator needs) and no thread is launched for nothing.
  const int64_t heads = q_heads + k_heads;
  const int64_t warps = heads % 8 == 0 ? 8 : heads % 4 == 0 ? 4 : heads % 2 == 0 ? 2 : 1;
  auto kernel = head_dim <= 64    ? qk_norm_rope_kernel<T, 1>
                : head_dim == 128 ? qk_norm_rope_kernel<T, 2>
                                  : qk_norm_rope_kernel<T, 4>;
  LAUNCH(kernel, dim3(num_tokens, heads / warps), dim3(kLanes * warps), stream,
         static_cast<T*>(q), static_cast<T*>(k), q_stride, k_stride, q_heads, head_dim,
         static_cast<const T*>(q_weight), static_cast<const T*>(k_weight), cos_sin, positions,
         eps);
}

// dtype: 0 float32, 1 bfloat16. Returns a CUDA error code (0: none); -1 for a head size the
// kernel is not compiled for: head_dim must be a power of two up to 256 (64, 128 and 256 give
// each lane 1, 2 or 4 pairs; a smaller head leaves lanes idle).
extern "C" int minisgl_qk_norm_rope(void* q, void* k, int64_t q_stride, int64_t k_stride,
                                    int64_t num_tokens, int64_t q_heads, int64_t k_heads,
                                    int64_t head_dim, const void* q_weight, const void* k_weight,
                                    const float* cos_sin, const int64_t* positions, float eps,
                                    int dtype, void* stream) {
  if (head_dim < 2 || head_dim > 256 || (head_dim & (head_dim - 1)) != 0) return -1;
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
