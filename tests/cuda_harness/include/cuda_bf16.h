// Emulated cuda_bf16.h: bfloat16 as the upper 16 bits of a float, rounded to nearest even.
#pragma once
#include "cuda_emu.h"

struct __nv_bfloat16 {
  unsigned short bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  __nv_bfloat16 h;
  if (f != f) {
    h.bits = static_cast<unsigned short>((u >> 16) | 0x40);  // stay a (quiet) NaN
  } else {
    u += 0x7FFFu + ((u >> 16) & 1u);
    h.bits = static_cast<unsigned short>(u >> 16);
  }
  return h;
}
