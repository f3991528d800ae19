// CPU emulation of the CUDA subset that superopt's code generator emits (test equipment).
//
// Blocks run one after another. The threads of a block are fibers (ucontext) scheduled in a fixed
// order: warp 0 first, its lanes in turn, each until it reaches __syncthreads(), a warp operation
// (shuffle, WMMA load/store) or its end; a warp operation completes as soon as all 32 lanes of the
// warp have reached it, and the warp goes on until every lane waits at __syncthreads() or has
// exited; then warp 1 runs, and so on. A barrier opens when every live thread has reached it. So a
// missing barrier lets warp 0 read shared memory that later warps have not written yet (poisoned
// with 0xFF bytes = NaN at every block start), and the wrong result shows deterministically.
// Deadlocks (a barrier or warp operation some threads never reach), misaligned vector copies and
// shared memory written past the launch's dynamic size stop the run with a message.
#pragma once

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

// The device math the generated code calls, as compiler builtins (no <math.h>: faster builds).
#define expf(x) __builtin_expf(x)
#define sqrtf(x) __builtin_sqrtf(x)

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace so_emu {

[[noreturn]] inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cuda-emu: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(3);
}

inline void check_aligned(const void* p, size_t n, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % n != 0) fail("misaligned %s access at %p (needs %zu bytes)", what, p, n);
}

enum class State { Ready, Barrier, Warp, Done };

struct Fiber {
  ucontext_t ctx;
  State state = State::Done;
  int warp_op = 0;  // what the lane waits for at a warp rendezvous (kShuffle, kMatrix)
  float shfl_value = 0.0f;
  int shfl_mask = 0;
  float shfl_result = 0.0f;
};

constexpr int kShuffle = 1;
constexpr int kMatrix = 2;

// One thread's kernel call: `run(arg)`.
struct Body {
  void (*run)(void*);
  void* arg;
};

constexpr unsigned kMaxThreads = 1024;
constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kWarp = 32;

struct Scheduler {
  ucontext_t main_ctx;
  Fiber fibers[kMaxThreads];
  char* stacks = nullptr;  // one stack of kStackBytes per thread, allocated at the launch
  unsigned current = 0;
  Body body{nullptr, nullptr};
};

inline Scheduler g_sched;
inline uint3 g_thread{0, 0, 0};
inline uint3 g_block{0, 0, 0};
inline dim3 g_block_dim;
inline dim3 g_grid_dim;

inline void fiber_entry() {
  g_sched.body.run(g_sched.body.arg);
  g_sched.fibers[g_sched.current].state = State::Done;  // returning resumes main_ctx (uc_link)
}

inline void yield(State s) {
  Fiber& f = g_sched.fibers[g_sched.current];
  f.state = s;
  swapcontext(&f.ctx, &g_sched.main_ctx);
}

// Release warp w when its 32 lanes all wait at a warp operation; true when released.
inline bool release_warp(unsigned w, unsigned n) {
  unsigned lo = w * kWarp, hi = lo + kWarp;
  if (hi > n) fail("warp operations need whole warps; the block has %u threads", n);
  for (unsigned t = lo; t < hi; ++t)
    if (g_sched.fibers[t].state != State::Warp) return false;
  for (unsigned t = lo; t < hi; ++t) {
    Fiber& f = g_sched.fibers[t];
    if (f.warp_op != g_sched.fibers[lo].warp_op) fail("warp %u diverged: lanes wait at different warp operations", w);
    if (f.warp_op != kShuffle) continue;
    unsigned src = lo + ((t - lo) ^ static_cast<unsigned>(f.shfl_mask));
    if (src >= hi) fail("shuffle lane mask %d leaves the warp", f.shfl_mask);
    f.shfl_result = g_sched.fibers[src].shfl_value;
  }
  for (unsigned t = lo; t < hi; ++t) g_sched.fibers[t].state = State::Ready;
  return true;
}

inline void resume(unsigned t) {
  g_sched.current = t;
  g_thread = uint3{t % g_block_dim.x, (t / g_block_dim.x) % g_block_dim.y, t / (g_block_dim.x * g_block_dim.y)};
  swapcontext(&g_sched.main_ctx, &g_sched.fibers[t].ctx);
}

