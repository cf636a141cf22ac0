// y = x @ w.T for a few rows of x: the projections of a decode step at batch 1 to 4, where the
// weight is read once per step and each of its elements meets only 1-4 numbers of x. The time
// is the weight's bytes over the memory's speed, so the kernel's one job is to stream w: warps
// read rows of w [n_out, k] in 16-byte pieces, multiply them with every row of x (small, and
// cached), add up in float32 across their lanes with shuffles, and write y[m, n] rounded to
// bfloat16. bfloat16 only: the GPU's serving dtype, where a decode step is bound by reading the
// weights (float32 runs on the CPU go to the reference matmul). x [rows, k] and y [rows, n_out]
// are row-major, rows `x_stride` / `y_stride` elements apart; w is contiguous; k is a multiple
// of 8 and every row starts 16-byte aligned (the Python wrapper checks).
#include <cmath>

#include "cuda_model.h"

constexpr int kLanes = 32;
constexpr int kWarps = 4;  // per block
constexpr int kMaxRows = 4;

// Adds piece i of a weight row, times piece i of every row of x, into acc.
template <int kRows>
HOST_DEVICE inline void accumulate(float* acc, const uint4& piece, const bf16* x,
                                   int64_t x_stride, int64_t i) {
  constexpr int kPer = 8;  // bfloat16 in a 16-byte piece
  float wf[kPer], xf[kPer];
  unpack(piece, wf);
  for (int m = 0; m < kRows; ++m) {
    unpack(reinterpret_cast<const uint4*>(x + m * x_stride)[i], xf);
    for (int j = 0; j < kPer; ++j) acc[m] += wf[j] * xf[j];
  }
}

// kSplit warps share one output column, each taking every kSplit-th run of 32 pieces of its
// row: a long row (o_proj's 2,048, down_proj's 3,072) is read by 4 warps at once instead of
// one, and the few columns of those projections (1,024) still fill the GPU. With kSplit = 1 a
// block holds 4 columns. The warps' partial sums meet in shared memory.
// A lane's first kEarly pieces of the weight are loaded before waiting for the kernel that
// writes x (PDL, cuda_model.h): the weight is never written, so under PDL these loads overlap
// that kernel's end. Qwen3-0.6B's rows are 3 or 4 pieces a lane: all of them.
//
// kGated: the weight is SwiGLU's [gate; up] (2 * n_out rows) and column j of y is
// silu(x . gate_j) * (x . up_j): the warps of column j read both rows, and the activation is
// the epilogue, so gate_up_proj and the activation are one launch and the [rows, 2 * n_out]
// intermediate is never written. Both dot products are rounded to bfloat16 first, where the
// separate matmul rounds them, then combined in float32 as the activation kernel does.
template <int kRows, int kSplit, bool kGated>
__global__ void gemv_kernel(bf16* __restrict__ y, const bf16* __restrict__ x,
                            const bf16* __restrict__ w, int64_t n_out, int64_t k,
                            int64_t x_stride, int64_t y_stride) {
  constexpr int kParts = kGated ? 2 : 1;  // weight rows per output column
  constexpr int kEarly = 4;
  __shared__ float partial[kWarps][kParts][kMaxRows];
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * (kWarps / kSplit) + warp / kSplit;
  const bool has_col = col < n_out;  // no early return: all threads reach shuffles and barrier
  const int64_t pieces = k / 8, first = (warp % kSplit) * kLanes + lane, stride = kSplit * kLanes;
  const uint4* rows[kParts];
  uint4 early[kParts][kEarly];
#pragma unroll  // else nvcc keeps rows[] and early[][] in local memory
  for (int p = 0; p < kParts; ++p) {
    rows[p] = reinterpret_cast<const uint4*>(w + ((has_col ? col : 0) + p * n_out) * k);
    for (int e = 0; e < kEarly; ++e)
      if (has_col && first + e * stride < pieces) early[p][e] = rows[p][first + e * stride];
  }
  wait_for_previous_kernel();
  float acc[kParts][kRows];
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
    for (int m = 0; m < kRows; ++m) acc[p][m] = 0.0f;
    for (int e = 0; e < kEarly; ++e)  // a fixed count: early[][] stays in registers
      if (has_col && first + e * stride < pieces)
        accumulate<kRows>(acc[p], early[p][e], x, x_stride, first + e * stride);
    for (int64_t i = first + kEarly * stride; has_col && i < pieces; i += stride)
      accumulate<kRows>(acc[p], rows[p][i], x, x_stride, i);
  }
  let_next_kernel_start();
  for (int p = 0; p < kParts; ++p)
    for (int m = 0; m < kRows; ++m) {
      for (int offset = kLanes / 2; offset > 0; offset /= 2)
        acc[p][m] += __shfl_xor_sync(0xffffffffu, acc[p][m], offset);
      if (lane == 0) partial[warp][p][m] = acc[p][m];
    }
  __syncthreads();
  if (has_col && lane == 0 && warp % kSplit == 0)
    for (int m = 0; m < kRows; ++m) {
      float sum[kParts];
      for (int p = 0; p < kParts; ++p) {
        sum[p] = 0.0f;
        for (int part = 0; part < kSplit; ++part) sum[p] += partial[warp + part][p][m];
      }
      if (kGated) {
        const float gate = to_float(from_float<bf16>(sum[0]));
        const float up = to_float(from_float<bf16>(sum[kParts - 1]));
        y[m * y_stride + col] = from_float<bf16>(gate / (1.0f + expf(-gate)) * up);
      } else {
        y[m * y_stride + col] = from_float<bf16>(sum[0]);
      }
    }
}

