"""Pre-defined (library) kernels on the GPU: one program op on whole device tensors via CuPy.

matmul is cuBLAS (`cupy.matmul`, fp32 accumulation); every other op is one CuPy elementwise or
reduction kernel that computes in float32 with the formulas of `superopt.primitives` (shared
with generated code through `superopt.codegen.prelude`) and rounds once to the tensor's dtype,
which is what the interpreter means by a library kernel. Results go into preallocated outputs, so
a timed run allocates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from superopt import ops
from superopt.codegen import LibraryCall
from superopt.codegen.prelude import FLOAT_HELPERS, NEG_FLT_MAX, formula
from superopt.ops import Op, normalize_dim


class LibraryOps:
    """Runs `LibraryCall`s with CuPy; kernels are built on first use and reused."""

    def __init__(self, cp: ModuleType) -> None:
        self.cp = cp
        self._kernels: dict[str, Any] = {}

    def _kernel(self, key: str, make: Any) -> Any:
        if key not in self._kernels:
            self._kernels[key] = make()
        return self._kernels[key]

    def _elementwise(self, key: str, params: str, body: str) -> Any:
        return self._kernel(key, lambda: self.cp.ElementwiseKernel(
            params, "T y", body, f"superopt_{key}", preamble=FLOAT_HELPERS))

    def _reduction(self, key: str, params: str, out: str, map_expr: str, reduce_expr: str, post: str,
                   identity: str) -> Any:
        return self._kernel(key, lambda: self.cp.ReductionKernel(
            params, out, map_expr, reduce_expr, post, identity, f"superopt_{key}", reduce_type="float",
            preamble=FLOAT_HELPERS))

    def __call__(self, call: LibraryCall, args: Sequence[Any], out: Any) -> None:
        cp, op, a = self.cp, call.op, call.attrs
        dim = normalize_dim(a["dim"], args[0].ndim) if "dim" in a else None
        if op == Op.MATMUL:
            cp.matmul(args[0], args[1], out=out)
        elif op in ops.UNARY:
            self._elementwise(op, "T x", f"y = (T)({formula(op, ['(float)x'])});")(args[0], out)
        elif op in ops.BINARY:
            self._elementwise(op, "T a, T b", f"y = (T)({formula(op, ['(float)a', '(float)b'])});")(
                args[0], args[1], out)
        elif op in ops.REDUCE:
            self._reduce(op)(args[0], out=out, axis=dim, keepdims=a["keepdim"])
        elif op == Op.RMS_NORM:
            msq = self._reduction("mean_square", "T x", "float32 y", "(float)x * (float)x", "a + b",
                                  "y = a / (float)(_in_ind.size() / _out_ind.size())", "0")
            ms = msq(args[0], axis=dim, keepdims=True)
            self._elementwise("rms_apply", "T x, float32 ms, float32 eps", "y = (T)((float)x / sqrtf(ms + eps));")(
                args[0], ms, a["eps"], out)
        elif op == Op.SOFTMAX:
            mx = self._reduction("row_max", "T x", "float32 y", "(float)x", "so_max(a, b)", "y = a",
                                 NEG_FLT_MAX)(args[0], axis=dim, keepdims=True)
            e = cp.empty(args[0].shape, dtype=cp.float32)
            self._kernel("exp_shift", lambda: cp.ElementwiseKernel(
                "T x, float32 m", "float32 e", "e = expf((float)x - m);", "superopt_exp_shift"))(args[0], mx, e)
            se = cp.sum(e, axis=dim, keepdims=True)
            self._kernel("div_to", lambda: cp.ElementwiseKernel(
                "float32 e, float32 s", "T y", "y = (T)(e / s);", "superopt_div_to"))(e, se, out)
        elif op == Op.CONST:
            out.fill(a["value"])
        elif op == Op.TRANSPOSE:
            cp.copyto(out, args[0].transpose(a["perm"]))
        elif op == Op.RESHAPE:
            cp.copyto(out, args[0].reshape(out.shape))
        else:
            raise ValueError(f"no GPU library implementation of op {op!r}")

    def _reduce(self, op: str) -> Any:
        if op == Op.MAX:
            return self._reduction(op, "T x", "T y", "(float)x", "so_max(a, b)", "y = (T)(a)", NEG_FLT_MAX)
        post = "y = (T)(a / (float)(_in_ind.size() / _out_ind.size()))" if op == Op.MEAN else "y = (T)(a)"
        return self._reduction(op, "T x", "T y", "(float)x", "a + b", post, "0")
