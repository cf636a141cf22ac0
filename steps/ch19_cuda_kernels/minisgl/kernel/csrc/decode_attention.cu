// Decode attention with the new token's K/V store folded in: one launch per layer where
// FlashInfer's decode under a CUDA graph takes three (store, split attention, merge).
//
// At batch 1 a layer reads about 1 MB of keys and values: a few microseconds of memory time,
// which the launch, the wait for the previous kernel and one round trip to memory can easily
// double. So the kernel is built around latency (and at large batches it reads as fast as
// FlashInfer's: the loop does little besides the loads and the math, see the new token below):
//  - a block of 128 threads takes one KV head of one request and one chunk of its context, and
//    serves all the query heads of that KV head (GQA): each key is read once, not once per head;
//  - a thread holds 8 values of a token's head vector (one 16-byte load of bfloat16), so 16
//    threads share a head of 128 (8 a head of 64): a warp works on 2-4 tokens at once and a
//    dot product needs 4 or 3 shuffle steps; each thread keeps kTile tokens' loads in flight,
//    and the next tile's loads are issued before this tile's arithmetic (their pool slots were
//    read a tile earlier still, so no load waits for another);
//  - the first tile is loaded *before* waiting for the previous kernel (PDL, cuda_model.h):
//    cached keys, page table, rows and positions were all written before this step began, by no
//    kernel of it, so most of the memory time overlaps the q/k norm + RoPE kernel before us;
//  - the chunks' partial results are merged by the last block of each (request, KV head) to
//    finish (a counter says which), not by a second kernel; a context that fits one chunk writes
//    its output directly.
//
// Keys are found through the page table (page_table[row, i] is the pool slot of token i), so the
// kernel needs no per-batch plan and a graph replays it as captured. The new token (the last one,
// at `position`) is not in the pool yet: its K and V come from the projection, and the block
// holding it stores them at out_loc, where the next step reads them.
#include <cmath>

#include "cuda_model.h"

constexpr int kThreads = 128;   // a block
constexpr int kWarpSize = 32;
constexpr int kPer = 8;         // elements of a head vector a thread holds: 16 bytes of bfloat16
constexpr int kTile = 4;        // tokens a thread loads before it computes
constexpr int kMaxGroup = kThreads / kWarpSize;  // query heads per KV head (the merge: a warp each)
constexpr int kMaxSplits = 2 * kWarpSize;        // the merge gives each lane two chunks
constexpr float kLog2e = 1.4426950408889634f;    // softmax in base 2: exp2f is one instruction

// kPer elements of a head vector as they lie in memory: one 16-byte word of bfloat16, two of
// float32.
template <typename T> struct Piece { uint4 words[kPer * sizeof(T) / 16]; };

template <typename T> HOST_DEVICE inline Piece<T> load_piece(const T* at) {
  Piece<T> piece;
  for (int w = 0; w < static_cast<int>(sizeof(piece.words) / 16); ++w)
    piece.words[w] = reinterpret_cast<const uint4*>(at)[w];
  return piece;
}
template <typename T> HOST_DEVICE inline void store_piece(T* at, const Piece<T>& piece) {
  for (int w = 0; w < static_cast<int>(sizeof(piece.words) / 16); ++w)
    reinterpret_cast<uint4*>(at)[w] = piece.words[w];
}
HOST_DEVICE inline void to_floats(const Piece<bf16>& piece, float* out) {
  unpack(piece.words[0], out);
}
HOST_DEVICE inline void to_floats(const Piece<float>& piece, float* out) {
  for (int w = 0; w < 2; ++w) {
    const uint32_t words[4] = {piece.words[w].x, piece.words[w].y, piece.words[w].z,
                               piece.words[w].w};
    for (int j = 0; j < 4; ++j) {
      union { uint32_t u; float f; } v{words[j]};
      out[4 * w + j] = v.f;
    }
  }
}

