// Writes one layer's keys or values of a step into sluice's f16 KV block pool (see kv.rs for the
// contract and the CPU implementation this kernel must agree with). build.rs compiles it to PTX
// for a low virtual architecture, which the driver JIT-compiles for the GPU at hand.
//
// One thread per (token, pair of adjacent columns): it reads the pair from the token's row of
// the fused QKV product, rotates it by the token's RoPE angle when asked (GGUF's interleaved
// layout: pairs (2i, 2i + 1) of each head), rounds to f16 and stores it in the token's slot.
#include <cuda_fp16.h>

// pool:  [slots, kv_width] f16
// src:   [n, stride] f32; the columns written start at `column`
// cos, sin: [n, head_dim / 2] f32
// slots: [n] u32
extern "C" __global__ void kv_write_f16(__half *__restrict__ pool, const float *__restrict__ src,
                                        const float *__restrict__ cos,
                                        const float *__restrict__ sin,
                                        const unsigned int *__restrict__ slots, int n, int stride,
                                        int column, int kv_width, int head_dim, int rope) {
  const size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t pairs_per_row = (size_t)kv_width / 2;
  if (pair >= (size_t)n * pairs_per_row) return;
  const size_t row = pair / pairs_per_row;
  const int c = (int)(pair % pairs_per_row) * 2;
  const float *x = src + row * (size_t)stride + column + c;
  float y0 = x[0], y1 = x[1];
  if (rope) {
    const int half_dim = head_dim / 2;
    const size_t i = row * (size_t)half_dim + (c % head_dim) / 2;
    const float cs = cos[i], sn = sin[i];
    y0 = x[0] * cs - x[1] * sn;
    y1 = x[0] * sn + x[1] * cs;
  }
  __half *out = pool + (size_t)slots[row] * kv_width + c;
  out[0] = __float2half_rn(y0);
  out[1] = __float2half_rn(y1);
}
