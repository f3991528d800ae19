// main() of an emulated kernel binary:
//   BINARY KERNEL GX GY GZ SMEM_BYTES (r|w):FILE:OFFSET ...
// Each FILE holds one argument buffer (guard bytes around the tensor); the kernel gets a pointer
// OFFSET bytes into it. Buffers marked w are written back after the launch.
#pragma once
#include <utility>

#include "cuda_emu.h"

// The dynamic shared memory the kernels declare (`extern __shared__ ... so_smem[]`): one block
// runs at a time, so one buffer serves them all; it is poisoned before every block.
constexpr size_t kSoSmemCap = 228 * 1024;
alignas(128) unsigned char so_smem[kSoSmemCap];

namespace so_emu {

constexpr int kMaxArgs = 64;

using Call = void (*)(void* const* args);

struct Entry {
  const char* name;
  Call call;
};

template <auto F, class... P, size_t... I>
void call_with(void (*)(P...), void* const* args, std::index_sequence<I...>) {
  F(static_cast<P>(args[I])...);
}

template <class... P>
constexpr size_t arity(void (*)(P...)) {
  return sizeof...(P);
}

// A kernel called with its arguments from an array of untyped pointers.
template <auto F>
void call(void* const* args) {
  call_with<F>(F, args, std::make_index_sequence<arity(F)>{});
}

struct Buffer {
  const char* path;
  bool written;
  size_t offset;
  size_t size;
  unsigned char* data;
};

inline Buffer read_buffer(char* spec) {
  char* a = strchr(spec, ':');
  char* b = strrchr(spec, ':');
  if (!a || a == b) fail("bad buffer spec %s", spec);
  *b = '\0';
  Buffer buf{a + 1, spec[0] == 'w', strtoul(b + 1, nullptr, 10), 0, nullptr};
  FILE* f = fopen(buf.path, "rb");
  if (!f) fail("cannot open %s", buf.path);
  fseek(f, 0, SEEK_END);
  buf.size = static_cast<size_t>(ftell(f));
  fseek(f, 0, SEEK_SET);
  buf.data = static_cast<unsigned char*>(aligned_alloc(256, (buf.size + 255) / 256 * 256));
  if (fread(buf.data, 1, buf.size, f) != buf.size) fail("short read of %s", buf.path);
  fclose(f);
  return buf;
}

struct Launch {
  Call call;
  void* const* args;
};

inline void run_thread(void* p) {
  const Launch* l = static_cast<const Launch*>(p);
  l->call(l->args);
}

inline int main_driver(int argc, char** argv, const Entry* kernels, int n) {
  if (argc < 6) fail("usage: %s KERNEL GX GY GZ SMEM BUFFERS...", argv[0]);
  const Entry* entry = nullptr;
  for (int i = 0; i < n; ++i)
    if (strcmp(kernels[i].name, argv[1]) == 0) entry = &kernels[i];
  if (!entry) fail("no kernel named %s", argv[1]);
  dim3 grid(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  size_t smem_bytes = strtoul(argv[5], nullptr, 10);
  if (smem_bytes > kSoSmemCap) fail("%zu bytes of shared memory exceed any GPU's %zu", smem_bytes, kSoSmemCap);
  if (argc - 6 > kMaxArgs) fail("too many kernel arguments");
  Buffer buffers[kMaxArgs];
  void* args[kMaxArgs];
  for (int i = 6; i < argc; ++i) {
    buffers[i - 6] = read_buffer(argv[i]);
    args[i - 6] = buffers[i - 6].data + buffers[i - 6].offset;
  }
  Launch launch_args{entry->call, args};
  launch(grid, dim3(128), so_smem, smem_bytes, kSoSmemCap, Body{run_thread, &launch_args});
  for (int i = 0; i < argc - 6; ++i) {
    const Buffer& b = buffers[i];
    if (!b.written) continue;
    FILE* f = fopen(b.path, "wb");
    if (!f || fwrite(b.data, 1, b.size, f) != b.size) fail("cannot write %s", b.path);
    fclose(f);
  }
  return 0;
}

}  // namespace so_emu

#define SO_EMU_KERNEL(name) so_emu::Entry{#name, so_emu::call<name>}
#define SO_EMU_MAIN(...)                                                                   \
  int main(int argc, char** argv) {                                                         \
    static const so_emu::Entry kernels[] = {__VA_ARGS__};                                   \
    return so_emu::main_driver(argc, argv, kernels, sizeof(kernels) / sizeof(kernels[0])); \
  }
