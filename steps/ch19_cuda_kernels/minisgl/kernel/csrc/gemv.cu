// y = x @ w.T for a few rows of x: the projections of a decode step at batch 1 to 8, where the
// weight is read once per step and each of its elements meets only 1-8 numbers of x. The time
// is the weight's bytes over the memory's speed, so the kernel's one job is to stream w: one
// warp per output column n reads row n of w [n_out, k] in 16-byte pieces, multiplies them with
// every row of x (small, and cached), adds up in float32 across its lanes with shuffles, and
// writes y[m, n] rounded to bfloat16. bfloat16 only: the GPU's serving dtype, where a decode
// step is bound by reading the weights (float32 runs on the CPU go to the reference matmul).
// x [rows, k] and y [rows, n_out] are row-major, rows `x_stride` / `y_stride` elements apart;
// w is contiguous; k is a multiple of 8 and every row starts 16-byte aligned (the Python
// wrapper checks).
#include "cuda_model.h"

constexpr int kLanes = 32;
constexpr int kWarps = 4;  // output columns per block

// The 8 bfloat16 of one 16-byte piece as floats.
HOST_DEVICE inline void unpack(const uint4& piece, float* out) {
  const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
  for (int j = 0; j < 4; ++j) {  // little-endian: the lower half is the earlier element
    out[2 * j] = to_float(bf16{static_cast<uint16_t>(words[j] & 0xffffu)});
    out[2 * j + 1] = to_float(bf16{static_cast<uint16_t>(words[j] >> 16)});
  }
}

template <int kRows>
__global__ void gemv_kernel(bf16* __restrict__ y, const bf16* __restrict__ x,
                            const bf16* __restrict__ w, int64_t n_out, int64_t k,
                            int64_t x_stride, int64_t y_stride) {
  constexpr int kPer = 8;  // bfloat16 in a 16-byte piece
  const int lane = threadIdx.x % kLanes;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kLanes;
  const int64_t pieces = k / kPer;
  float acc[kRows];
  for (int m = 0; m < kRows; ++m) acc[m] = 0.0f;
  if (col < n_out) {  // no early return: every warp reaches the shuffles below
    const uint4* row = reinterpret_cast<const uint4*>(w + col * k);
    for (int64_t i = lane; i < pieces; i += kLanes) {
      float wf[kPer], xf[kPer];
      unpack(row[i], wf);
      for (int m = 0; m < kRows; ++m) {
        unpack(reinterpret_cast<const uint4*>(x + m * x_stride)[i], xf);
        for (int j = 0; j < kPer; ++j) acc[m] += wf[j] * xf[j];
      }
    }
  }
  for (int m = 0; m < kRows; ++m)
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
      acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
  if (col < n_out && lane == 0)
    for (int m = 0; m < kRows; ++m) y[m * y_stride + col] = from_float<bf16>(acc[m]);
}

template <int kRows>
static void launch_gemv(void* y, const void* x, const void* w, int64_t n_out, int64_t k,
                        int64_t x_stride, int64_t y_stride, void* stream) {
  auto kernel = gemv_kernel<kRows>;
  LAUNCH(kernel, dim3((n_out + kWarps - 1) / kWarps), dim3(kLanes * kWarps), stream,
         static_cast<bf16*>(y), static_cast<const bf16*>(x), static_cast<const bf16*>(w), n_out,
         k, x_stride, y_stride);
}

// Returns a CUDA error code (0: none); -1 for more than 8 rows.
extern "C" int minisgl_gemv(void* y, const void* x, const void* w, int64_t rows, int64_t n_out,
                            int64_t k, int64_t x_stride, int64_t y_stride, void* stream) {
  if (rows < 0 || rows > 8) return -1;
  if (rows == 0 || n_out == 0) return 0;
  using Launch = void (*)(void*, const void*, const void*, int64_t, int64_t, int64_t, int64_t,
                          void*);
  const Launch by_rows[8] = {launch_gemv<1>, launch_gemv<2>, launch_gemv<3>, launch_gemv<4>,
                             launch_gemv<5>, launch_gemv<6>, launch_gemv<7>, launch_gemv<8>};
  by_rows[rows - 1](y, x, w, n_out, k, x_stride, y_stride, stream);
#ifdef __CUDACC__
  return static_cast<int>(cudaGetLastError());
#else
  return 0;
#endif
}
