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
//    its output directly;
//  - how the contexts are cut is decided once a step, on the GPU, by a one-block plan kernel
//    (below): chunks of about the same size, longest request first, so that requests of very
//    different lengths keep every SM reading until the end of the launch.
//
// Keys are found through the page table (page_table[row, i] is the pool slot of token i), so the
// kernel needs no page list from the host, and with the plan made on the GPU a graph replays both
// as captured. The new token (the last one, at `position`) is not in the pool yet: its K and V
// come from the projection, and the block holding it stores them at out_loc, where the next step
// reads them.
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

// The plan: how a step's contexts are cut into chunks (items), one block per item and KV head.
//
// A block's time is its chunk's length, and a launch lasts as long as its busiest SM. Cutting
// every request into the same number of chunks leaves a step with contexts of 100 and 2,000
// tokens waiting for the long ones while most SMs idle: such a launch reads well below the
// bandwidth a launch of uniform contexts reaches. Cutting finer than needed costs too: a
// block spends microseconds starting (a chain of dependent loads before its first key) and
// merging, so for contexts of one length one wave of chunks is faster than two of half
// the size.
//
// So the plan tries chunk sizes S_k = longest context / k, k = 1..kMaxSplits, and takes:
//  - the smallest whose chunks, ceil(len_r / S) a request, fit one wave (items_per_wave, what
//    the SMs hold at once divided by the KV heads): every chunk starts at once and the
//    longest decides. k = 1 when the requests alone fill more than a wave (no split then);
//  - unless that wave would idle more than a quarter of its time (contexts of very different
//    lengths: the tokens per item slot under 3/4 of S): then the smallest that fits two
//    waves, where the GPU starts the second wave's blocks as the first ones end.
// Chunks hold at least min_chunk tokens. The items are laid out longest request first (ties in
// batch order), each request's chunks together: the GPU starts blocks about in the order of
// their index, so the short ones fill the gaps at the end, where a long one would run almost
// alone.
//
// plan[0] is the number of items; item i is plan[kItemsAt + 4 i ...]: request, chunk, the
// request's chunk count, and its first item (its partial results lie item after item). A
// request's first item is the sum of the chunk counts of the requests before it: every thread
// adds that up for its requests over all the others, a tile of lengths and counts at a time in
// shared memory, with no division in that loop (O(n^2 / kPlanThreads) additions).
constexpr int kPlanThreads = 4 * kMaxSplits;  // 4 threads count each candidate size
constexpr int kItemsAt = 4;                   // plan[0] the count, then 16-byte aligned items

template <typename T>
HOST_DEVICE inline T ceil_div(T a, T b) { return (a + b - 1) / b; }

