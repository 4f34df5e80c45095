// Paged attention over sluice's f16 KV block pool (see paged.rs for the contract and the CPU
// implementation this kernel must agree with). build.rs compiles it to PTX for a low virtual
// architecture, which the driver JIT-compiles for the GPU at hand.
//
// One thread block per (query row, KV head): it serves the GQA group's query heads, walking the
// row's context (or, split, one part of it) in tiles of TILE positions, in table order, with an
// online softmax in f32:
//   1. each tile's pool slots are looked up once through the block table;
//   2. a warp per position loads the K row (f16, widened) and scores it against every head of
//      the group (warp reductions);
//   3. a warp per head folds the tile's scores into the running max and sum;
//   4. every thread updates the outputs it owns with the tile's weighted V rows.
// The order of every sum is fixed by the row's own context and the split count (below), so a
// row's result does not depend on the rest of the batch, but for the count: the host derives
// it from the step's row count, and results under two counts differ within rounding. No host
// synchronisation: everything it reads is on the device.
//
// At small batches a block per (row, KV head) leaves most of the GPU idle while each block walks
// a long context tile after tile: paged_attention_split_f16 gives each of `splits` blocks per
// (row, KV head) its own run of tiles and writes its unnormalised outputs and softmax state;
// paged_attention_combine_f32 rescales the parts to their common maximum and sums them
// (flash-decoding).
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

// The block's shared memory, carved as the host sized it (paged.rs, `grid`).
struct Smem {
  float *qs;             // [group * hd]
  float *s;              // [group * TILE]: scores, then weights
  float *run_max;        // [group]
  float *run_sum;        // [group]
  float *corr;           // [group]
  unsigned int *slots;   // [TILE]
};

__device__ __forceinline__ Smem carve(float *smem, int group, int hd) {
  Smem m;
  m.qs = smem;
  m.s = m.qs + group * hd;
  m.run_max = m.s + group * TILE;
  m.run_sum = m.run_max + group;
  m.corr = m.run_sum + group;
  m.slots = (unsigned int *)(m.corr + group);
  return m;
}

// What a block reads of one (row, KV head).
struct Task {
  const __half *k_pool, *v_pool;
  const unsigned int *table;
  unsigned int context;
  int group, hd, block_size;
  size_t kv_width, head_off;
  float scale;
};

// Loads the group's queries of row `row` and KV head `kvh`, zeroes the outputs, resets the
// running softmax; returns the row's task.
__device__ __forceinline__ Task begin(const Smem &m, float *acc, const float *q,
                                      const __half *k_pool, const __half *v_pool,
                                      const unsigned int *meta, int rows, int heads,
                                      int kv_heads, int hd, int block_size, float scale,
                                      int row, int kvh) {
  Task t;
  t.k_pool = k_pool;
  t.v_pool = v_pool;
  t.group = heads / kv_heads;
  t.hd = hd;
  t.block_size = block_size;
  t.kv_width = (size_t)kv_heads * hd;
  t.head_off = (size_t)kvh * hd;
  t.scale = scale;
  const unsigned int q_row = meta[3 * row];
  t.context = meta[3 * row + 1];
  t.table = meta + 3 * rows + meta[3 * row + 2];
  const int width = t.group * hd, tid = threadIdx.x;
  const float *qsrc = q + ((size_t)q_row * heads + (size_t)kvh * t.group) * hd;
  for (int i = tid; i < width; i += THREADS) m.qs[i] = qsrc[i];
  for (int h = tid; h < t.group; h += THREADS) {
    m.run_max[h] = neg_inf();
    m.run_sum[h] = 0.f;
  }
#pragma unroll
  for (int a = 0; a < MAX_ACC; ++a) acc[a] = 0.f;
  __syncthreads();
  return t;
}

// Folds context positions [from, to) into the running state and the outputs, tile by tile.
__device__ __forceinline__ void fold(const Smem &m, float *acc, const Task &t, unsigned int from,
                                     unsigned int to) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = t.group, hd = t.hd, width = group * hd;
  for (unsigned int t0 = from; t0 < to; t0 += TILE) {
    const int tn = min(TILE, (int)(to - t0));
    // 1. The tile's slots, through the block table.
    for (int p = tid; p < tn; p += THREADS) {
      const unsigned int pos = t0 + p;
      m.slots[p] = t.table[pos / t.block_size] * t.block_size + pos % t.block_size;
    }
    __syncthreads();

    // 2. Scores: a warp per position, each lane holding hd / 32 elements of the K row.
    for (int p = warp; p < tn; p += WARPS) {
      const __half *krow = t.k_pool + (size_t)m.slots[p] * t.kv_width + t.head_off;
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
          if (d < hd) part += m.qs[h * hd + d] * kreg[i];
        }
        part = warp_sum(part);
        if (lane == 0) m.s[h * TILE + p] = part * t.scale;
      }
    }
    __syncthreads();

    // 3. The running softmax: a warp per head.
    for (int h = warp; h < group; h += WARPS) {
      float mx = neg_inf();
      for (int p = lane; p < tn; p += 32) mx = fmaxf(mx, m.s[h * TILE + p]);
      mx = warp_max(mx);
      const float old = m.run_max[h];
      const float nm = fmaxf(old, mx);
      float sum = 0.f;
      for (int p = lane; p < tn; p += 32) {
        const float e = expf(m.s[h * TILE + p] - nm);
        m.s[h * TILE + p] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float c = expf(old - nm);
        m.corr[h] = c;
        m.run_sum[h] = m.run_sum[h] * c + sum;
        m.run_max[h] = nm;
      }
    }
    __syncthreads();

    // 4. Values: thread tid owns outputs tid + a * THREADS of the group's [group, hd].
