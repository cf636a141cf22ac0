// One token per row of logits [rows, vocab], drawn from softmax(row / temperature) in a single
// pass over the row: by the Gumbel-max trick, argmax_i (logit_i / T + G_i) with G_i =
// -log(-log U_i), U_i uniform on (0, 1), is token i with probability softmax(logits / T)_i.
// No probabilities are written and nothing is read twice, where the reference ops (scale,
// softmax, multinomial) pass over the whole vocabulary about ten times. A row of temperature 0
// is greedy: the first largest logit, as torch.argmax picks it (a NaN counts as the largest).
//
// The uniforms come from Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11), a counter-based generator: the four numbers for columns 4g .. 4g + 3 of a
// row are a pure function of (seed, draw, row, g). Threads share no generator state, and the
// same seed and draw number give the same uniforms on any GPU, at any block size, and in the
// emulator.
#include <climits>
#include <cmath>

#include "cuda_model.h"

constexpr int kThreads = 512;

struct Philox4 { uint32_t x, y, z, w; };

HOST_DEVICE inline void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

// Ten rounds of the Philox4x32 bijection on `c` under the key (k0, k1), bumped every round.
HOST_DEVICE inline Philox4 philox(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(0xD2511F53u, c.x, hi0, lo0);
    mul_hi_lo(0xCD9E8D57u, c.z, hi1, lo1);
    c = Philox4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The top 24 bits as a float strictly inside (0, 1): log(u) and log(-log(u)) are finite.
HOST_DEVICE inline float uniform(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

// Is (key, col) ahead of (best, best_col)? Larger first, then the smaller column; a NaN is
// ahead of every number (torch.argmax's order).
HOST_DEVICE inline bool ahead(float key, int col, float best, int best_col) {
  if (key != key) return best == best || col < best_col;
  if (best != best) return false;
  return key > best || (key == best && col < best_col);
}

// One block per row. Thread t takes the groups of four columns g = t, t + kThreads, ...; the
// block then reduces its kThreads candidates in shared memory.
template <typename T>
__global__ void sample_kernel(int32_t* __restrict__ out, const T* __restrict__ logits,
                              int64_t row_stride, int64_t vocab,
                              const float* __restrict__ temperatures, uint64_t seed,
                              uint64_t draw) {
  __shared__ float keys[kThreads];
  __shared__ int cols[kThreads];
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x;
  wait_for_previous_kernel();  // the logits
  const T* x = logits + row * row_stride;
  const float temperature = temperatures[row];
  const float inv_t = temperature > 0.0f ? 1.0f / temperature : 0.0f;
  float best = -INFINITY;
  int best_col = INT_MAX;
  for (int64_t g = t; g * 4 < vocab; g += kThreads) {
    uint32_t bits[4] = {0, 0, 0, 0};
    if (temperature > 0.0f) {
      const Philox4 r = philox(Philox4{static_cast<uint32_t>(g), static_cast<uint32_t>(row),
                                       static_cast<uint32_t>(draw),
                                       static_cast<uint32_t>(draw >> 32)},
                               static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
      bits[0] = r.x, bits[1] = r.y, bits[2] = r.z, bits[3] = r.w;
    }
    for (int j = 0; j < 4 && g * 4 + j < vocab; ++j) {
      const int col = static_cast<int>(g * 4 + j);
      const float logit = to_float(x[col]);
      const float key =
          temperature > 0.0f ? logit * inv_t - logf(-logf(uniform(bits[j]))) : logit;
      if (ahead(key, col, best, best_col)) best = key, best_col = col;
    }
  }
  let_next_kernel_start();
  keys[t] = best;
  cols[t] = best_col;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (t < half && ahead(keys[t + half], cols[t + half], keys[t], cols[t]))
      keys[t] = keys[t + half], cols[t] = cols[t + half];
    __syncthreads();
  }
  if (t == 0) out[row] = cols[0];
}

// dtype: 0 float32, 1 bfloat16. Returns a CUDA error code (0: none).
extern "C" int minisgl_sample(int32_t* out, const void* logits, int64_t row_stride, int64_t rows,
                              int64_t vocab, const float* temperatures, uint64_t seed,
                              uint64_t draw, int dtype, void* stream) {
  if (rows == 0) return 0;
  if (dtype == 0)
    LAUNCH(sample_kernel<float>, dim3(rows), dim3(kThreads), stream, out,
           static_cast<const float*>(logits), row_stride, vocab, temperatures, seed, draw);
  else
    LAUNCH(sample_kernel<bf16>, dim3(rows), dim3(kThreads), stream, out,
           static_cast<const bf16*>(logits), row_stride, vocab, temperatures, seed, draw);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
