// Paged attention over sluice's f16 KV block pool (see paged.rs for the contract and the CPU
// implementation this kernel must agree with). build.rs compiles it to PTX for a low virtual
// architecture, which the driver JIT-compiles for the GPU at hand.
//
// One thread block per (query row, KV head): it serves the GQA group's query heads, walking the
// row's context in tiles of TILE positions, in table order, with an online softmax in f32:
//   1. each tile's pool slots are looked up once through the block table;
//   2. a warp per position loads the K row (f16, widened) and scores it against every head of
//      the group (warp reductions);
//   3. a warp per head folds the tile's scores into the running max and sum;
//   4. every thread updates the outputs it owns with the tile's weighted V rows.
// The order of every sum is fixed by the row's own context, so a row's result does not depend
// on the rest of the batch. No host synchronisation: everything it reads is on the device.
#include <cuda_fp16.h>

#define THREADS 128
#define WARPS (THREADS / 32)
#define TILE 64
// Outputs per thread: group * head_dim <= THREADS * MAX_ACC (checked by the host).
#define MAX_ACC 16
// K elements per lane: head_dim <= 32 * MAX_KREG, a multiple of 32 (checked by the host).
#define MAX_KREG 8

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// out:  [rows, heads * hd] f32
// q:    [n, heads, hd] f32 (RoPE applied)
// k, v: [slots, kv_heads * hd] f16
// meta: [3 * rows] (q_row, context, table offset) then the block tables, u32
extern "C" __global__ void paged_attention_f16(float *__restrict__ out,
                                               const float *__restrict__ q,
                                               const __half *__restrict__ k_pool,
                                               const __half *__restrict__ v_pool,
                                               const unsigned int *__restrict__ meta, int rows,
                                               int heads, int kv_heads, int hd, int block_size,
                                               float scale) {
  const int row = blockIdx.x, kvh = blockIdx.y;
  const int group = heads / kv_heads;
  const int width = group * hd;
  const size_t kv_width = (size_t)kv_heads * hd;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned int q_row = meta[3 * row];
  const unsigned int context = meta[3 * row + 1];
  const unsigned int *table = meta + 3 * rows + meta[3 * row + 2];

  extern __shared__ float smem[];
  float *qs = smem;                  // [group * hd]
  float *s = qs + width;             // [group * TILE]: scores, then weights
  float *run_max = s + group * TILE; // [group]
  float *run_sum = run_max + group;  // [group]
  float *corr = run_sum + group;     // [group]
  unsigned int *slots = (unsigned int *)(corr + group); // [TILE]

  const float *qsrc = q + ((size_t)q_row * heads + (size_t)kvh * group) * hd;
  for (int i = tid; i < width; i += THREADS) qs[i] = qsrc[i];
  for (int h = tid; h < group; h += THREADS) {
    run_max[h] = neg_inf();
    run_sum[h] = 0.f;
  }
  float acc[MAX_ACC];
#pragma unroll
  for (int a = 0; a < MAX_ACC; ++a) acc[a] = 0.f;
  const size_t head_off = (size_t)kvh * hd;
  __syncthreads();

  for (unsigned int t0 = 0; t0 < context; t0 += TILE) {
    const int tn = min(TILE, (int)(context - t0));
    for (int p = tid; p < tn; p += THREADS) {
      const unsigned int pos = t0 + p;
      slots[p] = table[pos / block_size] * block_size + pos % block_size;
    }
    __syncthreads();

    // 2. Scores: a warp per position, each lane holding hd / 32 elements of the K row.
    for (int p = warp; p < tn; p += WARPS) {
      const __half *krow = k_pool + (size_t)slots[p] * kv_width + head_off;
      float kreg[MAX_KREG];
#pragma unroll
      for (int i = 0; i < MAX_KREG; ++i) {
        const int d = lane + 32 * i;
        kreg[i] = d < hd ? __half2float(krow[d]) : 0.f;
      }
      for (int h = 0; h < group; ++h) {
        float part = 0.f;
#pragma unroll
        for (int i = 0; i < MAX_KREG; ++i) {
          const int d = lane + 32 * i;
          if (d < hd) part += qs[h * hd + d] * kreg[i];
        }
        part = warp_sum(part);
        if (lane == 0) s[h * TILE + p] = part * scale;
      }
    }
    __syncthreads();

    // 3. The running softmax: a warp per head.
    for (int h = warp; h < group; h += WARPS) {
      float m = neg_inf();
      for (int p = lane; p < tn; p += 32) m = fmaxf(m, s[h * TILE + p]);
      m = warp_max(m);
      const float old = run_max[h];
      const float nm = fmaxf(old, m);
      float sum = 0.f;
      for (int p = lane; p < tn; p += 32) {
        const float e = expf(s[h * TILE + p] - nm);
        s[h * TILE + p] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float c = expf(old - nm);
        corr[h] = c;
        run_sum[h] = run_sum[h] * c + sum;
        run_max[h] = nm;
      }
    }
    __syncthreads();

    // 4. Values: thread tid owns outputs tid + a * THREADS of the group's [group, hd].
#pragma unroll
    for (int a = 0; a < MAX_ACC; ++a) {
      const int i = tid + a * THREADS;
      if (i < width) acc[a] *= corr[i / hd];
    }
    for (int p = 0; p < tn; ++p) {
      const __half *vrow = v_pool + (size_t)slots[p] * kv_width + head_off;
#pragma unroll
      for (int a = 0; a < MAX_ACC; ++a) {
        const int i = tid + a * THREADS;
        if (i < width) acc[a] += s[(i / hd) * TILE + p] * __half2float(vrow[i % hd]);
      }
    }
    __syncthreads();
  }

  float *dst = out + ((size_t)row * heads + (size_t)kvh * group) * hd;
#pragma unroll
  for (int a = 0; a < MAX_ACC; ++a) {
    const int i = tid + a * THREADS;
    if (i < width) dst[i] = acc[a] / run_sum[i / hd];
  }
}
