// A layer's fused element-wise steps (see fused.rs for the contracts and the CPU implementations
// these kernels must agree with). build.rs compiles them to PTX for a low virtual architecture,
// which the driver JIT-compiles for the GPU at hand.
#include <cuda_runtime.h>

// Threads per block; must match ITEM_THREADS in operands.rs, which sizes these launches.
#define THREADS 256

// out: [2, n, d] f32: out[0] = x + delta, out[1] = out[0] / rms(out[0]) * w.
// One block of THREADS threads per row.
extern "C" __global__ void add_rms_norm_f32(float *__restrict__ out, const float *__restrict__ x,
                                            const float *__restrict__ delta,
                                            const float *__restrict__ w, int n, int d,
                                            float eps) {
  __shared__ float partial[THREADS / 32];
  const size_t row = blockIdx.x;
  const float *xr = x + row * d;
  const float *dr = delta + row * d;
  float *sum = out + row * d;
  float *normed = out + (size_t)n * d + row * d;
  float acc = 0.0f;
  for (int c = threadIdx.x; c < d; c += THREADS) {
    const float s = xr[c] + dr[c];
    sum[c] = s;
    acc += s * s;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < THREADS / 32; i++) total += partial[i];
  const float m = sqrtf(total / (float)d + eps);
  for (int c = threadIdx.x; c < d; c += THREADS) normed[c] = sum[c] / m * w[c];
}

// out: [n, ff] f32 = silu(x[:, :ff]) * x[:, ff:], x: [n, 2 * ff] f32. One thread per output.
extern "C" __global__ void swiglu_f32(float *__restrict__ out, const float *__restrict__ x, int n,
                                      int ff) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)n * ff) return;
  const size_t row = i / ff, c = i % ff;
  const float g = x[row * 2 * ff + c];
  const float u = x[row * 2 * ff + ff + c];
  out[i] = g / (1.0f + expf(-g)) * u;
}

// out: [n, heads, head_dim] f32: the first heads * head_dim columns of each row of qkv
// ([n, stride] f32) with each head's pairs (2i, 2i + 1) rotated by the row's angle (cos, sin:
// [n, head_dim / 2] f32). One thread per pair.
extern "C" __global__ void rotate_queries_f32(float *__restrict__ out, const float *__restrict__ qkv,
                                              const float *__restrict__ cos,
                                              const float *__restrict__ sin, int n, int stride,
                                              int heads, int head_dim) {
  const size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t pairs_per_row = (size_t)heads * head_dim / 2;
  if (pair >= (size_t)n * pairs_per_row) return;
  const size_t row = pair / pairs_per_row;
  const int c = (int)(pair % pairs_per_row) * 2;
  const int half_dim = head_dim / 2;
  const size_t i = row * (size_t)half_dim + (c % head_dim) / 2;
  const float x0 = qkv[row * (size_t)stride + c], x1 = qkv[row * (size_t)stride + c + 1];
  const float cs = cos[i], sn = sin[i];
  out[2 * pair] = x0 * cs - x1 * sn;
  out[2 * pair + 1] = x0 * sn + x1 * cs;
}