// Where one thread's tokens lie: pass p of a chunk covers kSlots * kTile tokens, and the thread
// in token slot `slot` holds tokens first + j * kSlots + slot, j < kTile.
struct Tokens {
  const int32_t* slots;  // the request's page-table row
  int64_t cached_end;    // tokens below this are read from the pool (the new one is not)
  int64_t offset;        // this thread's piece of a pool slot: KV head and lane
  int64_t slot_stride;   // elements from one pool slot to the next
};

// The pool slots of a tile's tokens for this thread, -1 past the cached ones. Read a tile ahead
// of the keys: a key's address depends on its slot, and a load that waits for another load
// would leave the thread with one round trip to memory in flight instead of 2 * kTile loads.
template <int kSlots>
HOST_DEVICE inline void load_slots(int32_t* slots, const Tokens& at, int64_t first, int slot) {
  for (int j = 0; j < kTile; ++j) {
    const int64_t token = first + j * kSlots + slot;
    slots[j] = token < at.cached_end ? at.slots[token] : -1;
  }
}

template <typename T>
HOST_DEVICE inline void load_tile(Piece<T>* keys, Piece<T>* values, const T* k_cache,
                                  const T* v_cache, const Tokens& at, const int32_t* slots) {
  for (int j = 0; j < kTile; ++j) {
    if (slots[j] >= 0) {
      const int64_t where = slots[j] * at.slot_stride + at.offset;
      keys[j] = load_piece(k_cache + where);
      values[j] = load_piece(v_cache + where);
    } else {
      keys[j] = values[j] = Piece<T>{};  // zeros: a token past the chunk weighs 0 times 0
    }
  }
}

// Block (chunk blockIdx.x, KV head blockIdx.y, request order[blockIdx.z], or blockIdx.z without
// an order). Each request's context is cut into chunks of a whole number of passes, at most
// gridDim.x of them; blocks past the last chunk have nothing to do. The GPU starts blocks about
// in the order of their index, so when a launch has more blocks than the SMs hold at once, an
// order that puts the longest requests first leaves short blocks for the end, where a long one
// would run almost alone.
//
// Blocks an SM must hold: 4 for bfloat16 with 1-2 query heads a KV head (Qwen3-0.6B's 2), which
// caps the registers at 128 a thread. Left to itself nvcc 13.0 gives that build 155 since the
// request comes from `order` (128 when it was blockIdx.z): an SM held 3 blocks. The others keep
// what they need without spilling (bfloat16 groups 3-4: about 160 and 210, 3 and 2 blocks;
// float32: more); 0 sets no minimum.
template <typename T, int kGroup>
constexpr int kMinBlocks = sizeof(T) == 2 && kGroup <= 2 ? 4 : 0;

