// Launches one of sluice's CUDA kernels under the host emulation (cuda_emulation.h) for a test.
//
// Usage: launch KERNEL < request > reply. The request, little-endian: grid (3 u32), block
// (3 u32), dynamic shared bytes (u32), argument count (u32), then per argument a tag (u32: 0 a
// buffer, followed by its byte length as u64 and its bytes; 1 an i32; 2 an f32). The reply:
// every buffer argument, in order, as its byte length (u64) and bytes, after the launch. A
// kernel whose arguments do not match its signature's kinds exits with status 2.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "cuda_emulation.h"
#include "cuda_fp16.h"

extern "C" {
void paged_attention_f16(float *, const float *, const __half *, const __half *,
                         const unsigned int *, int, int, int, int, int, float);
void paged_attention_split_f16(float *, float *, const float *, const __half *, const __half *,
                               const unsigned int *, int, int, int, int, int, float);
void paged_attention_combine_f32(float *, const float *, const float *, int, int, int, int);
void kv_write_f16(__half *, const float *, const float *, const float *, const unsigned int *,
                  int, int, int, int, int, int);
void add_rms_norm_f32(float *, const float *, const float *, const float *, int, int, float);
void swiglu_f32(float *, const float *, int, int);
void rotate_queries_f32(float *, const float *, const float *, const float *, int, int, int,
                        int);
}

