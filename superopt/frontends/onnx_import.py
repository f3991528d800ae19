"""`import_onnx`: an ONNX model in, a superopt program out (`superopt import model.onnx`).

Graph inputs give the shapes and dtypes (static: a symbolic dim is refused); float initializers
with more than one element become program inputs named after them, while integer tensors (shapes,
axes) and one-element constants are folded, as are the shape computations exporters write
(Shape, Gather, Concat of constants). Every op is lowered through the same `ModelBuilder` as
PyTorch's, so a model exported to ONNX imports as the program PyTorch's import gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from superopt.frontends.builder import ModelBuilder, OpTable, Unexpressible, UnsupportedOp, Value, shortest_float
from superopt.ops import Op
from superopt.program import Program, ProgramError, Tensor
from superopt.sizes import SizeError

ELEM_TYPES: dict[int, str] = {onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.FLOAT16: "f16",
                              onnx.TensorProto.BFLOAT16: "bf16"}
NUMPY_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}


@dataclass(frozen=True)
class _Lazy:
    """A float tensor that becomes a program input when an op first reads it."""

    name: str
    shape: tuple[int, ...]
    dtype: str


Raw = Value | np.ndarray | _Lazy | None
Handler = Callable[["OnnxImporter", onnx.NodeProto, list[Any], dict[str, Any]], Any]
HANDLERS: OpTable[Handler] = OpTable()
handles = HANDLERS.handles


def import_onnx(model: str | Path | onnx.ModelProto, name: str | None = None) -> Program:
    """The program of an ONNX model (a path or a loaded ModelProto). Raises `UnsupportedOp` (a
    ProgramError) naming the first node superopt cannot say, and why."""
    if isinstance(model, onnx.ModelProto):
        return OnnxImporter(model, name or model.graph.name or "onnx_model", "").run()
    path = Path(model)
    try:  # onnx reads a .json or .textproto file as text: its parsers raise errors of their own
        proto = onnx.load(str(path))
    except (OSError, DecodeError, ValueError, json_format.Error, text_format.Error) as e:
        raise ProgramError(f"{path}: not a readable ONNX model: {str(e).splitlines()[0]}") from None
    if not proto.graph.output:
        raise ProgramError(f"{path}: not a readable ONNX model: its graph has no outputs")
    try:
        return OnnxImporter(proto, name or path.stem, str(path)).run()
    except UnsupportedOp:
        raise
    except ProgramError as e:
        raise ProgramError(f"{path}: {e}") from None


class OnnxImporter:
    """Walks an ONNX graph in order (ONNX requires topological order); `origin` (the file) is
    named in errors."""

    def __init__(self, model: onnx.ModelProto, name: str, origin: str) -> None:
        self.model = model
        self.origin = origin
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.b = ModelBuilder(name)
        self.values: dict[str, Raw] = {}

    def run(self) -> Program:
        g = self.model.graph
        for init in g.initializer:
            self.values[init.name] = self._constant(init.name, numpy_helper.to_array(init))
        for inp in g.input:
            if inp.name not in self.values:
                self.values[inp.name] = self._graph_input(inp)
        for i, node in enumerate(g.node):
            self._node(node, i)
        outputs = []
        for out in g.output:
            v = self._read(out.name, None)
            if not isinstance(v, Tensor) or v.node.op in ("input", Op.CONST):
                raise ProgramError(f"output {out.name!r} is not computed by the model (an input or a constant); "
                                   "superopt programs compute their outputs")
            outputs.append(v)
        return self.b.finish(outputs)

    # -- values ------------------------------------------------------------------------------------
    def _graph_input(self, inp: onnx.ValueInfoProto) -> _Lazy:
        t = inp.type.tensor_type
        if t.elem_type not in ELEM_TYPES:
            kind = onnx.TensorProto.DataType.Name(t.elem_type)
            raise ProgramError(f"input {inp.name!r}: element type {kind}; superopt programs are "
                               f"{', '.join(ELEM_TYPES.values())}")
        dims = []
        for d in t.shape.dim:
            if not d.HasField("dim_value"):
                raise ProgramError(f"input {inp.name!r}: dim {d.dim_param or '?'} is symbolic; superopt programs have "
                                   "static shapes (export with fixed sizes)")
            dims.append(d.dim_value)
        return _Lazy(inp.name, tuple(dims), ELEM_TYPES[t.elem_type])

    def _constant(self, name: str, array: np.ndarray) -> np.ndarray | _Lazy:
        """Integer tensors and one-element floats stay constants; other floats are inputs-to-be."""
        if array.dtype.kind == "f" and array.size > 1:
            if array.dtype not in NUMPY_DTYPES and array.dtype != np.dtype("float64"):
                raise ProgramError(f"initializer {name!r}: dtype {array.dtype}; superopt programs are f16, bf16, f32")
            return _Lazy(name, tuple(array.shape), NUMPY_DTYPES.get(array.dtype, "f32"))
        return array

    def _read(self, name: str, node: onnx.NodeProto | None) -> Raw:
        if name == "":
            return None
        if name not in self.values:
            where = f"node {node.name!r} ({node.op_type})" if node is not None else "the graph outputs"
            raise ProgramError(f"{where}: value {name!r} is not defined")
        v = self.values[name]
        if isinstance(v, _Unavailable):
            v.fail()
        if isinstance(v, _Lazy):
            v = self.values[name] = self.b.input(v.name, v.shape, v.dtype)
        return v

    # -- nodes ---------------------------------------------------------------------------------------
    def _node(self, node: onnx.NodeProto, index: int) -> None:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        where = (f"{self.origin}: " if self.origin else "") + f"node {node.name or f'#{index}'!r}"
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        try:
            if op == "Constant":
                self.values[node.output[0]] = self._constant(node.output[0], _constant_value(attrs))
                return
            inputs = [self._read_raw(n) for n in node.input]
            folded = _fold(op, inputs, attrs)
            if folded is not None:
                self.values[node.output[0]] = folded
                return
            handler = HANDLERS.handler(op, where)
            inputs = [self._read(n, node) for n in node.input]
            out = handler(self, node, inputs, attrs)
        except (Unexpressible, SizeError) as e:
            raise UnsupportedOp(op, where, str(e)) from None
        except ProgramError as e:
            if isinstance(e, UnsupportedOp):
                raise
            raise UnsupportedOp(op, where, str(e)) from None
        outs = out if isinstance(out, tuple) else (out,)
        for i, name in enumerate(node.output):
            if name and i >= len(outs):
                self.values[name] = _Unavailable(op, where, i)  # type: ignore[assignment]
            elif name:
                self.values[name] = outs[i]

    def _read_raw(self, name: str) -> Raw:
        """A value for constant folding: constants as they are, anything else unread."""
        v = self.values.get(name)
        if isinstance(v, _Unavailable):
            v.fail()
        return v

    # -- helpers for handlers ------------------------------------------------------------------
    def tensor(self, v: Raw) -> Tensor:
        if isinstance(v, Tensor):
            return v
        raise Unexpressible(f"expected a tensor operand, got {'nothing' if v is None else type(v).__name__}")

    def operand(self, v: Raw, other: Raw = None) -> Value:
        """A tensor, or a one-element constant as a scalar (its float32 or float16 storage read back
        as the decimal it was written as). The scalar must not raise the other operand's rank."""
        if isinstance(v, Tensor):
            return v
        if isinstance(v, np.ndarray) and v.size == 1:
            rank = len(other.shape) if isinstance(other, Tensor) else 0
            if v.ndim > rank:
                raise Unexpressible(f"a constant of shape {v.shape} broadcasts a rank-{rank} tensor to rank {v.ndim}")
            value = float(v.reshape(()))
            return shortest_float(value, NUMPY_DTYPES.get(v.dtype, "")) if v.dtype.kind == "f" else value
        raise Unexpressible(f"expected a tensor or a one-element constant, got {type(v).__name__}")

    def ints(self, v: Raw, what: str) -> list[int]:
        if not isinstance(v, np.ndarray) or v.dtype.kind not in "iu":
            raise Unexpressible(f"{what} must be a constant integer tensor")
        return [int(i) for i in v.reshape(-1)]