template <typename T, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(kThreads, kMinBlocks<T, kGroup>) decode_attention_kernel(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_new,
    const T* __restrict__ v_new, int64_t q_stride, int64_t kv_stride, T* __restrict__ k_cache,
    T* __restrict__ v_cache, const int32_t* __restrict__ page_table, int64_t table_width,
    const int64_t* __restrict__ rows, const int64_t* __restrict__ positions,
    const int64_t* __restrict__ out_loc, const int64_t* __restrict__ order, int64_t q_heads,
    int64_t kv_heads, float scale, float* __restrict__ partial_out, float* __restrict__ partial_max,
    float* __restrict__ partial_sum, int32_t* __restrict__ finished) {
  constexpr int kLanes = kHeadDim / kPer;     // threads per token
  constexpr int kSlots = kThreads / kLanes;   // tokens the block holds at once
  constexpr int kPass = kSlots * kTile;       // tokens per pass
  const int tid = threadIdx.x, lane = tid % kLanes, slot = tid / kLanes;
  const int64_t chunk = blockIdx.x, kv_head = blockIdx.y, splits = gridDim.x;

  // Before the wait: only what was written before this step (see the top of the file).
  const int64_t req = order != nullptr ? order[blockIdx.z] : blockIdx.z;
  const int64_t position = positions[req], length = position + 1;
  const int64_t wanted = (length + splits - 1) / splits;
  const int64_t per_chunk = (wanted + kPass - 1) / kPass * kPass;
  const int64_t chunks = (length + per_chunk - 1) / per_chunk;
  if (chunk >= chunks) return;
  const int64_t begin = chunk * per_chunk;
  const int64_t end = begin + per_chunk < length ? begin + per_chunk : length;
  const Tokens at{page_table + rows[req] * table_width, end < position ? end : position,
                  kv_head * kHeadDim + lane * kPer, kv_heads * kHeadDim};
  Piece<T> keys[kTile], values[kTile];
  int32_t slots[kTile];  // of the tile after the one whose keys are loading
  load_slots<kSlots>(slots, at, begin, slot);
  load_tile(keys, values, k_cache, v_cache, at, slots);
  load_slots<kSlots>(slots, at, begin + kPass, slot);

  wait_for_previous_kernel();  // q, k_new, v_new: the previous kernels' output
  // Nothing after this point is read by the next kernel before this one ends (it waits for
  // all of it), so it may be scheduled now: its weights load while this runs.
  let_next_kernel_start();

  float query[kGroup][kPer], output[kGroup][kPer], running_max[kGroup], running_sum[kGroup];
  for (int g = 0; g < kGroup; ++g) {
    to_floats(load_piece(q + req * q_stride + (kv_head * kGroup + g) * kHeadDim + lane * kPer),
              query[g]);
    for (int i = 0; i < kPer; ++i) output[g][i] = 0.0f;
    running_max[g] = -INFINITY;
    running_sum[g] = 0.0f;
  }
  const Piece<T> new_key = load_piece(k_new + req * kv_stride + at.offset);
  const Piece<T> new_value = load_piece(v_new + req * kv_stride + at.offset);
  const float scale_log2 = scale * kLog2e;

  // Online softmax over the thread's tokens, a tile at a time: running max m, sum of
  // 2^(s - m), and the output weighted the same way (per query head of the group).
  for (int64_t first = begin; first < end; first += kPass) {
    Piece<T> next_keys[kTile], next_values[kTile];
    if (first + kPass < end) {  // the same for the whole block
      load_tile(next_keys, next_values, k_cache, v_cache, at, slots);
      load_slots<kSlots>(slots, at, first + 2 * kPass, slot);
    }
    float score[kTile][kGroup];
    for (int j = 0; j < kTile; ++j) {
      const int64_t token = first + j * kSlots + slot;
      float key[kPer];
      to_floats(keys[j], key);
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.0f;
        for (int i = 0; i < kPer; ++i) dot += query[g][i] * key[i];
        for (int offset = kLanes / 2; offset > 0; offset /= 2)  // the token's lanes are adjacent
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        // The new token is not in the pool: it is added after the loop.
        score[j][g] = token < at.cached_end ? dot * scale_log2 : -INFINITY;
      }
    }
    for (int g = 0; g < kGroup; ++g) {
      float tile_max = -INFINITY;
      for (int j = 0; j < kTile; ++j) tile_max = fmaxf(tile_max, score[j][g]);
      const float new_max = fmaxf(running_max[g], tile_max);
      if (new_max == -INFINITY) continue;  // no token of this slot yet
      const float rescale = exp2f(running_max[g] - new_max);  // 0 the first time
      running_sum[g] *= rescale;
      for (int i = 0; i < kPer; ++i) output[g][i] *= rescale;
      for (int j = 0; j < kTile; ++j) {
        float value[kPer];
        to_floats(values[j], value);
        const float weight = exp2f(score[j][g] - new_max);
        running_sum[g] += weight;
        for (int i = 0; i < kPer; ++i) output[g][i] += weight * value[i];
      }
      running_max[g] = new_max;
    }
    for (int j = 0; j < kTile; ++j) {
      keys[j] = next_keys[j];
      values[j] = next_values[j];
    }
  }
  // The new token, after the loop: inside it, every token would ask whether it is the new one
  // and pick its K/V from registers, a select per value (48 instructions a pass of 689). In the
  // chunk that holds it every thread computes its dot product (the shuffles need the whole
  // warp), and the token slot it falls to adds it.
  const bool new_here = begin <= position && position < end;  // the same for the whole block
  const bool mine = new_here && (position - begin) % kSlots == slot;
  if (new_here) {
    float key[kPer], value[kPer];
    to_floats(new_key, key);
    to_floats(new_value, value);
    for (int g = 0; g < kGroup; ++g) {
      float dot = 0.0f;
      for (int i = 0; i < kPer; ++i) dot += query[g][i] * key[i];
      for (int offset = kLanes / 2; offset > 0; offset /= 2)
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (!mine) continue;
      const float score = dot * scale_log2, new_max = fmaxf(running_max[g], score);
      const float rescale = exp2f(running_max[g] - new_max), weight = exp2f(score - new_max);
      running_sum[g] = running_sum[g] * rescale + weight;
      for (int i = 0; i < kPer; ++i) output[g][i] = output[g][i] * rescale + weight * value[i];
      running_max[g] = new_max;
    }
  }
  // Stored for the next step only: no block of this launch reads the new token from the pool.
  if (mine) {
    const int64_t where = out_loc[req] * at.slot_stride + at.offset;
    store_piece(k_cache + where, new_key);
    store_piece(v_cache + where, new_value);
  }

  // The block's token slots meet in shared memory: chunk maximum, sum and output per head.
  __shared__ float slot_max[kGroup][kSlots], slot_sum[kGroup][kSlots];
  __shared__ float slot_out[kGroup][kSlots][kHeadDim];
  for (int g = 0; g < kGroup; ++g) {
    if (lane == 0) {
      slot_max[g][slot] = running_max[g];
      slot_sum[g][slot] = running_sum[g];
    }
    for (int i = 0; i < kPer; ++i) slot_out[g][slot][lane * kPer + i] = output[g][i];
  }
  __syncthreads();
  const int64_t head0 = req * q_heads + kv_head * kGroup;  // the group's first query head
  for (int e = tid; e < kGroup * kHeadDim; e += kThreads) {
    const int g = e / kHeadDim, d = e % kHeadDim;
    float chunk_max = -INFINITY, sum = 0.0f, value = 0.0f;
    for (int s = 0; s < kSlots; ++s) chunk_max = fmaxf(chunk_max, slot_max[g][s]);
    for (int s = 0; s < kSlots; ++s) {  // the chunk has a token, so chunk_max is finite
      const float weight = exp2f(slot_max[g][s] - chunk_max);  // 0 for an empty slot
      sum += weight * slot_sum[g][s];
      value += weight * slot_out[g][s][d];
    }
    if (chunks == 1) {  // the whole context: this is the answer
      out[(head0 + g) * kHeadDim + d] = from_float<T>(value / sum);
      continue;
    }
    const int64_t mine = (head0 + g) * splits + chunk;
    partial_out[mine * kHeadDim + d] = value;
    if (d == 0) {
      partial_max[mine] = chunk_max;
      partial_sum[mine] = sum;
    }
  }
  if (chunks == 1) return;

  // The last block of this (request, KV head) merges. Every thread makes its writes visible to
  // the whole GPU before thread 0 counts the block as finished.
  __shared__ int32_t arrived;
  __threadfence();
  __syncthreads();
  if (tid == 0) arrived = atomicAdd(&finished[req * kv_heads + kv_head], 1);
  __syncthreads();
  if (arrived != chunks - 1) return;
  __threadfence();  // the other blocks' partials, read (past L1) after their counts

  // Chunk c of head g weighs 2^(m_c - max of all m): warp g computes them, lane l taking chunks
  // l and l + 32, so the maxima and the sums are read at once and added across the warp. Every
  // warp runs the shuffles (the block's threads meet there); warps past the group compute zeros.
  const int warp = tid / kWarpSize, wlane = tid % kWarpSize;
  __shared__ float chunk_weight[kMaxGroup][kMaxSplits], total[kMaxGroup];
  float maxima[2], sums[2], overall_max = -INFINITY, weighted = 0.0f;
  for (int c = 0; c < 2; ++c) {
    const int64_t s = wlane + c * kWarpSize, partial = (head0 + warp) * splits + s;
    const bool real = warp < kGroup && s < chunks;
    maxima[c] = real ? __ldcg(partial_max + partial) : -INFINITY;
    sums[c] = real ? __ldcg(partial_sum + partial) : 0.0f;
    overall_max = fmaxf(overall_max, maxima[c]);
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    overall_max = fmaxf(overall_max, __shfl_xor_sync(0xffffffffu, overall_max, offset));
  for (int c = 0; c < 2; ++c) {
    const float weight = maxima[c] == -INFINITY ? 0.0f : exp2f(maxima[c] - overall_max);
    chunk_weight[warp][wlane + c * kWarpSize] = weight;
    weighted += weight * sums[c];
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    weighted += __shfl_xor_sync(0xffffffffu, weighted, offset);
  if (wlane == 0) total[warp] = weighted;
  __syncthreads();
  constexpr int kBatch = 8;  // chunks whose partials a thread reads at once: latencies overlap
  for (int e = tid; e < kGroup * kHeadDim; e += kThreads) {
    const int g = e / kHeadDim, d = e % kHeadDim;
    const float* column = partial_out + (head0 + g) * splits * kHeadDim + d;
    float merged = 0.0f;
    for (int64_t first = 0; first < chunks; first += kBatch) {  // chunk_weight is 0 past chunks
      float part[kBatch];
      for (int u = 0; u < kBatch; ++u)
        part[u] = first + u < chunks ? __ldcg(column + (first + u) * kHeadDim) : 0.0f;
      for (int u = 0; u < kBatch; ++u) merged += chunk_weight[g][first + u] * part[u];
    }
    out[(head0 + g) * kHeadDim + d] = from_float<T>(merged / total[g]);
  }
  if (tid == 0) finished[req * kv_heads + kv_head] = 0;  // ready for the next launch
}

// The kernel for `group` query heads per KV head, 1 to kMaxGroup: each its own build, so that a
// thread's queries and outputs are arrays of known size, in registers.
template <typename T, int kHeadDim>
static auto kernel_for(int64_t group) {
  return group == 1   ? decode_attention_kernel<T, kHeadDim, 1>
         : group == 2 ? decode_attention_kernel<T, kHeadDim, 2>
         : group == 3 ? decode_attention_kernel<T, kHeadDim, 3>
                      : decode_attention_kernel<T, kHeadDim, 4>;
}

// The build for a dtype, head size and group (launch_decode_attention's choice).
template <typename T>
static auto build_for(int64_t head_dim, int64_t group) {
  return head_dim == 32    ? kernel_for<T, 32>(group)
         : head_dim == 64  ? kernel_for<T, 64>(group)
         : head_dim == 128 ? kernel_for<T, 128>(group)
                           : kernel_for<T, 256>(group);
}

template <typename T>
static void launch_decode_attention(void* out, const void* q, const void* k_new,
                                    const void* v_new, int64_t q_stride, int64_t kv_stride,
                                    void* k_cache, void* v_cache, const int32_t* page_table,
                                    int64_t table_width, const int64_t* rows,
                                    const int64_t* positions, const int64_t* out_loc,
                                    const int64_t* order, int64_t num_reqs, int64_t q_heads,
                                    int64_t kv_heads, int64_t head_dim, int64_t splits,
                                    float scale, float* scratch, int32_t* finished,
                                    void* stream) {
  const int64_t partials = num_reqs * q_heads * splits;
  float *partial_out = scratch, *partial_max = scratch + partials * head_dim,
        *partial_sum = partial_max + partials;
  const auto kernel = build_for<T>(head_dim, q_heads / kv_heads);
  LAUNCH(kernel, dim3(splits, kv_heads, num_reqs), dim3(kThreads), stream, static_cast<T*>(out),
         static_cast<const T*>(q), static_cast<const T*>(k_new), static_cast<const T*>(v_new),
         q_stride, kv_stride, static_cast<T*>(k_cache), static_cast<T*>(v_cache), page_table,
         table_width, rows, positions, out_loc, order, q_heads, kv_heads, scale, partial_out,
         partial_max, partial_sum, finished);
}

static bool supported(int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256) &&
         kv_heads >= 1 && q_heads % kv_heads == 0 && q_heads / kv_heads <= kMaxGroup;
}