// Warps run one after another, each as far as it can go (to __syncthreads() or its end) before
// the next starts: a value that another warp should have written before a barrier is not there.
inline void run_block(unsigned n) {
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = g_sched.fibers[t];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g_sched.stacks + t * kStackBytes;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &g_sched.main_ctx;
    makecontext(&f.ctx, fiber_entry, 0);
    f.state = State::Ready;
  }
  unsigned warps = (n + kWarp - 1) / kWarp;
  for (;;) {
    for (unsigned w = 0; w < warps; ++w) {
      do {
        for (unsigned t = w * kWarp; t < n && t < (w + 1) * kWarp; ++t)
          if (g_sched.fibers[t].state == State::Ready) resume(t);
      } while (release_warp(w, n));
    }
    unsigned done = 0, barrier = 0, warp = 0;
    for (unsigned t = 0; t < n; ++t) {
      State s = g_sched.fibers[t].state;
      done += s == State::Done;
      barrier += s == State::Barrier;
      warp += s == State::Warp;
    }
    if (done == n) return;
    if (warp > 0) fail("deadlock in block (%u,%u,%u): %u threads wait at a warp operation their warp never completes",
                       g_block.x, g_block.y, g_block.z, warp);
    if (done > 0) fail("deadlock in block (%u,%u,%u): %u threads wait at __syncthreads() after %u exited",
                       g_block.x, g_block.y, g_block.z, barrier, done);
    for (unsigned t = 0; t < n; ++t) g_sched.fibers[t].state = State::Ready;
  }
}

// Bytes past `smem_bytes` (what the launch requested) must stay untouched.
inline void launch(dim3 grid, dim3 block, unsigned char* smem, size_t smem_bytes, size_t smem_size, Body body) {
  unsigned n = block.x * block.y * block.z;
  if (n > kMaxThreads) fail("%u threads per block exceed %u", n, kMaxThreads);
  if (!g_sched.stacks) g_sched.stacks = static_cast<char*>(malloc(n * kStackBytes));  // one launch per process
  g_sched.body = body;
  g_block_dim = block;
  g_grid_dim = grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        memset(smem, 0xFF, smem_size);
        g_block = uint3{x, y, z};
        run_block(n);
        for (size_t i = smem_bytes; i < smem_size; ++i)
          if (smem[i] != 0xFF) fail("block (%u,%u,%u) wrote shared memory byte %zu beyond the %zu it requested", x, y, z, i,
                                    smem_bytes);
      }
}

}  // namespace so_emu

namespace so_emu {
// A warp-synchronous matrix operation: every lane of the warp arrives before any performs it.
inline void warp_rendezvous() {
  g_sched.fibers[g_sched.current].warp_op = kMatrix;
  yield(State::Warp);
}
}  // namespace so_emu

#define threadIdx (so_emu::g_thread)
#define blockIdx (so_emu::g_block)
#define blockDim (so_emu::g_block_dim)
#define gridDim (so_emu::g_grid_dim)

inline void __syncthreads() { so_emu::yield(so_emu::State::Barrier); }

inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask, int width = 32) {
  if (mask != 0xffffffffu || width != 32) so_emu::fail("only full-warp shuffles are emulated");
  so_emu::Fiber& f = so_emu::g_sched.fibers[so_emu::g_sched.current];
  f.warp_op = so_emu::kShuffle;
  f.shfl_value = value;
  f.shfl_mask = lane_mask;
  so_emu::yield(so_emu::State::Warp);
  return so_emu::g_sched.fibers[so_emu::g_sched.current].shfl_result;
}

// Vector types: copies check the alignment the GPU would fault on.
struct alignas(16) uint4 {
  unsigned x, y, z, w;
  uint4() = default;
  uint4(const uint4& o) = default;
  uint4& operator=(const uint4& o) {
    so_emu::check_aligned(this, 16, "16-byte store");
    so_emu::check_aligned(&o, 16, "16-byte load");
    x = o.x, y = o.y, z = o.z, w = o.w;
    return *this;
  }
};

struct alignas(8) uint2 {
  unsigned x, y;
  uint2() = default;
  uint2(const uint2& o) = default;
  uint2& operator=(const uint2& o) {
    so_emu::check_aligned(this, 8, "8-byte store");
    so_emu::check_aligned(&o, 8, "8-byte load");
    x = o.x, y = o.y;
    return *this;
  }
};
