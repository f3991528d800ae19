// Emulated WMMA (nvcuda::wmma) for 16x16x16 fragments. Each lane's fragment holds the whole
// matrix: load_matrix_sync / mma_sync / store_matrix_sync have the documented effect on memory
// (products of f16/bf16 operands accumulated in fp32), and the alignment and leading-dimension
// rules the hardware imposes are checked. Loads and stores are warp-collective: all 32 lanes meet
// before any lane performs one (as the .sync operations require), so a lane never reads memory
// that another lane of its warp has already stored to in the same step. Per-lane element access (x[], num_elements) is
// deliberately absent: generated code must not depend on the unspecified fragment layout.
#pragma once
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_emu.h"
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K>
struct shape_of;
template <int M, int N, int K>
struct shape_of<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct shape_of<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct shape_of<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "only m16n16k16 is emulated");
  static constexpr int rows = shape_of<Use, M, N, K>::rows, cols = shape_of<Use, M, N, K>::cols;
  float value[rows * cols];
};

inline float to_float(__half v) { return __half2float(v); }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float to_float(float v) { return v; }

inline void check(const void* p, unsigned ldm, size_t elem) {
  so_emu::check_aligned(p, 32, "WMMA fragment");
  if ((ldm * elem) % 16 != 0) so_emu::fail("WMMA leading dimension %u is not a multiple of 16 bytes", ldm);
}

template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v) {
  for (float& x : f.value) x = v;
}

template <class Use, int M, int N, int K, class T, class Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  check(p, ldm, sizeof(T));
  so_emu::warp_rendezvous();
  constexpr bool row = std::is_same<Layout, row_major>::value;
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) f.value[r * F::cols + c] = to_float(row ? p[r * ldm + c] : p[c * ldm + r]);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  check(p, ldm, sizeof(float));
  so_emu::warp_rendezvous();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.value[r * 16 + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  check(p, ldm, sizeof(float));
  so_emu::warp_rendezvous();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.value[r * 16 + c];
}

template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float acc = c.value[m * 16 + n];
      for (int k = 0; k < 16; ++k) acc += a.value[m * 16 + k] * b.value[k * 16 + n];
      out[m * 16 + n] = acc;
    }
  for (int i = 0; i < 256; ++i) d.value[i] = out[i];
}

}  // namespace wmma
}  // namespace nvcuda
