"""Framework semantics on top of the program IR, shared by every importer.

PyTorch and ONNX say the same things in different words: a matmul that broadcasts over batch
dims, a linear layer, normalizations with a scale and a bias, attention. Each is written here once
in superopt's ops, so the same model imported from either format is the same program, down to its
canonical hash (the kernel cache key), and a fix to one lowering fixes both importers.

An importer raises `UnsupportedOp` for anything the IR cannot say, naming the op and where the
model wrote it; the builder raises `Unexpressible` (no location) and the importer adds one.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from superopt.dtypes import DTYPES
from superopt.limits import MAX_NAME_LENGTH, name_problem
from superopt.ops import Op
from superopt.program import Program, ProgramError, Tensor

Value = Tensor | float  # a program tensor, or a scalar constant not yet placed in the program


def _frozen(v: Any) -> Any:
    return tuple(v) if isinstance(v, list | tuple) else v


class UnsupportedOp(ProgramError):
    """A model op superopt cannot import: names the op, where the model's source wrote it, and
    why. A ProgramError, so the CLI answers it with exit 2 and the service with 422."""

    def __init__(self, op: str, where: str | None, reason: str) -> None:
        self.op, self.where, self.reason = op, where, reason
        super().__init__(f"unsupported op {op}" + (f" at {where}" if where else "") + f": {reason}")


class Unexpressible(ValueError):
    """What the builder cannot say in the IR; the importer turns it into an `UnsupportedOp`."""


H = TypeVar("H", bound=Callable[..., Any])


class OpTable(dict[str, H]):
    """An importer's lowering of each op, by the op's name in its format: filled by decorating each
    lowering with `handles`, so an op missing from the table is refused in the same words by all."""

    def handles(self, *names: str) -> Callable[[H], H]:
        def register(fn: H) -> H:
            for name in names:
                self[name] = fn
            return fn

        return register

    def handler(self, op: str, where: str | None) -> H:
        """The lowering of `op`; `UnsupportedOp` where the importer has none."""
        if op not in self:
            raise UnsupportedOp(op, where, "superopt has no such op (docs/models.md lists what is imported)")
        return self[op]


def valid_name(text: str, fallback: str = "t") -> str:
    """`text` where it is a valid program name or node id; else the same with every character
    outside the grammar replaced by '_', and a long name cut short with a digest of the whole,
    so that distinct module paths stay distinct."""
    if name_problem(text) is None:
        return text
    name = re.sub(r"[^A-Za-z0-9_.:-]", "_", text) or fallback
    if not (name[0].isalpha() or name[0] == "_"):
        name = "_" + name
    if len(name) > MAX_NAME_LENGTH:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        name = name[: MAX_NAME_LENGTH - 9] + "_" + digest
    return name


def shortest_float(value: float, dtype: str) -> float:
    """The shortest decimal that `value`, stored in `dtype`, rounds from: ONNX keeps epsilons and
    scalar constants in float32 (9.999999974752427e-07 for 1e-06), and this recovers what the
    model's author wrote, so an ONNX import and a PyTorch import of one model hash alike."""
    import numpy as np

    kind = {"f16": np.float16, "f32": np.float32}.get(dtype)
    if kind is None:  # bf16 has no numpy type; its constants are kept as stored
        return float(value)
    return float(str(kind(value)))  # numpy prints the shortest decimal that round-trips


