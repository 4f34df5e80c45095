// CUDA's execution model on the host, for running sluice's kernels (../*.cu) in tests on a
// machine without a GPU: compiled with g++ (`-include cuda_emulation.h`, this folder on the
// include path for <cuda_fp16.h> and <cuda_runtime.h>), every thread of a block is an OS
// thread, `__syncthreads` a barrier over the block, and a warp shuffle an exchange through
// memory between two barriers over the warp. Blocks run one after another, so a kernel's
// static `__shared__` arrays (function statics here) belong to the block that runs. Dynamic
// shared memory is a heap buffer of exactly the launch's size, so an address sanitizer build
// reports a kernel that reads past what the host asked for.
//
// What it does not model: memory fences across blocks, atomics, the timing of a real GPU. A
// race between threads of a block is real here too (the threads run concurrently), but may
// not show on every run.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

namespace emu {

// The running block's threads: their barrier, and per warp an exchange and a barrier.
struct Block {
  explicit Block(unsigned int threads)
      : all(threads), exchange((threads + 31) / 32 * 32) {
    for (unsigned int w = 0; w < (threads + 31) / 32; ++w) {
      warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
    }
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> exchange;
  std::vector<unsigned char> dynamic_shared;
};

inline thread_local dim3 thread_idx, block_idx;
inline dim3 block_dim, grid_dim;
inline Block *block = nullptr;

inline unsigned int linear_thread() {
  return thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z);
}

template <typename T> T shfl_xor(T x, int offset) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  const unsigned int me = linear_thread(), lane = me % 32, warp = me / 32;
  uint64_t *slots = block->exchange.data() + 32 * warp;
  std::memcpy(&slots[lane], &x, sizeof(T));
  block->warps[warp]->arrive_and_wait();
  T y;
  std::memcpy(&y, &slots[lane ^ static_cast<unsigned int>(offset)], sizeof(T));
  block->warps[warp]->arrive_and_wait();
  return y;
}

inline void *dynamic_shared() { return block->dynamic_shared.data(); }

} // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::block->all.arrive_and_wait(); }

template <typename T> T __shfl_xor_sync(unsigned int, T x, int offset) {
  return emu::shfl_xor(x, offset);
}

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

using std::max;
using std::min;