#pragma unroll
    for (int a = 0; a < MAX_ACC; ++a) {
      const int i = tid + a * THREADS;
      if (i < width) acc[a] *= m.corr[i / hd];
    }
    for (int p = 0; p < tn; ++p) {
      const __half *vrow = t.v_pool + (size_t)m.slots[p] * t.kv_width + t.head_off;
#pragma unroll
      for (int a = 0; a < MAX_ACC; ++a) {
        const int i = tid + a * THREADS;
        if (i < width) acc[a] += m.s[(i / hd) * TILE + p] * __half2float(vrow[i % hd]);
      }
    }
    __syncthreads();
  }
}

// out:  [rows, heads * hd] f32
// q:    [n, heads, hd] f32 (RoPE applied)
// k, v: [slots, kv_heads * hd] f16
// meta: [3 * rows] (q_row, context, table offset) then the block tables, u32
// Grid: (rows, kv_heads).
extern "C" __global__ void paged_attention_f16(float *__restrict__ out,
                                               const float *__restrict__ q,
                                               const __half *__restrict__ k_pool,
                                               const __half *__restrict__ v_pool,
                                               const unsigned int *__restrict__ meta, int rows,
                                               int heads, int kv_heads, int hd, int block_size,
                                               float scale) {
  const int row = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x;
  extern __shared__ float smem[];
  const Smem m = carve(smem, heads / kv_heads, hd);
  float acc[MAX_ACC];
  const Task t = begin(m, acc, q, k_pool, v_pool, meta, rows, heads, kv_heads, hd, block_size,
                       scale, row, kvh);
  fold(m, acc, t, 0, t.context);
  const int width = t.group * hd;
  float *dst = out + ((size_t)row * heads + (size_t)kvh * t.group) * hd;
#pragma unroll
  for (int a = 0; a < MAX_ACC; ++a) {
    const int i = tid + a * THREADS;
    if (i < width) dst[i] = acc[a] / m.run_sum[i / hd];
  }
}

// The first half of the split path. Grid: (rows, kv_heads, splits); block z takes the z-th
// run of whole tiles of the row's context (the runs as even as tiles allow; trailing ones may
// be empty) and writes, unnormalised:
// part_acc:   [rows, kv_heads, splits, group * hd] f32: the run's weighted values;
// part_stats: [rows, kv_heads, splits, group, 2] f32: the run's maximum score and its sum of
//             exp(score - maximum) per head (-inf and 0 for an empty run).
// The other arguments as paged_attention_f16's.
extern "C" __global__ void paged_attention_split_f16(float *__restrict__ part_acc,
                                                     float *__restrict__ part_stats,
                                                     const float *__restrict__ q,
                                                     const __half *__restrict__ k_pool,
                                                     const __half *__restrict__ v_pool,
                                                     const unsigned int *__restrict__ meta,
                                                     int rows, int heads, int kv_heads, int hd,
                                                     int block_size, float scale) {
  const int row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int tid = threadIdx.x;
  extern __shared__ float smem[];
  const Smem m = carve(smem, heads / kv_heads, hd);
  float acc[MAX_ACC];
  const Task t = begin(m, acc, q, k_pool, v_pool, meta, rows, heads, kv_heads, hd, block_size,
                       scale, row, kvh);
  const unsigned int tiles = (t.context + TILE - 1) / TILE;
  const unsigned int per = (tiles + splits - 1) / splits * TILE;
  const unsigned int from = min(t.context, split * per);
  const unsigned int to = min(t.context, from + per);
  fold(m, acc, t, from, to);
  const int width = t.group * hd;
  const size_t part = ((size_t)row * kv_heads + kvh) * splits + split;
  float *dst = part_acc + part * width;
#pragma unroll
  for (int a = 0; a < MAX_ACC; ++a) {
    const int i = tid + a * THREADS;
    if (i < width) dst[i] = acc[a];
  }
  for (int h = tid; h < t.group; h += THREADS) {
    part_stats[(part * t.group + h) * 2] = m.run_max[h];
    part_stats[(part * t.group + h) * 2 + 1] = m.run_sum[h];
  }
}

// The second half: out [rows, heads * hd] f32, each output the parts' weighted values rescaled
// to their common maximum, over the parts' rescaled sums. Grid: (rows, kv_heads), THREADS
// threads, no shared memory.
extern "C" __global__ void paged_attention_combine_f32(float *__restrict__ out,
                                                       const float *__restrict__ part_acc,
                                                       const float *__restrict__ part_stats,
                                                       int heads, int kv_heads, int hd,
                                                       int splits) {
  const int row = blockIdx.x, kvh = blockIdx.y;
  const int group = heads / kv_heads, width = group * hd;
  const size_t first = ((size_t)row * kv_heads + kvh) * splits;
  float *dst = out + ((size_t)row * heads + (size_t)kvh * group) * hd;
  for (int i = threadIdx.x; i < width; i += THREADS) {
    const int h = i / hd;
    float mx = neg_inf();
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_stats[((first + s) * group + h) * 2]);
    float num = 0.f, den = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float *st = part_stats + ((first + s) * group + h) * 2;
      const float w = expf(st[0] - mx);
      num += w * part_acc[(first + s) * width + i];
      den += w * st[1];
    }
    dst[i] = num / den;
  }
}
