// Decode attention for a few requests, with the new token's K/V store folded in: one launch per
// layer where FlashInfer's decode under a CUDA graph takes three (store, split attention, merge).
//
// A decode token attends to the whole context of its request, and at batch 1 that is too little
// work to fill the GPU unless each request's context is cut into `splits` chunks, one warp each:
// the grid is (splits, q_heads, requests). Every warp writes its chunk's partial result (running
// max, sum of exponentials, unnormalised output) to a scratch buffer; the last warp of a (request,
// head) to finish -- a counter says which -- merges the partials and writes the output, so no
// second kernel is needed.
//
// Keys are found through the page table (page_table[row, i] is the pool slot of token i), so the
// kernel needs no per-batch plan: rows and positions are all it reads of the batch, and a graph
// replays it as captured. The new token (the last one, at `position`) is not in the pool yet: its
// K and V come from the projection, and the warp holding it for the first query head of each KV
// head stores them at out_loc, where the next step will read them.
#include <cmath>

#include "cuda_model.h"

constexpr int kLanes = 32;  // a warp, and a block
constexpr int kTile = 8;    // tokens a warp loads before it computes: their latencies overlap
constexpr int kMaxSplits = 2 * kLanes;  // the merge gives each lane two chunks' weights

// One warp: request blockIdx.z, query head blockIdx.y, chunk blockIdx.x. Lane l holds elements
// [l * kPer, (l + 1) * kPer) of each head vector (head_dim = 32 * kPer).
template <typename T, int kPer>
__global__ void decode_attention_kernel(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_new,
    const T* __restrict__ v_new, int64_t q_stride, int64_t kv_stride, T* __restrict__ k_cache,
    T* __restrict__ v_cache, const int32_t* __restrict__ page_table, int64_t table_width,
    const int64_t* __restrict__ rows, const int64_t* __restrict__ positions,
    const int64_t* __restrict__ out_loc, int64_t q_heads, int64_t kv_heads, float scale,
    float* __restrict__ partial_out, float* __restrict__ partial_max,
    float* __restrict__ partial_sum, int32_t* __restrict__ finished) {
  const int lane = threadIdx.x;
  const int64_t chunk = blockIdx.x, head = blockIdx.y, req = blockIdx.z, splits = gridDim.x;
  const int64_t kv_head = head / (q_heads / kv_heads), head_dim = kLanes * kPer;
  const int64_t slot_stride = kv_heads * head_dim;  // elements from one pool slot to the next
  wait_for_previous_kernel();  // q, k_new, v_new: the previous kernels' output
  // Nothing after this point is read by the next kernel before this one ends (it waits for
  // all of it), so it may be scheduled now: its weights load while this runs.
  let_next_kernel_start();

  const int64_t position = positions[req], length = position + 1;
  const int32_t* slots = page_table + rows[req] * table_width;
  const int64_t per_chunk = (length + splits - 1) / splits;
  const int64_t begin = chunk * per_chunk, end = begin + per_chunk < length ? begin + per_chunk
                                                                              : length;
  float query[kPer], output[kPer], new_k[kPer], new_v[kPer];
  for (int i = 0; i < kPer; ++i) {
    query[i] = to_float(q[req * q_stride + head * head_dim + lane * kPer + i]);
    new_k[i] = to_float(k_new[req * kv_stride + kv_head * head_dim + lane * kPer + i]);
    new_v[i] = to_float(v_new[req * kv_stride + kv_head * head_dim + lane * kPer + i]);
    output[i] = 0.0f;
  }

  // Online softmax over the chunk, kTile tokens at a time: running max m, sum of exp(s - m),
  // and the output weighted the same way.
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t first = begin; first < end; first += kTile) {
    float keys[kTile][kPer], values[kTile][kPer], score[kTile];
    for (int j = 0; j < kTile; ++j) {
      const int64_t token = first + j;
      const bool cached = token < position && token < end;
      const int64_t at = cached ? slots[token] * slot_stride + kv_head * head_dim + lane * kPer
                                : 0;
      for (int i = 0; i < kPer; ++i) {
        keys[j][i] = cached ? to_float(k_cache[at + i]) : new_k[i];
        values[j][i] = cached ? to_float(v_cache[at + i]) : new_v[i];
      }
    }
    float tile_max = -INFINITY;
    for (int j = 0; j < kTile; ++j) {
      float dot = 0.0f;
      for (int i = 0; i < kPer; ++i) dot += query[i] * keys[j][i];
      for (int offset = kLanes / 2; offset > 0; offset /= 2)  // the warp's sum, in every lane
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      score[j] = first + j < end ? dot * scale : -INFINITY;
      tile_max = fmaxf(tile_max, score[j]);
    }
    // The first tile has a token, so from then on the running max is finite.
    const float new_max = fmaxf(running_max, tile_max), rescale = expf(running_max - new_max);
    running_sum *= rescale;
    for (int i = 0; i < kPer; ++i) output[i] *= rescale;
    for (int j = 0; j < kTile; ++j) {
      const float weight = expf(score[j] - new_max);  // 0 past the chunk's end
      running_sum += weight;
      for (int i = 0; i < kPer; ++i) output[i] += weight * values[j][i];
    }
    running_max = new_max;
  }

  // Stored last: no warp of this launch reads the new token from the pool (each takes it from
  // k_new / v_new), so the store is for the next step only.
  if (begin <= position && position < end && head % (q_heads / kv_heads) == 0) {
    const int64_t at = out_loc[req] * slot_stride + kv_head * head_dim + lane * kPer;
    for (int i = 0; i < kPer; ++i) {
      k_cache[at + i] = from_float<T>(new_k[i]);
      v_cache[at + i] = from_float<T>(new_v[i]);
    }
  }

  const int64_t mine = (req * q_heads + head) * splits + chunk;
  for (int i = 0; i < kPer; ++i) partial_out[mine * head_dim + lane * kPer + i] = output[i];
  if (lane == 0) {
    partial_max[mine] = running_max;  // -inf for an empty chunk: it weighs 0 below
    partial_sum[mine] = running_sum;
  }

  // The last warp of this (request, head) merges. Each lane makes its writes visible to the
  // whole GPU before lane 0 counts the warp as finished.
  __shared__ int32_t arrived;
  __threadfence();
  __syncthreads();
  if (lane == 0) arrived = atomicAdd(&finished[req * q_heads + head], 1);
  __syncthreads();
  if (arrived != splits - 1) return;
  __threadfence();  // the other warps' partials, read after their counts

  // Chunk s weighs exp(m_s - max of all m). Lane l takes chunks l and l + 32: the maxima and
  // the sums are read at once and added across the warp, instead of one chunk after another.
  const int64_t first_partial = (req * q_heads + head) * splits;
  float chunk_max[2], chunk_sum[2], overall_max = -INFINITY, total = 0.0f;
  for (int c = 0; c < 2; ++c) {
    const int64_t s = lane + c * kLanes;
    chunk_max[c] = s < splits ? partial_max[first_partial + s] : -INFINITY;
    chunk_sum[c] = s < splits ? partial_sum[first_partial + s] : 0.0f;
    overall_max = fmaxf(overall_max, chunk_max[c]);
  }
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    overall_max = fmaxf(overall_max, __shfl_xor_sync(0xffffffffu, overall_max, offset));
  __shared__ float chunk_weight[kMaxSplits];
  for (int c = 0; c < 2; ++c) {
    chunk_weight[lane + c * kLanes] = expf(chunk_max[c] - overall_max);  // 0 if empty
    total += chunk_weight[lane + c * kLanes] * chunk_sum[c];
  }
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    total += __shfl_xor_sync(0xffffffffu, total, offset);
  __syncthreads();  // every lane's weights written
  float merged[kPer] = {};
  for (int64_t s = 0; s < splits; ++s)
    for (int i = 0; i < kPer; ++i)
      merged[i] += chunk_weight[s] * partial_out[(first_partial + s) * head_dim + lane * kPer + i];
  for (int i = 0; i < kPer; ++i)
    out[(req * q_heads + head) * head_dim + lane * kPer + i] = from_float<T>(merged[i] / total);
  if (lane == 0) finished[req * q_heads + head] = 0;  // ready for the next launch
}

