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

// A row is read by many blocks, each taking a span of kSpan columns, and a second kernel picks
// the best of the spans' candidates. One block a row would keep one SM per row busy for the
// whole vocabulary while the others idle at small batches; with spans every SM has work even
// at batch 1. Spans are short and a thread holds only two groups, so the kernel
// needs 30 registers and an SM runs 2,048 of its threads: at large batches the arithmetic (two
// logf a column, a Philox every four), not the reading, sets its pace, and it needs that many
// threads to hide its latency. The argmax under `ahead` is a total order, so any split of the
// columns gives the same token.
constexpr int kThreads = 256;
constexpr int kGroupsPerThread = 2;  // groups of four columns; unrolled, their loads overlap
constexpr int64_t kSpan = 4 * kThreads * kGroupsPerThread;  // columns a block reads: 2,048

// The best (key, column) of `count` candidates a block's threads hold in shared memory.
__device__ inline void reduce_candidates(float* keys, int* cols, int t, int count) {
  for (int half = count / 2; half > 0; half /= 2) {
    if (t < half && ahead(keys[t + half], cols[t + half], keys[t], cols[t]))
      keys[t] = keys[t + half], cols[t] = cols[t + half];
    __syncthreads();
  }
}

// Block (row, span): thread t takes the groups g = span * kSpan / 4 + i * kThreads + t.
template <typename T>
__global__ void sample_span_kernel(float* __restrict__ span_keys, int32_t* __restrict__ span_cols,
                                   const T* __restrict__ logits, int64_t row_stride,
                                   int64_t vocab, const float* __restrict__ temperatures,
                                   uint64_t seed, uint64_t draw) {
  __shared__ float keys[kThreads];
  __shared__ int cols[kThreads];
  const int64_t row = blockIdx.x, span = blockIdx.y, spans = gridDim.y;
  const int t = threadIdx.x;
  wait_for_previous_kernel();  // the logits
  const T* x = logits + row * row_stride;
  const float temperature = temperatures[row];
  const float inv_t = temperature > 0.0f ? 1.0f / temperature : 0.0f;
  // Every load first, so that all of them are in flight at once, then the arithmetic.
  const int64_t first_group = span * (kSpan / 4) + t;
  float logit[kGroupsPerThread][4];
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i)
    for (int j = 0; j < 4; ++j) {
      const int64_t col = (first_group + i * kThreads) * 4 + j;
      logit[i][j] = col < vocab ? to_float(x[col]) : 0.0f;
    }
  float best = -INFINITY;
  int best_col = INT_MAX;
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    const int64_t g = first_group + i * kThreads;
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
      const float key =
          temperature > 0.0f ? logit[i][j] * inv_t - logf(-logf(uniform(bits[j]))) : logit[i][j];
      if (ahead(key, col, best, best_col)) best = key, best_col = col;
    }
  }
  let_next_kernel_start();
  keys[t] = best;
  cols[t] = best_col;
  __syncthreads();
  reduce_candidates(keys, cols, t, kThreads);
  if (t == 0) span_keys[row * spans + span] = keys[0], span_cols[row * spans + span] = cols[0];
}

// One block of kMergeThreads per row: the best of its spans' candidates.
constexpr int kMergeThreads = 32;

__global__ void sample_merge_kernel(int32_t* __restrict__ out,
                                    const float* __restrict__ span_keys,
                                    const int32_t* __restrict__ span_cols, int64_t spans) {
  __shared__ float keys[kMergeThreads];
  __shared__ int cols[kMergeThreads];
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x;
  wait_for_previous_kernel();  // the candidates
  float best = -INFINITY;
  int best_col = INT_MAX;
  for (int64_t s = t; s < spans; s += kMergeThreads)
    if (ahead(span_keys[row * spans + s], span_cols[row * spans + s], best, best_col))
      best = span_keys[row * spans + s], best_col = span_cols[row * spans + s];
  let_next_kernel_start();
  keys[t] = best;
  cols[t] = best_col;
  __syncthreads();
  reduce_candidates(keys, cols, t, kMergeThreads);
  if (t == 0) out[row] = cols[0];
}

// dtype: 0 float32, 1 bfloat16. scratch: room for two int32 per (row, span of kSpan columns).
// Returns a CUDA error code (0: none; cudaErrorInvalidValue when the scratch is too small).
extern "C" int minisgl_sample(int32_t* out, int32_t* scratch, int64_t scratch_size,
                              const void* logits, int64_t row_stride, int64_t rows, int64_t vocab,
                              const float* temperatures, uint64_t seed, uint64_t draw,
                              int dtype, void* stream) {
  if (rows == 0) return 0;
  const int64_t spans = (vocab + kSpan - 1) / kSpan;
  // at most 65,535 spans: the grid's second dimension
  if (spans > 65535 || scratch_size < 2 * rows * spans) return 1;  // cudaErrorInvalidValue
  float* span_keys = reinterpret_cast<float*>(scratch);
  int32_t* span_cols = scratch + rows * spans;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(spans));
  if (dtype == 0)
    LAUNCH(sample_span_kernel<float>, grid, dim3(kThreads), stream, span_keys, span_cols,
           static_cast<const float*>(logits), row_stride, vocab, temperatures, seed, draw);
  else
    LAUNCH(sample_span_kernel<bf16>, grid, dim3(kThreads), stream, span_keys, span_cols,
           static_cast<const bf16*>(logits), row_stride, vocab, temperatures, seed, draw);
  LAUNCH(sample_merge_kernel, dim3(static_cast<unsigned>(rows)), dim3(kMergeThreads), stream,
         out, span_keys, span_cols, spans);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
