"""The C++ vocabulary shared by every generated kernel: element types, device helpers, op formulas.

The scalar formulas here are the device spelling of `superopt.primitives` (gelu as
x * sigmoid(k (x + c x^3)), silu as x * sigmoid(x), rsqrt as 1 / sqrt(x), ...), so generated code
computes what the interpreter and the verifier mean. The float helpers are also the preamble of
the runtime's CuPy library kernels.
"""

from __future__ import annotations

import re

from superopt import ops
from superopt.ops import Op
from superopt.primitives import GELU_C, GELU_K

C_TYPE = {"f16": "__half", "bf16": "__nv_bfloat16", "f32": "float"}
NEG_FLT_MAX = "-3.402823466e+38f"


def float_literal(value: float) -> str:
    """A float constant as C source: the shortest decimal of the Python float, read as a float."""
    return f"{float(value)!r}f"


# Float-only helpers (name -> definition, helpers it calls). Valid in generated kernels and in
# CuPy elementwise kernels alike. Not `static`: an unused one is then no compiler warning.
_FLOAT_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "so_sigmoid": ("__device__ __forceinline__ float so_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }", ()),
    "so_silu": ("__device__ __forceinline__ float so_silu(float x) { return x * so_sigmoid(x); }", ("so_sigmoid",)),
    "so_gelu": (
        "__device__ __forceinline__ float so_gelu(float x) {\n"
        f"  return x * so_sigmoid({float_literal(GELU_K)} * (x + {float_literal(GELU_C)} * (x * (x * x))));\n}}",
        ("so_sigmoid",),
    ),
    "so_square": ("__device__ __forceinline__ float so_square(float x) { return x * x; }", ()),
    "so_rsqrt": ("__device__ __forceinline__ float so_rsqrt(float x) { return 1.0f / sqrtf(x); }", ()),
    "so_relu": ("__device__ __forceinline__ float so_relu(float x) { return x < 0.0f ? 0.0f : x; }", ()),
    # max that keeps a NaN (a poisoned or unwritten value must never disappear in a reduction)
    "so_max": ("__device__ __forceinline__ float so_max(float a, float b) { return (a != a || a > b) ? a : b; }",
               ()),
    "so_group_sum": (
        "// sum over a group of LANES consecutive lanes of a warp (the whole warp calls it)\n"
        "template <int LANES> __device__ __forceinline__ float so_group_sum(float v) {\n"
        "  for (int m = LANES / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);\n"
        "  return v;\n}",
        (),
    ),
    "so_group_max": (
        "template <int LANES> __device__ __forceinline__ float so_group_max(float v) {\n"
        "  for (int m = LANES / 2; m > 0; m /= 2) v = so_max(v, __shfl_xor_sync(0xffffffffu, v, m));\n"
        "  return v;\n}",
        ("so_max",),
    ),
}
_SCALAR = ("so_sigmoid", "so_silu", "so_gelu", "so_square", "so_rsqrt", "so_relu", "so_max")
FLOAT_HELPERS = "\n".join(_FLOAT_HELPERS[h][0] for h in _SCALAR) + "\n"


def helpers_used(code: str) -> list[str]:
    """The helpers `code` calls, with the helpers they call, in definition order."""
    want = {h for h in _FLOAT_HELPERS if re.search(rf"\b{h}\b", code)}
    todo = list(want)
    while todo:
        for dep in _FLOAT_HELPERS[todo.pop()][1]:
            if dep not in want:
                want.add(dep)
                todo.append(dep)
    return [h for h in _FLOAT_HELPERS if h in want]

UNARY: dict[str, str] = {  # keyed by Op, read by any name (as BINARY)
    Op.NEG: "(-{0})",
    Op.EXP: "expf({0})",
    Op.SQRT: "sqrtf({0})",
    Op.RSQRT: "so_rsqrt({0})",
    Op.SQUARE: "so_square({0})",
    Op.SIGMOID: "so_sigmoid({0})",
    Op.SILU: "so_silu({0})",
    Op.GELU: "so_gelu({0})",
    Op.RELU: "so_relu({0})",
}
BINARY: dict[str, str] = {Op.ADD: "({0} + {1})", Op.SUB: "({0} - {1})", Op.MUL: "({0} * {1})", Op.DIV: "({0} / {1})"}
assert set(UNARY) == set(ops.UNARY) and set(BINARY) == set(ops.BINARY), "a formula for every elementwise op"


def formula(op: str, args: list[str]) -> str:
    """The C float expression of an elementwise op applied to argument expressions."""
    table = UNARY if op in UNARY else BINARY
    return table[op].format(*args)


def prelude(dtypes: set[str], wmma: bool, code: str) -> str:
    """Includes and the device helpers that `code` (the kernels) uses, for tiles of `dtypes`."""
    lines = ["#include <cuda_fp16.h>"]
    if "bf16" in dtypes:
        lines.append("#include <cuda_bf16.h>")
    if wmma:
        lines.append("#include <mma.h>")
    lines += [
        "",
        "// ---- superopt device helpers: loads/stores convert through float",
        "__device__ __forceinline__ float so_f(float v) { return v; }",
        "__device__ __forceinline__ float so_f(__half v) { return __half2float(v); }",
        "__device__ __forceinline__ void so_st(float* p, float v) { *p = v; }",
        "__device__ __forceinline__ void so_st(__half* p, float v) { *p = __float2half_rn(v); }",
    ]
    if "bf16" in dtypes:
        lines += [
            "__device__ __forceinline__ float so_f(__nv_bfloat16 v) { return __bfloat162float(v); }",
            "__device__ __forceinline__ void so_st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }",
        ]
    lines += [_FLOAT_HELPERS[h][0] for h in helpers_used(code)]
    return "\n".join(lines) + "\n"
