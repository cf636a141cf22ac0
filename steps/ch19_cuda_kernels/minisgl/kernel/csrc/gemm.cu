// y = x @ w.T for the rows of a decode step too many for the GEMV (5 to 256 rows of bfloat16).
// cuBLAS takes 5-8 us for each of Qwen3-0.6B's projections at these sizes, where reading the
// weight takes 1-3 (book/runs/ch21_gemm_shapes_s18): its tiles cover all of k in one block, so
// a projection of 1,024 output columns is a few dozen blocks that each walk 2,048 or 3,072
// elements of k one after another while most SMs idle, and it cannot start before the kernel
// ahead of it has finished. This kernel cuts k too (split-K) until the blocks fill the GPU,
// loads its first weights before the kernel that writes x has finished (PDL, cuda_model.h),
// and multiplies on the tensor cores (mma_m16n8k16, cuda_model.h).
//
// A block is 4 warps and 128 output columns (32 a warp: four of the mma's 8-column tiles) by
// kRows rows of x (16, 32 or 64; more rows are more blocks), over one split of k. A loop step
// covers 32 of k: each lane loads one 16-byte piece (8 elements) of a weight row and of each
// of its x rows, straight into registers, no shared memory. The mma wants a lane's A and B
// values at k = 2c, 2c + 1, 2c + 8, 2c + 9 (c = lane % 4) of a 16-wide slice; a piece holds 8
// consecutive k instead. But a dot product does not care in which order k is walked, as long
// as x and w walk it the same way: so the piece at k = 8c..8c+7 is handed to the mma as if it
// held those four k of the first slice (elements 0-3) and of the second (elements 4-7), for x
// and w alike. Every product x[m][k] * w[n][k] is still made exactly once.
//
// With one split the block writes y rounded to bfloat16. With several, each block adds its
// split's sums, in float32, into `partial` [splits][rows][n_out]; the last block of a tile to
// finish (a counter in `arrived`, which it puts back to 0 for the next launch) adds the splits
// up in order and writes y: the same sums in the same order on every run.
#include "cuda_model.h"

constexpr int kLanes = 32;
constexpr int kWarps = 4;
constexpr int kWarpCols = 32;                      // four 8-column tiles of the mma
constexpr int kBlockCols = kWarps * kWarpCols;     // output columns of a block
constexpr int kStep = 32;                          // k a loop step covers
constexpr int kPieces = 4;                         // 16-byte pieces of a row in one step
constexpr int kDepth = 2;                          // steps of weights loaded ahead

// One step's pieces as a lane holds them: of each of the warp's 32 weight rows (row lane / 4
// of each 8-row tile), and of each of the block's x rows (lane / 4 and lane / 4 + 8 of each
// 16-row tile).
struct WeightPieces {
  uint4 of[kWarpCols / 8];
};
template <int kRows>
struct RowPieces {
  uint4 of[kRows / 16][2];
};

__device__ inline uint4 load_piece(const bf16* row, int64_t piece, bool valid) {
  return valid ? reinterpret_cast<const uint4*>(row)[piece] : uint4{0, 0, 0, 0};
}

__device__ inline void load_w(WeightPieces& op, const bf16* w, int64_t n_out, int64_t k,
                              int64_t col, int64_t piece) {
#pragma unroll
  for (int t = 0; t < kWarpCols / 8; ++t) {
    const int64_t n = col + 8 * t;
    op.of[t] = load_piece(w + (n < n_out ? n : 0) * k, piece, n < n_out);
  }
}

template <int kRows>
__device__ inline void load_x(RowPieces<kRows>& op, const bf16* x, int64_t rows,
                              int64_t x_stride, int64_t row, int64_t piece) {
#pragma unroll
  for (int t = 0; t < kRows / 16; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = row + 16 * t + 8 * h;
      op.of[t][h] = load_piece(x + (m < rows ? m : 0) * x_stride, piece, m < rows);
    }
}

// acc[t][u] += the step's x rows of tile t times its weight rows of tile u. Slice s of the
// piece is its words 2s (k = 8c + 4s, +1) and 2s + 1 (k = 8c + 4s + 2, +3).
template <int kRows>
__device__ inline void multiply(float (&acc)[kRows / 16][kWarpCols / 8][4],
                                const RowPieces<kRows>& xs, const WeightPieces& ws) {
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int t = 0; t < kRows / 16; ++t) {
      const uint4 &lo = xs.of[t][0], &hi = xs.of[t][1];
      const uint32_t a[4] = {s ? lo.z : lo.x, s ? hi.z : hi.x, s ? lo.w : lo.y, s ? hi.w : hi.y};
#pragma unroll
      for (int u = 0; u < kWarpCols / 8; ++u) {
        const uint4& p = ws.of[u];
        const uint32_t b[2] = {s ? p.z : p.x, s ? p.w : p.y};
        mma_m16n8k16(acc[t][u], a, b);
      }
    }
}

