// What a kernel source sees of CUDA, on both sides of the build.
//
// nvcc (__CUDACC__): the real thing; this header only adds the launch macro, the two
// programmatic-dependent-launch calls (below) and bfloat16 conversions written once for both
// builds.
//
// A C++ compiler (the CPU emulator): the CUDA execution model rebuilt from threads. A launch runs
// the grid's blocks one after another; the threads of a block run at the same time as
// std::threads, so that __syncthreads() is a real barrier among them. __shared__ becomes
// `static`: one copy that every thread of the running block sees -- blocks never overlap, so it
// is exactly a block's shared memory. threadIdx, blockIdx, blockDim and gridDim are per-thread
// variables set before the kernel body runs. A warp shuffle is an exchange through memory between
// two barriers (see there). The kernel's own code, index arithmetic included, is what executes.
#pragma once

#include <cstdint>

#ifdef __CUDACC__

#include <cstdlib>

#include <cuda_runtime.h>
#define HOST_DEVICE __host__ __device__

// Programmatic dependent launch (PDL, compute capability 9.0 and later): a kernel launched with
// this attribute may be scheduled while the kernel before it in the stream is still finishing,
// so its launch and whatever it reads that no earlier kernel writes (a weight) overlap that
// tail. The price: it must call wait_for_previous_kernel() before it reads an earlier
// kernel's output or writes anything. MINISGL_PDL=0 launches every kernel the classic way
// (to measure what this saves).
inline bool pdl_enabled() {
  static const bool enabled = [] {
    const char* setting = std::getenv("MINISGL_PDL");
    int device = 0, major = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    return major >= 9 && !(setting != nullptr && setting[0] == '0');
  }();
  return enabled;
}

template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, void* stream,
                          Args... args) {
  cudaLaunchAttribute early_start{};
  early_start.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early_start.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = static_cast<cudaStream_t>(stream);
  config.attrs = &early_start;
  config.numAttrs = pdl_enabled() ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);  // errors: cudaGetLastError
}
#define LAUNCH(kernel, grid, block, stream, ...) \
  launch_kernel((kernel), (grid), (block), (stream), __VA_ARGS__)

#else  // the emulator

#include <atomic>
#include <barrier>
#include <functional>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
#define HOST_DEVICE

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 { unsigned x, y, z, w; };

namespace emulator {
inline thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;
inline thread_local std::barrier<>* block_barrier = nullptr;

// Runs body() once per thread of the grid, block after block.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> barrier(threads);
        std::vector<std::thread> pool;
        pool.reserve(threads);
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            thread_idx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
            block_idx = dim3(bx, by, bz);
            block_dim = block;
            grid_dim = grid;
            block_barrier = &barrier;
            body();
          });
        for (auto& thread : pool) thread.join();
      }
}
}  // namespace emulator

#define threadIdx (emulator::thread_idx)
#define blockIdx (emulator::block_idx)
#define blockDim (emulator::block_dim)
#define gridDim (emulator::grid_dim)
inline void __syncthreads() { emulator::block_barrier->arrive_and_wait(); }

// `value` as held by the lane whose index differs by `lane_mask` (below 32: the same warp). The
// barriers are the block's, so every thread of the block must make the call at the same point
// (uniform control flow, whole warps), where CUDA needs only the lanes named in `mask`. That, and
// float values, is all the kernels here ask of it.
inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
  static float slots[1024];  // one per thread of the running block, as __shared__ would be
  const unsigned me = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  slots[me] = value;
  __syncthreads();
  const float theirs = slots[me ^ lane_mask];
  __syncthreads();  // no thread writes its next value before its partner has read this one
  return theirs;
}

// Blocks run one after another, so these only need to be right among a block's threads.
inline int32_t atomicAdd(int32_t* address, int32_t value) {
  return std::atomic_ref<int32_t>(*address).fetch_add(value);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T> inline T __ldcg(const T* address) { return *address; }  // no L1 here

#define LAUNCH(kernel, grid, block, stream, ...) \
  emulator::launch((grid), (block), [&] { kernel(__VA_ARGS__); })

#endif

// Every kernel here is launched with PDL: it calls wait_for_previous_kernel() before its first
// read of another kernel's output and its first write, and let_next_kernel_start() after its
// last such read, so that the next kernel (ours, or FlashInfer's, which launch the same way on
// this GPU) can be scheduled early in turn; it still waits for this one to finish. Calling it
// after the wait keeps the chain safe: a kernel past its wait knows every earlier one is done.
// Without PDL, and in the emulator (launches run one after another), both do nothing.
__device__ inline void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ inline void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// bfloat16 as its 16 bits, converted by hand, identically on both sides: the top half of a
// float32, rounded to nearest even (NaN is not produced by these kernels' inputs).
struct bf16 { uint16_t bits; };

HOST_DEVICE inline float to_float(float x) { return x; }
HOST_DEVICE inline float to_float(bf16 x) {
  union { uint32_t u; float f; } v{static_cast<uint32_t>(x.bits) << 16};
  return v.f;
}
template <typename T> HOST_DEVICE inline T from_float(float x);
template <> HOST_DEVICE inline float from_float<float>(float x) { return x; }
template <> HOST_DEVICE inline bf16 from_float<bf16>(float x) {
  union { float f; uint32_t u; } v{x};
  const uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((v.u + rounding) >> 16)};
}

// The 8 bfloat16 of one 16-byte piece as floats.
HOST_DEVICE inline void unpack(const uint4& piece, float* out) {
  const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
  for (int j = 0; j < 4; ++j) {  // little-endian: the lower half is the earlier element
    out[2 * j] = to_float(bf16{static_cast<uint16_t>(words[j] & 0xffffu)});
    out[2 * j + 1] = to_float(bf16{static_cast<uint16_t>(words[j] >> 16)});
  }
}
