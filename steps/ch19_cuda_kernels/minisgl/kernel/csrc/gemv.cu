// y = x @ w.T for a few rows of x: the projections of a decode step at batch 1 to 4, where the
// weight is read once per step and each of its elements meets only 1-4 numbers of x. The time
// is the weight's bytes over the memory's speed, so the kernel's one job is to stream w: warps
// read rows of w [n_out, k] in 16-byte pieces, multiply them with every row of x (small, and
// cached), add up in float32 across their lanes with shuffles, and write y[m, n] rounded to
// bfloat16. bfloat16 only: the GPU's serving dtype, where a decode step is bound by reading the
// weights (float32 runs on the CPU go to the reference matmul). x [rows, k] and y [rows, n_out]
// are row-major, rows `x_stride` / `y_stride` elements apart; w is contiguous; k is a multiple
// of 8 and every row starts 16-byte aligned (the Python wrapper checks).
#include "cuda_model.h"

constexpr int kLanes = 32;
constexpr int kWarps = 4;  // per block
constexpr int kMaxRows = 4;

// The 8 bfloat16 of one 16-byte piece as floats.
HOST_DEVICE inline void unpack(const uint4& piece, float* out) {
  const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
  for (int j = 0; j < 4; ++j) {  // little-endian: the lower half is the earlier element
    out[2 * j] = to_float(bf16{static_cast<uint16_t>(words[j] & 0xffffu)});
    out[2 * j + 1] = to_float(bf16{static_cast<uint16_t>(words[j] >> 16)});
  }
}

// kSplit warps share one output column, each taking every kSplit-th run of 32 pieces of its
// row: a long row (o_proj's 2,048, down_proj's 3,072) is read by 4 warps at once instead of
// one, and the few columns of those projections (1,024) still fill the GPU. With kSplit = 1 a
// block holds 4 columns. The warps' partial sums meet in shared memory.
template <int kRows, int kSplit>
__global__ void gemv_kernel(bf16* __restrict__ y, const bf16* __restrict__ x,
                            const bf16* __restrict__ w, int64_t n_out, int64_t k,
                            int64_t x_stride, int64_t y_stride) {
  __shared__ float partial[kWarps][kMaxRows];
  constexpr int kPer = 8;  // bfloat16 in a 16-byte piece
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * (kWarps / kSplit) + warp / kSplit;
  const int64_t pieces = k / kPer;
  float acc[kRows];
  for (int m = 0; m < kRows; ++m) acc[m] = 0.0f;
  if (col < n_out) {  // no early return: every thread reaches the shuffles and the barrier
    const uint4* row = reinterpret_cast<const uint4*>(w + col * k);
    for (int64_t i = (warp % kSplit) * kLanes + lane; i < pieces; i += kSplit * kLanes) {
      float wf[kPer], xf[kPer];
      unpack(row[i], wf);
      for (int m = 0; m < kRows; ++m) {
        unpack(reinterpret_cast<const uint4*>(x + m * x_stride)[i], xf);
        for (int j = 0; j < kPer; ++j) acc[m] += wf[j] * xf[j];
      }
    }
  }
  for (int m = 0; m < kRows; ++m) {
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
      acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
    if (lane == 0) partial[warp][m] = acc[m];
  }
  __syncthreads();
  if (col < n_out && lane == 0 && warp % kSplit == 0)
    for (int m = 0; m < kRows; ++m) {
      float sum = 0.0f;
      for (int part = 0; part < kSplit; ++part) sum += partial[warp + part][m];
      y[m * y_stride + col] = from_float<bf16>(sum);
    }
}

template <int kRows, int kSplit>
static void launch_gemv(void* y, const void* x, const void* w, int64_t n_out, int64_t k,
                        int64_t x_stride, int64_t y_stride, void* stream) {
  constexpr int columns_per_block = kWarps / kSplit;
  auto kernel = gemv_kernel<kRows, kSplit>;
  LAUNCH(kernel, dim3((n_out + columns_per_block - 1) / columns_per_block),
         dim3(kLanes * kWarps), stream, static_cast<bf16*>(y), static_cast<const bf16*>(x),
         static_cast<const bf16*>(w), n_out, k, x_stride, y_stride);
}

template <int kSplit>
static void launch_rows(int64_t rows, void* y, const void* x, const void* w, int64_t n_out,
                        int64_t k, int64_t x_stride, int64_t y_stride, void* stream) {
  using Launch = void (*)(void*, const void*, const void*, int64_t, int64_t, int64_t, int64_t,
                          void*);
  const Launch by_rows[kMaxRows] = {launch_gemv<1, kSplit>, launch_gemv<2, kSplit>,
                                    launch_gemv<3, kSplit>, launch_gemv<4, kSplit>};
  by_rows[rows - 1](y, x, w, n_out, k, x_stride, y_stride, stream);
}

// Returns a CUDA error code (0: none); -1 for more than 4 rows.
extern "C" int minisgl_gemv(void* y, const void* x, const void* w, int64_t rows, int64_t n_out,
                            int64_t k, int64_t x_stride, int64_t y_stride, void* stream) {
  if (rows < 0 || rows > kMaxRows) return -1;
  if (rows == 0 || n_out == 0) return 0;
  // A row of 2,048 or more elements is 256+ pieces: 2+ per lane even split four ways.
  if (k >= 2048)
    launch_rows<kWarps>(rows, y, x, w, n_out, k, x_stride, y_stride, stream);
  else
    launch_rows<1>(rows, y, x, w, n_out, k, x_stride, y_stride, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