template <typename T>
static void launch_decode_attention(void* out, const void* q, const void* k_new,
                                    const void* v_new, int64_t q_stride, int64_t kv_stride,
                                    void* k_cache, void* v_cache, const int32_t* page_table,
                                    int64_t table_width, const int64_t* rows,
                                    const int64_t* positions, const int64_t* out_loc,
                                    int64_t num_reqs, int64_t q_heads, int64_t kv_heads,
                                    int64_t head_dim, int64_t splits, float scale, float* scratch,
                                    int32_t* finished, void* stream) {
  const int64_t partials = num_reqs * q_heads * splits;
  float *partial_out = scratch, *partial_max = scratch + partials * head_dim,
        *partial_sum = partial_max + partials;
  auto kernel = head_dim == 32    ? decode_attention_kernel<T, 1>
                : head_dim == 64  ? decode_attention_kernel<T, 2>
                : head_dim == 128 ? decode_attention_kernel<T, 4>
                                  : decode_attention_kernel<T, 8>;
  LAUNCH(kernel, dim3(splits, q_heads, num_reqs), dim3(kLanes), stream, static_cast<T*>(out),
         static_cast<const T*>(q), static_cast<const T*>(k_new), static_cast<const T*>(v_new),
         q_stride, kv_stride, static_cast<T*>(k_cache), static_cast<T*>(v_cache), page_table,
         table_width, rows, positions, out_loc, q_heads, kv_heads, scale, partial_out,
         partial_max, partial_sum, finished);
}

// out [reqs, q_heads, head_dim]; q rows q_stride elements apart, k_new / v_new rows kv_stride
// apart (views into the fused qkv projection); caches [slots, kv_heads, head_dim]; scratch holds
// reqs * q_heads * splits * (head_dim + 2) floats; finished, reqs * q_heads counters, all zero
// (each launch leaves them so). dtype: 0 float32, 1 bfloat16. Returns a CUDA error code (0:
// none); -1 for a head size the kernel is not compiled for (32, 64, 128, 256) or more than
// kMaxSplits chunks.
extern "C" int minisgl_decode_attention(
    void* out, const void* q, const void* k_new, const void* v_new, int64_t q_stride,
    int64_t kv_stride, void* k_cache, void* v_cache, const int32_t* page_table,
    int64_t table_width, const int64_t* rows, const int64_t* positions, const int64_t* out_loc,
    int64_t num_reqs, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t splits,
    float scale, float* scratch, int32_t* finished, int dtype, void* stream) {
  if (head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != 256) return -1;
  if (splits < 1 || splits > kMaxSplits) return -1;
  if (num_reqs == 0) return 0;
  if (dtype == 0)
    launch_decode_attention<float>(out, q, k_new, v_new, q_stride, kv_stride, k_cache, v_cache,
                                   page_table, table_width, rows, positions, out_loc, num_reqs,
                                   q_heads, kv_heads, head_dim, splits, scale, scratch, finished,
                                   stream);
  else
    launch_decode_attention<bf16>(out, q, k_new, v_new, q_stride, kv_stride, k_cache, v_cache,
                                  page_table, table_width, rows, positions, out_loc, num_reqs,
                                  q_heads, kv_heads, head_dim, splits, scale, scratch, finished,
                                  stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