class _Unavailable:
    """An output of a node that superopt does not compute (LayerNormalization's mean, ...)."""

    def __init__(self, op: str, where: str, index: int) -> None:
        self.op, self.where, self.index = op, where, index

    def fail(self) -> None:
        raise UnsupportedOp(self.op, self.where,
                            f"its output {self.index} is used, and superopt computes only its first")


def _constant_value(attrs: dict[str, Any]) -> np.ndarray:
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise Unexpressible(f"a Constant of {sorted(attrs)} (superopt reads value, value_float(s), value_int(s))")


# -- constant folding: shape arithmetic on integer and one-element constants ------------------------

_FOLD: dict[str, Callable[[list[Any], dict[str, Any]], np.ndarray]] = {
    "Identity": lambda x, a: x[0],
    "Cast": lambda x, a: x[0].astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"])),
    "Concat": lambda x, a: np.concatenate([np.atleast_1d(v) for v in x], axis=a["axis"]),
    "Reshape": lambda x, a: x[0].reshape([d if d != 0 else x[0].shape[i] for i, d in enumerate(x[1].tolist())]),
    "Unsqueeze": lambda x, a: np.expand_dims(x[0], tuple(a["axes"] if "axes" in a else x[1].tolist())),
    "Squeeze": lambda x, a: np.squeeze(x[0], tuple(a.get("axes", x[1].tolist() if len(x) > 1 else [])) or None),
    "Gather": lambda x, a: np.take(x[0], x[1], axis=a.get("axis", 0)),
    "Add": lambda x, a: x[0] + x[1],
    "Sub": lambda x, a: x[0] - x[1],
    "Mul": lambda x, a: x[0] * x[1],
    "Div": lambda x, a: x[0] / x[1] if x[0].dtype.kind == "f" else x[0] // x[1],
    "Sqrt": lambda x, a: np.sqrt(x[0]),
    "Reciprocal": lambda x, a: 1 / x[0],
    "Neg": lambda x, a: -x[0],
}


