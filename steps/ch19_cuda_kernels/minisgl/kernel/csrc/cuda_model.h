// What a kernel source sees of CUDA, on both sides of the build.
//
// nvcc (__CUDACC__): the real thing; this header only adds the launch macro, the two
// programmatic-dependent-launch calls (below) and bfloat16 conversions written once for both
// builds.
//
// A C++ compiler (the CPU emulator): the CUDA execution model rebuilt on the CPU. A launch runs
// the grid's blocks one after another; each thread of a block is a fiber (ucontext) of the
// launching thread, with its own stack, so that __syncthreads() is a real barrier among them: a
// thread that reaches it switches to the next, and the block goes on once all have reached it.
// __shared__ becomes `static`: one copy that every thread of the running block sees -- blocks
// never overlap, so it is exactly a block's shared memory. threadIdx, blockIdx, blockDim and
// gridDim are plain variables, threadIdx set to a thread's own each time it takes its turn. A
// warp shuffle is an exchange through memory between two barriers (see there). The kernel's
// own code, index arithmetic included, is what executes.
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

#include <functional>
#include <memory>
#include <vector>

#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700  // macOS declares the ucontext calls only then
#endif
#include <ucontext.h>

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
// A block's CUDA threads are fibers of the launching thread, not operating-system threads: at a
// barrier, a fiber hands the CPU straight to the next one (a switch of registers and stack in
// this process), where each operating-system thread would go to sleep and wait for the kernel
// to wake it -- far slower, above all on a machine of few cores busy with other work.
inline thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;

struct Block {  // the running block's threads
  const std::function<void()>* body = nullptr;
  std::vector<ucontext_t> threads;
  std::vector<bool> finished;
  ucontext_t launcher;  // where a thread goes when its body returns
  unsigned current = 0;
};
inline thread_local Block* running = nullptr;

inline void run_thread() { (*running->body)(); }

// Makes the next unfinished thread after the current one (in a circle) current, threadIdx its.
inline unsigned switch_to_next(Block& block) {
  const unsigned n = block.threads.size();
  do block.current = (block.current + 1) % n; while (block.finished[block.current]);
  const unsigned t = block.current, x = block_dim.x, y = block_dim.y;
  thread_idx = dim3(t % x, t / x % y, t / (x * y));
  return t;
}

// Runs body() once per thread of the grid, block after block. The threads of a block take
// turns in a fixed circle, each running up to its next barrier (or its end), so the last to
// reach a barrier hands back to the first: none passes a barrier before all have reached it.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  constexpr size_t kStack = 256 * 1024;  // address space: only the pages a thread touches are used
  const unsigned threads = block.x * block.y * block.z;
  static thread_local std::unique_ptr<char[]> stacks;
  static thread_local unsigned stacks_for = 0;
  if (stacks_for < threads) stacks.reset(new char[threads * kStack]), stacks_for = threads;
  Block state;
  state.body = &body;
  state.threads.resize(threads);
  running = &state, block_dim = block, grid_dim = grid;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        block_idx = dim3(bx, by, bz);
        for (unsigned t = 0; t < threads; ++t) {  // each thread starts at run_thread, own stack
          ucontext_t& fiber = state.threads[t];
          getcontext(&fiber);
          fiber.uc_stack.ss_sp = stacks.get() + t * kStack;
          fiber.uc_stack.ss_size = kStack;
          fiber.uc_link = &state.launcher;
          makecontext(&fiber, run_thread, 0);
        }
        state.finished.assign(threads, false);
        state.current = threads - 1;  // so that thread 0 goes first
        for (unsigned left = threads; left > 0; --left) {  // back here each time one returns
          swapcontext(&state.launcher, &state.threads[switch_to_next(state)]);
          state.finished[state.current] = true;
        }
      }
  running = nullptr;
}
}  // namespace emulator

#define threadIdx (emulator::thread_idx)
#define blockIdx (emulator::block_idx)
#define blockDim (emulator::block_dim)
#define gridDim (emulator::grid_dim)
inline void __syncthreads() {
  emulator::Block& block = *emulator::running;
  const unsigned me = block.current;
  if (emulator::switch_to_next(block) != me)  // else every other thread has finished
    swapcontext(&block.threads[me], &block.threads[block.current]);
}

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

// Blocks run one after another and a block's threads take turns on one CPU thread, switching
// only at barriers: a plain read-modify-write is already atomic, and there is no other processor
// whose view of memory a fence would order.
inline int32_t atomicAdd(int32_t* address, int32_t value) {
  const int32_t old = *address;
  *address = old + value;
  return old;
}
inline void __threadfence() {}
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