namespace {

[[noreturn]] void fail(const std::string &why) {
  std::fprintf(stderr, "launch: %s\n", why.c_str());
  std::exit(2);
}

void read_exact(void *to, size_t n) {
  if (n > 0 && std::fread(to, 1, n, stdin) != n) fail("short request");
}

template <typename T> T read_value() {
  T v;
  read_exact(&v, sizeof v);
  return v;
}

struct Arg {
  uint32_t tag;
  std::vector<unsigned char> bytes;
  int32_t i;
  float f;
};

struct Args {
  std::vector<Arg> v;
  size_t next = 0;
  const Arg &take(uint32_t tag) {
    if (next >= v.size()) fail("too few arguments");
    const Arg &a = v[next++];
    if (a.tag != tag) fail("argument " + std::to_string(next - 1) + " is of the wrong kind");
    return a;
  }
  template <typename T> T *buf() {
    return reinterpret_cast<T *>(const_cast<unsigned char *>(take(0).bytes.data()));
  }
  int i32() { return take(1).i; }
  float f32() { return take(2).f; }
  void done() const {
    if (next != v.size()) fail("too many arguments");
  }
};

// What both attention kernels take after their outputs, in paged.cu's order.
struct Attention {
  const float *q;
  const __half *k, *v;
  const unsigned int *meta;
  int rows, heads, kv_heads, hd, block_size;
  float scale;
};

Attention take_attention(Args &args) {
  Attention a;
  a.q = args.buf<const float>();
  a.k = args.buf<const __half>();
  a.v = args.buf<const __half>();
  a.meta = args.buf<const unsigned int>();
  a.rows = args.i32(), a.heads = args.i32(), a.kv_heads = args.i32(), a.hd = args.i32(),
  a.block_size = args.i32();
  a.scale = args.f32();
  return a;
}

// Runs `kernel` over the grid: blocks one after another, each block's threads at once. The
// threads are made once and run every block in turn, between a start and an end barrier
// shared with this thread, as a GPU's multiprocessor reuses its slots.
template <typename F> void launch(dim3 grid, dim3 block, uint32_t shared, F kernel) {
  emu::grid_dim = grid;
  emu::block_dim = block;
  const unsigned int threads = block.x * block.y * block.z;
  const unsigned int blocks = grid.x * grid.y * grid.z;
  emu::Block b(threads);
  b.dynamic_shared.resize(shared);
  emu::block = &b;
  std::barrier<> start(threads + 1), end(threads + 1);
  std::vector<std::thread> pool;
  for (unsigned int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      emu::thread_idx = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      for (unsigned int i = 0; i < blocks; ++i) {
        start.arrive_and_wait();
        emu::block_idx = dim3{i % grid.x, (i / grid.x) % grid.y, i / (grid.x * grid.y)};
        kernel();
        end.arrive_and_wait();
      }
    });
  }
  for (unsigned int i = 0; i < blocks; ++i) {
    start.arrive_and_wait();
    end.arrive_and_wait();
  }
  for (auto &th : pool) th.join();
  emu::block = nullptr;
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) fail("usage: launch KERNEL < request > reply");
  const std::string name = argv[1];
  dim3 grid, block;
  grid.x = read_value<uint32_t>(), grid.y = read_value<uint32_t>(), grid.z = read_value<uint32_t>();
  block.x = read_value<uint32_t>(), block.y = read_value<uint32_t>(), block.z = read_value<uint32_t>();
  const auto shared = read_value<uint32_t>();
  const auto count = read_value<uint32_t>();
  Args args;
  for (uint32_t i = 0; i < count; ++i) {
    Arg a{read_value<uint32_t>(), {}, 0, 0.f};
    if (a.tag == 0) {
      a.bytes.resize(read_value<uint64_t>());
      read_exact(a.bytes.data(), a.bytes.size());
    } else if (a.tag == 1) {
      a.i = read_value<int32_t>();
    } else if (a.tag == 2) {
      a.f = read_value<float>();
    } else {
      fail("unknown argument tag");
    }
    args.v.push_back(std::move(a));
  }
  // The arguments are taken in the signature's order before the launch, so a mismatch fails
  // before any thread runs.
  if (name == "paged_attention_f16") {
    auto out = args.buf<float>();
    const Attention a = take_attention(args);
    args.done();
    launch(grid, block, shared, [=] {
      paged_attention_f16(out, a.q, a.k, a.v, a.meta, a.rows, a.heads, a.kv_heads, a.hd,
                          a.block_size, a.scale);
    });
  } else if (name == "paged_attention_split_f16") {
    auto part_acc = args.buf<float>();
    auto part_stats = args.buf<float>();
    const Attention a = take_attention(args);
    args.done();
    launch(grid, block, shared, [=] {
      paged_attention_split_f16(part_acc, part_stats, a.q, a.k, a.v, a.meta, a.rows, a.heads,
                                a.kv_heads, a.hd, a.block_size, a.scale);
    });
  } else if (name == "paged_attention_combine_f32") {
    auto out = args.buf<float>();
    auto part_acc = args.buf<const float>();
    auto part_stats = args.buf<const float>();
    int heads = args.i32(), kv_heads = args.i32(), hd = args.i32(), splits = args.i32();
    args.done();
    launch(grid, block, shared, [=] {
      paged_attention_combine_f32(out, part_acc, part_stats, heads, kv_heads, hd, splits);
    });
  } else if (name == "kv_write_f16") {
    auto pool = args.buf<__half>();
    auto src = args.buf<const float>();
    auto cos = args.buf<const float>();
    auto sin = args.buf<const float>();
    auto slots = args.buf<const unsigned int>();
    int n = args.i32(), stride = args.i32(), column = args.i32(), kv_width = args.i32(),
        head_dim = args.i32(), rope = args.i32();
    args.done();
    launch(grid, block, shared, [=] {
      kv_write_f16(pool, src, cos, sin, slots, n, stride, column, kv_width, head_dim, rope);
    });
  } else if (name == "add_rms_norm_f32") {
    auto out = args.buf<float>();
    auto x = args.buf<const float>();
    auto delta = args.buf<const float>();
    auto w = args.buf<const float>();
    int n = args.i32(), d = args.i32();
    float eps = args.f32();
    args.done();
    launch(grid, block, shared, [=] { add_rms_norm_f32(out, x, delta, w, n, d, eps); });
  } else if (name == "swiglu_f32") {
    auto out = args.buf<float>();
    auto x = args.buf<const float>();
    int n = args.i32(), ff = args.i32();
    args.done();
    launch(grid, block, shared, [=] { swiglu_f32(out, x, n, ff); });
  } else if (name == "rotate_queries_f32") {
    auto out = args.buf<float>();
    auto qkv = args.buf<const float>();
    auto cos = args.buf<const float>();
    auto sin = args.buf<const float>();
    int n = args.i32(), stride = args.i32(), heads = args.i32(), head_dim = args.i32();
    args.done();
    launch(grid, block, shared, [=] {
      rotate_queries_f32(out, qkv, cos, sin, n, stride, heads, head_dim);
    });
  } else {
    fail("unknown kernel " + name);
  }
  for (const Arg &a : args.v) {
    if (a.tag != 0) continue;
    const uint64_t n = a.bytes.size();
    std::fwrite(&n, sizeof n, 1, stdout);
    std::fwrite(a.bytes.data(), 1, n, stdout);
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}