class ModelBuilder:
    """A `Program` built with framework semantics. All inputs share one dtype (a program's rule)."""

    def __init__(self, name: str) -> None:
        self.program = Program(valid_name(name, "model"))
        self._made: dict[tuple[Any, ...], Tensor] = {}

    def op(self, op: str, *args: Value, **attrs: Any) -> Tensor:
        """`op` of `args`, made once: the same op of the same operands is the node made before
        (three projections of one input share its reshape), and so is the same constant."""
        operands = [a if isinstance(a, Tensor) else self._const(float(a)) for a in args]
        key = (op, tuple(t.id for t in operands), tuple(sorted((k, _frozen(v)) for k, v in attrs.items())))
        if key not in self._made:
            self._made[key] = self.program.op(op, *operands, **attrs)
        return self._made[key]

    def _const(self, value: float) -> Tensor:
        key = ("const", value.hex())
        if key not in self._made:
            self._made[key] = self.program.const(value)
        return self._made[key]

    # -- inputs --------------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str) -> Tensor:
        """A program input named after `name` (made valid and unique); a 0-d tensor is read as
        shape (1,) and reshaped, since program inputs have at least one dim."""
        if dtype not in DTYPES:
            raise Unexpressible(f"dtype {dtype}: superopt programs are {', '.join(DTYPES)}")
        nid = base = valid_name(name)
        n = 1
        while nid in self.program.nodes:
            n += 1
            nid = valid_name(f"{base}_{n}")
        t = self.program.input(nid, tuple(shape) or (1,), dtype)
        return self.reshape(t, ()) if not shape else t

    def finish(self, outputs: Sequence[Tensor]) -> Program:
        """The program computing `outputs`, without the nodes none of them reads (a sigmoid read
        as part of a silu, an exporter's unused branch), validated."""
        p = self.program
        for t in outputs:
            if t.id not in p.outputs:
                p.output(t)
        live = p._live()
        p.nodes = {nid: n for nid, n in p.nodes.items() if nid in live}
        return p.validate()

    # -- elementwise ---------------------------------------------------------------------------
    def binary(self, op: str, a: Value, b: Value) -> Value:
        """add/sub/mul/div with numpy broadcasting; two scalars fold to a scalar. The spellings
        exporters use for superopt's composites are read as the composites (their definitions
        in `superopt.primitives`, so nothing changes but the program's canonical form):
        x * sigmoid(x) is silu(x), 1 / sqrt(x) is rsqrt(x)."""
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            folded: dict[str, float] = {Op.ADD: a + b, Op.SUB: a - b, Op.MUL: a * b, Op.DIV: a / b}
            return folded[op]
        if op == Op.MUL and isinstance(a, Tensor) and isinstance(b, Tensor):
            for x, s in ((a, b), (b, a)):
                if s.node.op == Op.SIGMOID and s.node.inputs == (x.id,):
                    return self.op(Op.SILU, x)
        if op == Op.DIV and a == 1.0 and isinstance(b, Tensor) and b.node.op == Op.SQRT:
            return self.op(Op.RSQRT, Tensor(self.program, b.node.inputs[0]))
        return self.op(op, a, b)

    def unary(self, op: str, x: Value) -> Tensor:
        return self.op(op, self.tensor(x))

    def tensor(self, x: Value) -> Tensor:
        if not isinstance(x, Tensor):
            raise Unexpressible("an op of scalars only: the IR computes on tensors")
        return x

    def power(self, x: Value, exponent: float) -> Value:
        """x ** exponent for the exponents the IR has an op for."""
        t = self.tensor(x)
        if exponent == 1:
            return t
        if exponent == 2:
            return self.op("square", t)
        if exponent == 0.5:
            return self.op("sqrt", t)
        if exponent == -0.5:
            return self.op("rsqrt", t)
        if exponent == -1:
            return self.tensor(self.binary("div", 1.0, t))
        raise Unexpressible(f"pow with exponent {exponent}: the IR has square, sqrt, rsqrt and 1/x")

    # -- layout --------------------------------------------------------------------------------
    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(d) for d in shape)
        if x.shape == shape:
            return x
        if x.node.op == Op.RESHAPE:  # a reshape of a reshape reads the first one's operand
            return self.reshape(Tensor(self.program, x.node.inputs[0]), shape)
        return self.op("reshape", x, shape=list(shape))

    def transpose(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        perm = [p % len(x.shape) for p in perm] if x.shape else []
        return x if perm == list(range(len(perm))) else self.op("transpose", x, perm=perm)

    def swap_last(self, x: Tensor) -> Tensor:
        r = len(x.shape)
        return self.transpose(x, [*range(r - 2), r - 1, r - 2])

    # -- products ------------------------------------------------------------------------------
    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """numpy's matmul: vectors are promoted and their unit dim dropped; batch dims broadcast.
        The IR's matmul takes equal batch dims, so an operand broadcast over trailing batch dims
        is folded into the other's rows (a linear layer on (B, S, D) is one (B*S, D) product), or
        into its columns through transposes when the left operand is the broadcast one."""
        ra, rb = len(a.shape), len(b.shape)
        if ra == 0 or rb == 0:
            raise Unexpressible("matmul of a 0-d tensor")
        a2 = self.reshape(a, (1, *a.shape)) if ra == 1 else a
        b2 = self.reshape(b, (*b.shape, 1)) if rb == 1 else b
        out = self._batched(a2, b2)
        shape = out.shape
        if ra == 1:
            shape = (*shape[:-2], shape[-1])
        if rb == 1:
            shape = shape[:-1]
        return self.reshape(out, shape)

    def _batched(self, a: Tensor, b: Tensor) -> Tensor:
        (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
        if k != k2:
            raise Unexpressible(f"matmul inner dims differ: {a.shape} @ {b.shape}")
        rank = max(len(a.shape), len(b.shape)) - 2
        ba = (1,) * (rank - len(a.shape) + 2) + a.shape[:-2]
        bb = (1,) * (rank - len(b.shape) + 2) + b.shape[:-2]
        batch = []
        for i, (x, y) in enumerate(zip(ba, bb, strict=True)):
            if x != y and 1 not in (x, y):
                raise Unexpressible(f"matmul batch dims do not broadcast: {a.shape} @ {b.shape} (dim {i})")
            batch.append(max(x, y))
        if ba == bb:
            return self.op("matmul", self.reshape(a, (*ba, m, k)), self.reshape(b, (*bb, k, n)))
        # The first batch dim from which on `b` is broadcast (1) everywhere `a` is not.
        j = next((i for i in range(rank) if all(bb[t] == 1 for t in range(i, rank))), rank)
        if all(ba[i] == bb[i] for i in range(j)):
            rows = math.prod(ba[j:]) * m
            out = self.op("matmul", self.reshape(a, (*ba[:j], rows, k)), self.reshape(b, (*bb[:j], k, n)))
            return self.reshape(out, (*batch, m, n))
        j = next((i for i in range(rank) if all(ba[t] == 1 for t in range(i, rank))), rank)
        if all(ba[i] == bb[i] for i in range(j)):  # (A B)^T = B^T A^T, with A^T the broadcast one
            return self.swap_last(self._batched(self.swap_last(b), self.swap_last(a)))
        raise Unexpressible(f"matmul {a.shape} @ {b.shape} broadcasts both operands over their batch dims; the IR "
                            "cannot materialize a broadcast")

    def linear(self, x: Tensor, weight: Tensor, bias: Value | None) -> Tensor:
        """x @ weight^T + bias, weight stored (out, in) as PyTorch and ONNX's Gemm(transB=1) keep it."""
        y = self.matmul(x, self.swap_last(weight) if len(weight.shape) >= 2 else weight)
        return y if bias is None else self.tensor(self.binary("add", y, bias))

    # -- reductions and normalizations ---------------------------------------------------------
    def reduce(self, op: str, x: Tensor, dims: Sequence[int] | None, keepdim: bool) -> Tensor:
        """sum/mean/max over several dims, one dim at a time from the last (so the remaining dims
        keep their indices); no dims means all of them, as in both frameworks."""
        rank = len(x.shape)
        if rank == 0:
            raise Unexpressible(f"{op} of a 0-d tensor")
        todo = sorted({d % rank for d in (range(rank) if dims is None or len(dims) == 0 else dims)}, reverse=True)
        out = x
        for d in todo:
            out = self.op(op, out, dim=d, keepdim=keepdim)
        return out

    def _trailing(self, x: Tensor, axis: int) -> tuple[Tensor, tuple[int, ...]]:
        """`x` with its dims from `axis` on merged into one (the IR normalizes over one dim)."""
        axis %= len(x.shape)
        lead = x.shape[:axis]
        return self.reshape(x, (*lead, math.prod(x.shape[axis:]))), x.shape

    def rms_norm(self, x: Tensor, axis: int, weight: Value | None, eps: float) -> Tensor:
        """x / sqrt(mean(x^2 over dims axis..) + eps) * weight."""
        flat, shape = self._trailing(x, axis)
        y = self.reshape(self.op("rms_norm", flat, dim=-1, eps=eps), shape)
        return y if weight is None else self.tensor(self.binary("mul", y, weight))

    def layer_norm(self, x: Tensor, axis: int, weight: Value | None, bias: Value | None, eps: float) -> Tensor:
        """(x - mean) * rsqrt(var + eps) * weight + bias over dims axis.., the biased variance."""
        dims = list(range(axis % len(x.shape), len(x.shape)))
        centered = self.op("sub", x, self.reduce("mean", x, dims, True))
        var = self.reduce("mean", self.op("square", centered), dims, True)
        y: Value = self.op("mul", centered, self.op("rsqrt", self.op("add", var, eps)))
        if weight is not None:
            y = self.binary("mul", y, weight)
        if bias is not None:
            y = self.binary("add", y, bias)
        return self.tensor(y)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None) -> Tensor:
        """softmax(Q @ K^T * scale) @ V over (..., heads, seq, dim) tensors; K and V may have fewer
        heads than Q (grouped-query attention), each shared by a consecutive group of Q's heads:
        Q is then viewed as (..., kv_heads, group, seq, dim) and K, V broadcast over the group."""
        if len(q.shape) < 2 or len(q.shape) != len(k.shape) or len(k.shape) != len(v.shape):
            raise Unexpressible(f"attention operands of ranks {len(q.shape)}, {len(k.shape)}, {len(v.shape)}")
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        grouped = len(q.shape) >= 3 and q.shape[-3] != k.shape[-3]
        if grouped:
            h, hkv = q.shape[-3], k.shape[-3]
            if hkv == 0 or h % hkv or v.shape[-3] != hkv:
                raise Unexpressible(f"{h} query heads do not group over {hkv} key/value heads")
            lead = q.shape[:-3]
            q = self.reshape(q, (*lead, hkv, h // hkv, *q.shape[-2:]))
            k = self.reshape(k, (*lead, hkv, 1, *k.shape[-2:]))
            v = self.reshape(v, (*lead, hkv, 1, *v.shape[-2:]))
        scores = self.op("mul", self.matmul(q, self.swap_last(k)), scale)
        out = self.matmul(self.op("softmax", scores, dim=-1), v)
        return self.reshape(out, (*out.shape[:-4], out.shape[-4] * out.shape[-3], *out.shape[-2:])) if grouped else out