// How many blocks of the build for these heads one SM holds at once (its registers and shared
// memory decide): chunks beyond what all SMs hold together run in a second wave. -1 for heads
// the kernel is not compiled for; 1 in the emulator, which runs one block at a time.
extern "C" int minisgl_decode_attention_blocks_per_sm(int64_t q_heads, int64_t kv_heads,
                                                      int64_t head_dim, int dtype) {
  if (!supported(q_heads, kv_heads, head_dim)) return -1;
#ifdef __CUDACC__
  int blocks = 0;
  const cudaError_t error =
      dtype == 0 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                       &blocks, build_for<float>(head_dim, q_heads / kv_heads), kThreads, 0)
                 : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                       &blocks, build_for<bf16>(head_dim, q_heads / kv_heads), kThreads, 0);
  return error == cudaSuccess ? blocks : -1;
#else
  (void)dtype;
  return 1;
#endif
}

// out [reqs, q_heads, head_dim]; q rows q_stride elements apart, k_new / v_new rows kv_stride
// apart (views into the fused qkv projection); caches [slots, kv_heads, head_dim]; every head
// vector 16-byte aligned; order, a permutation of the requests (the order their blocks start
// in), or null for 0, 1, ...; scratch holds reqs * q_heads * splits * (head_dim + 2) floats;
// finished, reqs * kv_heads counters, all zero (each launch leaves them so). dtype: 0 float32,
// 1 bfloat16. Returns a CUDA error code (0: none); -1 for a head size the kernel is not compiled
// for (32, 64, 128, 256), more than kMaxGroup query heads per KV head or more than kMaxSplits
// chunks.
extern "C" int minisgl_decode_attention(
    void* out, const void* q, const void* k_new, const void* v_new, int64_t q_stride,
    int64_t kv_stride, void* k_cache, void* v_cache, const int32_t* page_table,
    int64_t table_width, const int64_t* rows, const int64_t* positions, const int64_t* out_loc,
    const int64_t* order, int64_t num_reqs, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
    int64_t splits, float scale, float* scratch, int32_t* finished, int dtype, void* stream) {
  if (!supported(q_heads, kv_heads, head_dim)) return -1;
  if (splits < 1 || splits > kMaxSplits) return -1;
  if (num_reqs == 0) return 0;
  if (dtype == 0)
    launch_decode_attention<float>(out, q, k_new, v_new, q_stride, kv_stride, k_cache, v_cache,
                                   page_table, table_width, rows, positions, out_loc, order,
                                   num_reqs, q_heads, kv_heads, head_dim, splits, scale, scratch,
                                   finished, stream);
  else
    launch_decode_attention<bf16>(out, q, k_new, v_new, q_stride, kv_stride, k_cache, v_cache,
                                  page_table, table_width, rows, positions, out_loc, order,
                                  num_reqs, q_heads, kv_heads, head_dim, splits, scale, scratch,
                                  finished, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