def _fold(op: str, inputs: Sequence[Raw], attrs: dict[str, Any]) -> np.ndarray | None:
    """The op's value when it is shape arithmetic on constants (Shape of anything with a shape,
    or a foldable op of integer and one-element constants); None when it computes on tensors."""
    if op == "Shape" and inputs and isinstance(inputs[0], Tensor | _Lazy | np.ndarray):
        shape = np.asarray(inputs[0].shape, dtype=np.int64)
        return shape[attrs.get("start", 0): attrs.get("end", len(shape))]
    given = [v for v in inputs if v is not None]
    if op not in _FOLD or not given or not all(isinstance(v, np.ndarray) for v in given):
        return None
    return np.asarray(_FOLD[op](given, attrs))


# -- ops ---------------------------------------------------------------------------------------------


@handles("Add", "Sub", "Mul", "Div")
def _binary(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    return im.b.binary(node.op_type.lower(), im.operand(x[0], x[1]), im.operand(x[1], x[0]))


@handles("Neg", "Exp", "Sqrt", "Relu", "Sigmoid")
def _unary(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    return im.b.unary(node.op_type.lower(), im.tensor(x[0]))


@handles("Reciprocal")
def _reciprocal(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    return im.b.power(im.tensor(x[0]), -1)


@handles("Pow")
def _pow(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    exponent = im.operand(x[1])
    if isinstance(exponent, Tensor):
        raise Unexpressible("Pow with a tensor exponent: the IR raises tensors to the constant powers 2, 1/2, -1/2, -1")
    return im.b.power(im.tensor(x[0]), exponent)


@handles("Gelu")
def _gelu(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    approximate = a.get("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate != "tanh":
        raise Unexpressible(f"Gelu(approximate={approximate!r}) is the erf form; superopt's gelu is the tanh "
                            "approximation")
    return im.b.unary("gelu", im.tensor(x[0]))


@handles("Identity", "Dropout")
def _identity(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    if node.op_type == "Dropout" and len(x) > 2 and isinstance(x[2], np.ndarray) and bool(x[2]):
        raise Unexpressible("Dropout in training mode")
    return im.tensor(x[0])


@handles("Cast")
def _cast(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t = im.tensor(x[0])
    if ELEM_TYPES.get(a["to"]) != t.dtype:
        raise Unexpressible(f"casts {t.dtype} to {onnx.TensorProto.DataType.Name(a['to'])}; a program computes in "
                            "one dtype")
    return t


@handles("Expand")
def _expand(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    raise Unexpressible("Expand materializes a broadcast, and the IR has no op that does (exporters write one to "
                        "repeat K/V heads in grouped-query attention before opset 23: export with opset_version=23, "
                        "which keeps Attention)")


@handles("MatMul")
def _matmul(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    return im.b.matmul(im.tensor(x[0]), im.tensor(x[1]))


@handles("Gemm")
def _gemm(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    """alpha * A' @ B' + beta * C, written product first as PyTorch's linear and addmm are."""
    lhs, rhs = im.tensor(x[0]), im.tensor(x[1])
    lhs = im.b.swap_last(lhs) if a.get("transA", 0) else lhs
    rhs = im.b.swap_last(rhs) if a.get("transB", 0) else rhs
    y: Value = im.b.matmul(lhs, rhs)
    if a.get("alpha", 1.0) != 1.0:
        y = im.b.binary("mul", y, shortest_float(a["alpha"], "f32"))
    if len(x) > 2 and x[2] is not None:
        c = im.operand(x[2], y)
        if a.get("beta", 1.0) != 1.0:
            c = im.b.binary("mul", c, shortest_float(a["beta"], "f32"))
        y = im.b.binary("add", y, c)
    return y


def _axes(im: OnnxImporter, x: list[Any], a: dict[str, Any]) -> list[int] | None:
    if "axes" in a:
        return [int(i) for i in a["axes"]]
    return im.ints(x[1], "axes") if len(x) > 1 and x[1] is not None else None


@handles("ReduceSum", "ReduceMean", "ReduceMax")
def _reduce(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t, axes = im.tensor(x[0]), _axes(im, x, a)
    if not axes and a.get("noop_with_empty_axes", 0):
        return t
    op = {"ReduceSum": Op.SUM, "ReduceMean": Op.MEAN, "ReduceMax": Op.MAX}[node.op_type]
    return im.b.reduce(op, t, axes, bool(a.get("keepdims", 1)))


@handles("Softmax")
def _softmax(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t = im.tensor(x[0])
    axis = a.get("axis", -1 if im.opset >= 13 else 1) % len(t.shape)
    if im.opset < 13 and axis != len(t.shape) - 1:
        raise Unexpressible(f"Softmax before opset 13 normalizes over the dims from axis {axis} on, together")
    return im.b.op("softmax", t, dim=axis)


@handles("Transpose")
def _transpose(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t = im.tensor(x[0])
    return im.b.transpose(t, a.get("perm", list(reversed(range(len(t.shape))))))


@handles("Reshape")
def _reshape(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t = im.tensor(x[0])
    shape = im.ints(x[1], "the shape")
    if not a.get("allowzero", 0):
        shape = [t.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(t.shape)) // max(known, 1)
    return im.b.reshape(t, shape)


@handles("Unsqueeze", "Squeeze", "Flatten")
def _view(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t = im.tensor(x[0])
    rank = len(t.shape)
    if node.op_type == "Flatten":
        axis = a.get("axis", 1) % (rank + 1) if rank else 0
        return im.b.reshape(t, (int(np.prod(t.shape[:axis])), int(np.prod(t.shape[axis:]))))
    axes = _axes(im, x, a)
    if node.op_type == "Unsqueeze":
        shape = list(t.shape)
        for ax in sorted(i % (rank + len(axes or [])) for i in axes or []):
            shape.insert(ax, 1)
        return im.b.reshape(t, shape)
    drop = {i % rank for i in axes} if axes else {i for i, d in enumerate(t.shape) if d == 1}
    return im.b.reshape(t, [d for i, d in enumerate(t.shape) if i not in drop])


@handles("LayerNormalization")
def _layer_norm(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t = im.tensor(x[0])
    bias = im.operand(x[2], t) if len(x) > 2 and x[2] is not None else None
    eps = shortest_float(a.get("epsilon", 1e-5), "f32")
    return im.b.layer_norm(t, a.get("axis", -1), im.operand(x[1], t), bias, eps)


@handles("RMSNormalization")
def _rms_norm(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    t = im.tensor(x[0])
    return im.b.rms_norm(t, a.get("axis", -1), im.operand(x[1], t), shortest_float(a.get("epsilon", 1e-5), "f32"))


@handles("Attention")
def _attention(im: OnnxImporter, node: onnx.NodeProto, x: list[Any], a: dict[str, Any]) -> Value:
    q, k, v = (im.tensor(t) for t in x[:3])
    if any(t is not None for t in x[3:]):
        raise Unexpressible("Attention with a mask or a KV cache: the IR has no masked softmax")
    if a.get("is_causal", 0):
        raise Unexpressible("causal Attention needs a mask, and the IR has no masked softmax")
    if a.get("softcap", 0.0) or a.get("qk_matmul_output_mode", 0):
        raise Unexpressible("Attention with softcap or a qk_matmul_output_mode")
    if len(q.shape) != 4:
        raise Unexpressible("Attention on 3-D (batch, seq, heads*dim) tensors; superopt imports the 4-D form")
    scale = shortest_float(a["scale"], "f32") if "scale" in a else None
    return im.b.attention(q, k, v, scale)