template <int kRows>
__global__ void __launch_bounds__(kLanes * kWarps)
gemm_kernel(bf16* __restrict__ y, float* __restrict__ partial, int32_t* __restrict__ arrived,
            const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t rows,
            int64_t n_out, int64_t k, int64_t x_stride, int64_t y_stride,
            int64_t steps_per_split) {
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const int g = lane / 4, c = lane % 4;  // the mma's row (column) group and k pair of a lane
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kBlockCols;
  const int64_t col = col0 + warp * kWarpCols + g;  // this lane's weight row in tile 0
  const int64_t first = blockIdx.z * steps_per_split;
  const int64_t steps = k / kStep < first + steps_per_split ? k / kStep - first : steps_per_split;

  // The weights of the first kDepth steps: loaded before x's kernel has finished (PDL).
  WeightPieces ahead[kDepth];
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
    if (d < steps) load_w(ahead[d], w, n_out, k, col, (first + d) * kPieces + c);
  wait_for_previous_kernel();

  float acc[kRows / 16][kWarpCols / 8][4] = {};
  for (int64_t i = 0; i < steps; i += kDepth)
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {  // unrolled: ahead[d] stays in registers
      if (i + d >= steps) break;
      const WeightPieces now = ahead[d];
      if (i + d + kDepth < steps)  // refill the slot while this step multiplies
        load_w(ahead[d], w, n_out, k, col, (first + i + d + kDepth) * kPieces + c);
      RowPieces<kRows> xs;  // x is small and read by every block: from the cache
      load_x(xs, x, rows, x_stride, row0 + g, (first + i + d) * kPieces + c);
      multiply<kRows>(acc, xs, now);
    }
  let_next_kernel_start();

  // A lane's sums: rows g and g + 8 of each row tile, columns 2c and 2c + 1 of each 8-column
  // tile (the mma's layout).
  const bool split = gridDim.z > 1;
#pragma unroll
  for (int t = 0; t < kRows / 16; ++t)
#pragma unroll
    for (int u = 0; u < kWarpCols / 8; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = row0 + 16 * t + 8 * h + g;
        const int64_t n = col0 + warp * kWarpCols + 8 * u + 2 * c;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (m >= rows || n + e >= n_out) continue;
          const float value = acc[t][u][2 * h + e];
          if (split)
            partial[(blockIdx.z * rows + m) * n_out + n + e] = value;
          else
            y[m * y_stride + n + e] = from_float<bf16>(value);
        }
      }
  if (!split) return;

  __shared__ int32_t last;
  __threadfence();  // this block's sums are visible to every block before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t& counter = arrived[blockIdx.y * gridDim.x + blockIdx.x];
    last = atomicAdd(&counter, 1) == static_cast<int32_t>(gridDim.z) - 1;
    if (last) counter = 0;  // every split has arrived: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = threadIdx.x; e < kRows * kBlockCols; e += kLanes * kWarps) {
    const int64_t m = row0 + e / kBlockCols, n = col0 + e % kBlockCols;
    if (m >= rows || n >= n_out) continue;
    float sum = 0.0f;
    for (unsigned s = 0; s < gridDim.z; ++s)  // in split order, on every run
      sum += __ldcg(partial + (s * rows + m) * n_out + n);  // written by other SMs: not L1
    y[m * y_stride + n] = from_float<bf16>(sum);
  }
}

// y [rows, n_out] = x [rows, k] @ w [n_out, k].T in `splits` splits of k (1 to 64), with
// `partial` room for splits * rows * n_out floats and `arrived` one zeroed int32 per tile
// (ceil(rows / row tile) * ceil(n_out / 128)) when splits > 1. k a multiple of 32, rows of x
// 16-byte aligned (the Python wrapper checks). Returns a CUDA error code (0: none); -1 for
// sizes the kernel does not take.
extern "C" int minisgl_gemm(void* y, float* partial, int32_t* arrived, const void* x,
                            const void* w, int64_t rows, int64_t n_out, int64_t k,
                            int64_t x_stride, int64_t y_stride, int64_t splits, void* stream) {
  if (rows < 0 || rows > 256 || k % kStep != 0 || splits < 1 || splits > 64) return -1;
  if (rows == 0 || n_out == 0) return 0;
  const int64_t steps = k / kStep, per_split = (steps + splits - 1) / splits;
  splits = (steps + per_split - 1) / per_split;  // no split without a step
  const int row_tile = rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
  const dim3 grid((rows + row_tile - 1) / row_tile, (n_out + kBlockCols - 1) / kBlockCols,
                  splits);
  if (grid.y > 65535) return -1;
  auto kernel = row_tile == 16 ? gemm_kernel<16> : row_tile == 32 ? gemm_kernel<32>
                                                                   : gemm_kernel<64>;
  LAUNCH(kernel, grid, dim3(kLanes * kWarps), stream, static_cast<bf16*>(y), partial, arrived,
         static_cast<const bf16*>(x), static_cast<const bf16*>(w), rows, n_out, k, x_stride,
         y_stride, per_split);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