template <int kRows, int kSplit, bool kGated>
static void launch_gemv(void* y, const void* x, const void* w, int64_t n_out, int64_t k,
                        int64_t x_stride, int64_t y_stride, void* stream) {
  constexpr int columns_per_block = kWarps / kSplit;
  auto kernel = gemv_kernel<kRows, kSplit, kGated>;
  LAUNCH(kernel, dim3((n_out + columns_per_block - 1) / columns_per_block),
         dim3(kLanes * kWarps), stream, static_cast<bf16*>(y), static_cast<const bf16*>(x),
         static_cast<const bf16*>(w), n_out, k, x_stride, y_stride);
}

template <int kSplit, bool kGated>
static void launch_rows(int64_t rows, void* y, const void* x, const void* w, int64_t n_out,
                        int64_t k, int64_t x_stride, int64_t y_stride, void* stream) {
  using Launch = void (*)(void*, const void*, const void*, int64_t, int64_t, int64_t, int64_t,
                          void*);
  const Launch by_rows[kMaxRows] = {
      launch_gemv<1, kSplit, kGated>, launch_gemv<2, kSplit, kGated>,
      launch_gemv<3, kSplit, kGated>, launch_gemv<4, kSplit, kGated>};
  by_rows[rows - 1](y, x, w, n_out, k, x_stride, y_stride, stream);
}

// y [rows, n_out]; w [n_out, k], or [2 * n_out, k] when gated (SwiGLU's [gate; up]). Returns
// a CUDA error code (0: none); -1 for more than 4 rows.
extern "C" int minisgl_gemv(void* y, const void* x, const void* w, int64_t rows, int64_t n_out,
                            int64_t k, int64_t x_stride, int64_t y_stride, int gated,
                            void* stream) {
  if (rows < 0 || rows > kMaxRows) return -1;
  if (rows == 0 || n_out == 0) return 0;
  // A row of 2,048 or more elements is 256+ pieces: 2+ per lane even split four ways.
  if (k >= 2048 && gated)
    launch_rows<kWarps, true>(rows, y, x, w, n_out, k, x_stride, y_stride, stream);
  else if (k >= 2048)
    launch_rows<kWarps, false>(rows, y, x, w, n_out, k, x_stride, y_stride, stream);
  else if (gated)
    launch_rows<1, true>(rows, y, x, w, n_out, k, x_stride, y_stride, stream);
  else
    launch_rows<1, false>(rows, y, x, w, n_out, k, x_stride, y_stride, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