__global__ void __launch_bounds__(kPlanThreads) decode_attention_plan_kernel(
    int32_t* __restrict__ plan, const int64_t* __restrict__ positions, int32_t num_reqs,
    int32_t items_per_wave, int32_t min_chunk) {
  // One block a step: nothing to gain from letting the next kernel start early.
  wait_for_previous_kernel();  // positions: copied in before the step
  const int tid = threadIdx.x;
  // The requests' lengths, a tile at a time: every thread loads one, then reads the others
  // from shared memory (a thread loading its share one after another would wait for each).
  __shared__ int32_t tile_length[kPlanThreads];
  const auto load_tile = [&](int32_t tile0) {
    __syncthreads();  // the previous tile is read
    tile_length[tid] = tile0 + tid < num_reqs ? static_cast<int32_t>(positions[tile0 + tid]) + 1
                                              : 0;
    __syncthreads();
  };
  const auto tile_size = [&](int32_t tile0) {
    return num_reqs - tile0 < kPlanThreads ? num_reqs - tile0 : kPlanThreads;
  };
  const auto chunk_size = [&](int32_t longest, int32_t k) {  // S_k
    const int32_t size = ceil_div(longest, k);
    return size > min_chunk ? size : min_chunk;
  };

  // The context total and the longest one; then the chunks at each candidate size: thread t
  // counts S_k, k = t % kMaxSplits + 1, over every fourth request of each tile.
  __shared__ int64_t part_total[kPlanThreads];
  __shared__ int32_t part_longest[kPlanThreads];
  int64_t total = 0;
  int32_t longest = 0;
  for (int32_t tile0 = 0; tile0 < num_reqs; tile0 += kPlanThreads) {
    load_tile(tile0);
    total += tile_length[tid];
    longest = tile_length[tid] > longest ? tile_length[tid] : longest;
  }
  part_total[tid] = total;
  part_longest[tid] = longest;
  __syncthreads();
  for (int half = kPlanThreads / 2; half > 0; half /= 2) {
    if (tid < half) {
      part_total[tid] += part_total[tid + half];
      if (part_longest[tid + half] > part_longest[tid])
        part_longest[tid] = part_longest[tid + half];
    }
    __syncthreads();
  }
  total = part_total[0];
  longest = part_longest[0];
  __shared__ int32_t partial_items[kPlanThreads], size_items[kMaxSplits];
  const int32_t size_k = chunk_size(longest, tid % kMaxSplits + 1);
  int32_t items = 0;  // at most num_reqs * kMaxSplits
  for (int32_t tile0 = 0; tile0 < num_reqs; tile0 += kPlanThreads) {
    load_tile(tile0);
    for (int32_t j = tid / kMaxSplits; j < tile_size(tile0); j += kPlanThreads / kMaxSplits)
      items += ceil_div(tile_length[j], size_k);
  }
  partial_items[tid] = items;
  __syncthreads();
  if (tid < kMaxSplits)
    size_items[tid] = partial_items[tid] + partial_items[tid + kMaxSplits] +
                      partial_items[tid + 2 * kMaxSplits] + partial_items[tid + 3 * kMaxSplits];
  __syncthreads();
  __shared__ int32_t chosen_size;
  if (tid == 0) {
    int32_t k = 1;  // the finest cut that fits (size_items[k] is for k + 1 chunks; it grows)
    while (k < kMaxSplits && size_items[k] <= items_per_wave) ++k;
    if (4 * total < int64_t{3} * items_per_wave * chunk_size(longest, k))
      while (k < kMaxSplits && size_items[k] <= 2 * items_per_wave) ++k;
    chosen_size = chunk_size(longest, k);
  }
  __syncthreads();
  const int32_t size = chosen_size;

  // Each request's place: after every longer one (and every as long one earlier in the batch).
  __shared__ int32_t tile_chunks[kPlanThreads];
  for (int32_t mine0 = 0; mine0 < num_reqs; mine0 += kPlanThreads) {  // the same for the block
    const int32_t r = mine0 + tid;
    const int32_t length = r < num_reqs ? static_cast<int32_t>(positions[r]) + 1 : 0;
    int32_t before = 0, first = 0;  // requests placed before r, and their chunks
    for (int32_t tile0 = 0; tile0 < num_reqs; tile0 += kPlanThreads) {
      load_tile(tile0);
      tile_chunks[tid] = ceil_div(tile_length[tid], size);
      __syncthreads();
      for (int32_t j = 0; j < tile_size(tile0); ++j) {
        const bool earlier = tile_length[j] > length || (tile_length[j] == length && tile0 + j < r);
        before += earlier;
        first += earlier ? tile_chunks[j] : 0;
      }
    }
    if (r >= num_reqs) continue;
    const int32_t chunks = ceil_div(length, size);
    for (int32_t c = 0; c < chunks; ++c) {
      int32_t* item = plan + kItemsAt + 4 * (first + c);
      item[0] = r;
      item[1] = c;
      item[2] = chunks;
      item[3] = first;
    }
    if (before == num_reqs - 1) plan[0] = first + chunks;  // the last
  }
}

// Block (KV head blockIdx.x, item blockIdx.y of the plan); blocks past the plan's items have
// nothing to do (the grid is sized for the most items a plan can make).
//
// Blocks an SM must hold: 4 for bfloat16 with 1-2 query heads a KV head (Qwen3-0.6B's 2), which
// caps the registers at 128 a thread. Left to itself nvcc 13.0 gives that build 157 since the
// request and its chunk come from the plan (128 when they were block indices), and an SM would
// hold 3 blocks; held to 128 it spills nothing. The others keep what they need without spilling
// (bfloat16 groups 3-4: about 160 and 210, 3 and 2 blocks; float32: more); 0 sets no minimum.
template <typename T, int kGroup>
constexpr int kMinBlocks = sizeof(T) == 2 && kGroup <= 2 ? 4 : 0;

