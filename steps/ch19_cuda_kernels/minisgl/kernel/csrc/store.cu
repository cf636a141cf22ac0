// KV store: write each new token's K and V rows into the paged pool at its slot,
// k_cache[out_loc[t]] = k[t] and v_cache[out_loc[t]] = v[t], in one launch for both.
#include "cuda_model.h"

// One block (a warp, 32 threads) per token; the threads stride over the row in Unit-sized
// pieces (16 bytes when everything is 16-byte aligned: one vector load and store each).
template <typename Unit>
__global__ void store_kv_kernel(Unit* __restrict__ k_cache, Unit* __restrict__ v_cache,
                                const int64_t* __restrict__ out_loc,
                                const Unit* __restrict__ k, const Unit* __restrict__ v,
                                int64_t row_units, int64_t k_stride, int64_t v_stride) {
  const int64_t token = blockIdx.x;
  wait_for_previous_kernel();  // k and v: the projection's output
  const int64_t slot = out_loc[token];
  for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) {
    k_cache[slot * row_units + i] = k[token * k_stride + i];
    v_cache[slot * row_units + i] = v[token * v_stride + i];
  }
  let_next_kernel_start();
}

template <typename Unit>
static void launch_store(void* k_cache, void* v_cache, const int64_t* out_loc, const void* k,
                         const void* v, int64_t num_tokens, int64_t row_bytes,
                         int64_t k_stride_bytes, int64_t v_stride_bytes, void* stream) {
  const int64_t unit = sizeof(Unit);
  LAUNCH(store_kv_kernel<Unit>, dim3(num_tokens), dim3(32), stream,
         static_cast<Unit*>(k_cache), static_cast<Unit*>(v_cache), out_loc,
         static_cast<const Unit*>(k), static_cast<const Unit*>(v), row_bytes / unit,
         k_stride_bytes / unit, v_stride_bytes / unit);
}

// The widest piece every row start and row length is a multiple of.
static int64_t alignment(int64_t value) {
  return value % 16 == 0 ? 16 : value % 4 == 0 ? 4 : value % 2 == 0 ? 2 : 1;
}

extern "C" int minisgl_store_kv(void* k_cache, void* v_cache, const int64_t* out_loc,
                                const void* k, const void* v, int64_t num_tokens,
                                int64_t row_bytes, int64_t k_stride_bytes,
                                int64_t v_stride_bytes, void* stream) {
  if (num_tokens == 0) return 0;  // a grid of zero blocks is an error on the GPU
  int64_t align = alignment(row_bytes);
  for (int64_t value : {k_stride_bytes, v_stride_bytes, reinterpret_cast<int64_t>(k_cache),
                        reinterpret_cast<int64_t>(v_cache), reinterpret_cast<int64_t>(k),
                        reinterpret_cast<int64_t>(v)})
    align = alignment(value) < align ? alignment(value) : align;
  if (align == 16)
    launch_store<uint4>(k_cache, v_cache, out_loc, k, v, num_tokens, row_bytes, k_stride_bytes,
                        v_stride_bytes, stream);
  else if (align == 4)
    launch_store<uint32_t>(k_cache, v_cache, out_loc, k, v, num_tokens, row_bytes,
                           k_stride_bytes, v_stride_bytes, stream);
  else if (align == 2)
    launch_store<uint16_t>(k_cache, v_cache, out_loc, k, v, num_tokens, row_bytes,
                           k_stride_bytes, v_stride_bytes, stream);
  else
    launch_store<uint8_t>(k_cache, v_cache, out_loc, k, v, num_tokens, row_bytes,
                          k_stride_bytes, v_stride_bytes, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
