// Emulated cuda_fp16.h: IEEE half through the host compiler's _Float16 (round to nearest even).
#pragma once
#include "cuda_emu.h"

struct __half {
  unsigned short bits;
};

inline float __half2float(__half h) {
  _Float16 v;
  memcpy(&v, &h.bits, 2);
  return static_cast<float>(v);
}

inline __half __float2half_rn(float f) {
  _Float16 v = static_cast<_Float16>(f);
  __half h;
  memcpy(&h.bits, &v, 2);
  return h;
}