template <typename T, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(kThreads, kMinBlocks<T, kGroup>) decode_attention_kernel(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_new,
    const T* __restrict__ v_new, int64_t q_stride, int64_t kv_stride, T* __restrict__ k_cache,
    T* __restrict__ v_cache, const int32_t* __restrict__ page_table, int64_t table_width,
    const int64_t* __restrict__ rows, const int64_t* __restrict__ positions,
    const int64_t* __restrict__ out_loc, const int32_t* __restrict__ plan, int64_t q_heads,
    int64_t kv_heads, float scale, float* __restrict__ partial_out, float* __restrict__ partial_max,
    float* __restrict__ partial_sum, int32_t* __restrict__ finished) {
  constexpr int kLanes = kHeadDim / kPer;     // threads per token
  constexpr int kSlots = kThreads / kLanes;   // tokens the block holds at once
  constexpr int kPass = kSlots * kTile;       // tokens per pass
  const int tid = threadIdx.x, lane = tid % kLanes, slot = tid / kLanes;
  const int64_t kv_head = blockIdx.x, item_index = blockIdx.y;

  // Before the wait: only what was written before this step's layers (see the top of the
  // file; the plan kernel ran before the first of them).
  if (item_index >= plan[0]) return;
  const int32_t* item = plan + kItemsAt + 4 * item_index;
  const int64_t req = item[0], chunk = item[1], chunks = item[2], first_item = item[3];
  const int64_t position = positions[req], length = position + 1;
  const int64_t per_chunk = ceil_div(length, chunks);  // no chunk is empty: see the plan
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
    const int64_t mine = item_index * q_heads + kv_head * kGroup + g;
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
    const int64_t s = wlane + c * kWarpSize;
    const int64_t partial = (first_item + s) * q_heads + kv_head * kGroup + warp;
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
    // Chunk s of this head: partial (first_item + s) * q_heads + head, q_heads apart.
    const float* column = partial_out + (first_item * q_heads + kv_head * kGroup + g) * kHeadDim
                          + d;
    float merged = 0.0f;
    for (int64_t first = 0; first < chunks; first += kBatch) {  // chunk_weight is 0 past chunks
      float part[kBatch];
      for (int u = 0; u < kBatch; ++u)
        part[u] = first + u < chunks ? __ldcg(column + (first + u) * q_heads * kHeadDim) : 0.0f;
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
                                    const int32_t* plan, int64_t max_items, int64_t q_heads,
                                    int64_t kv_heads, int64_t head_dim, float scale,
                                    float* scratch, int32_t* finished, void* stream) {
  const int64_t partials = max_items * q_heads;
  float *partial_out = scratch, *partial_max = scratch + partials * head_dim,
        *partial_sum = partial_max + partials;
  const auto kernel = build_for<T>(head_dim, q_heads / kv_heads);
  LAUNCH(kernel, dim3(kv_heads, max_items), dim3(kThreads), stream, static_cast<T*>(out),
         static_cast<const T*>(q), static_cast<const T*>(k_new), static_cast<const T*>(v_new),
         q_stride, kv_stride, static_cast<T*>(k_cache), static_cast<T*>(v_cache), page_table,
         table_width, rows, positions, out_loc, plan, q_heads, kv_heads, scale, partial_out,
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

// The plan of a step (see the plan kernel): plan holds kItemsAt + 4 * (the most items it can
// make) int32; positions, num_reqs of them, below 2^31 - 1; num_reqs, items_per_wave and
// min_chunk at least 1 and below 2^31 / kMaxSplits (the counts are int32). The most items: two
// waves' worth, or one a request where there are more requests. Returns a CUDA error code
// (0: none); -1 for arguments out of range.
extern "C" int minisgl_decode_attention_plan(int32_t* plan, const int64_t* positions,
                                             int64_t num_reqs, int64_t items_per_wave,
                                             int64_t min_chunk, void* stream) {
  constexpr int64_t kLimit = (int64_t{1} << 31) / kMaxSplits;  // counts stay in int32
  if (num_reqs < 1 || items_per_wave < 1 || min_chunk < 1 || num_reqs >= kLimit ||
      items_per_wave >= kLimit || min_chunk >= kLimit)
    return -1;
  LAUNCH(decode_attention_plan_kernel, dim3(1), dim3(kPlanThreads), stream, plan, positions,
         static_cast<int32_t>(num_reqs), static_cast<int32_t>(items_per_wave),
         static_cast<int32_t>(min_chunk));
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}

// out [reqs, q_heads, head_dim]; q rows q_stride elements apart, k_new / v_new rows kv_stride
// apart (views into the fused qkv projection); caches [slots, kv_heads, head_dim]; every head
// vector 16-byte aligned; plan, this step's (made from these positions), with at most
// max_items items; scratch holds max_items * q_heads * (head_dim + 2) floats; finished,
// reqs * kv_heads counters, all zero (each launch leaves them so). dtype: 0 float32,
// 1 bfloat16. Returns a CUDA error code (0: none); -1 for a head size the kernel is not compiled
// for (32, 64, 128, 256) or more than kMaxGroup query heads per KV head.
extern "C" int minisgl_decode_attention(
    void* out, const void* q, const void* k_new, const void* v_new, int64_t q_stride,
    int64_t kv_stride, void* k_cache, void* v_cache, const int32_t* page_table,
    int64_t table_width, const int64_t* rows, const int64_t* positions, const int64_t* out_loc,
    const int32_t* plan, int64_t max_items, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
    float scale, float* scratch, int32_t* finished, int dtype, void* stream) {
  if (!supported(q_heads, kv_heads, head_dim)) return -1;
  if (max_items < 1) return -1;
  if (dtype == 0)
    launch_decode_attention<float>(out, q, k_new, v_new, q_stride, kv_stride, k_cache, v_cache,
                                   page_table, table_width, rows, positions, out_loc, plan,
                                   max_items, q_heads, kv_heads, head_dim, scale, scratch,
                                   finished, stream);
  else
    launch_decode_attention<bf16>(out, q, k_new, v_new, q_stride, kv_stride, k_cache, v_cache,
                                  page_table, table_width, rows, positions, out_loc, plan,
                                  max_items, q_heads, kv_heads, head_dim, scale, scratch,
                                  finished, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
