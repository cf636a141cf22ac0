// Masked gather, the embedding lookup: out[t] = weights[ids[t] - start] when the id falls in
// this rank's rows [start, start + length) of the vocabulary, else a row of zeros. With tensor
// parallelism each rank holds a slice; summing the ranks' outputs (all-reduce) gives the full
// embedding. Without it, start = 0 and length = vocab size: every valid id is inside.
#include "cuda_model.h"

template <typename Unit>
__global__ void masked_gather_kernel(Unit* __restrict__ out, const Unit* __restrict__ weights,
                                     const int64_t* __restrict__ ids, int64_t row_units,
                                     int64_t start, int64_t length) {
  const int64_t token = blockIdx.x;
  wait_for_previous_kernel();  // ids may come from the step before
  const int64_t row = ids[token] - start;
  const bool inside = row >= 0 && row < length;
  for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x)
    out[token * row_units + i] = inside ? weights[row * row_units + i] : Unit{};
  let_next_kernel_start();
}

template <typename Unit>
static void launch_gather(void* out, const void* weights, const int64_t* ids, int64_t num_tokens,
                          int64_t row_bytes, int64_t start, int64_t length, void* stream) {
  LAUNCH(masked_gather_kernel<Unit>, dim3(num_tokens), dim3(128), stream,
         static_cast<Unit*>(out), static_cast<const Unit*>(weights), ids,
         row_bytes / static_cast<int64_t>(sizeof(Unit)), start, length);
}

extern "C" int minisgl_masked_gather(void* out, const void* weights, const int64_t* ids,
                                     int64_t num_tokens, int64_t row_bytes, int64_t start,
                                     int64_t length, void* stream) {
  if (num_tokens == 0) return 0;
  const bool wide = row_bytes % 16 == 0 && reinterpret_cast<int64_t>(out) % 16 == 0 &&
                    reinterpret_cast<int64_t>(weights) % 16 == 0;
  if (wide)
    launch_gather<uint4>(out, weights, ids, num_tokens, row_bytes, start, length, stream);
  else
    launch_gather<uint8_t>(out, weights, ids, num_tokens, row_bytes, start, length, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
