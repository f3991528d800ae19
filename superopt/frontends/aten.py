"""ATen FX graphs (what `torch.export` and AOTAutograd produce) translated into programs.

One translator serves `from_torch` (an exported module) and the `torch.compile` backend (regions
of an AOTAutograd graph). Every node's result is checked against the shape PyTorch recorded for
it (`node.meta["val"]`), so a lowering that disagrees with PyTorch fails at import, naming the op,
rather than computing something else. Shapes come from the graph, never from running it.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from superopt.frontends.builder import ModelBuilder, OpTable, Unexpressible, UnsupportedOp, Value
from superopt.ops import Op
from superopt.program import ProgramError, Tensor
from superopt.sizes import SizeError

DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}

Handler = Callable[["AtenTranslator", dict[str, Any], fx.Node], Any]
HANDLERS: OpTable[Handler] = OpTable()
handles = HANDLERS.handles


def op_name(node: fx.Node) -> str:
    """'aten.linear' for an ATen op (its overload dropped), the function's name otherwise."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target.overloadpacket.__name__}"
    return getattr(target, "__name__", str(target))


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n[ \t]*([^\n]*)')
_LIBRARIES = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))


def source_line(node: fx.Node) -> str | None:
    """The user's file:line (and its code) that made `node`: the innermost frame of its recorded
    stack trace outside PyTorch and superopt (a layer's own forward is PyTorch's, the call
    `self.norm(x)` is the user's)."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    user = [f for f in frames if not f[0].startswith(_LIBRARIES)] or frames
    if not user:
        return None
    path, line, code = user[-1]
    return f"{path}:{line} ({code.strip()})" if code.strip() else f"{path}:{line}"


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in DTYPES:
        raise Unexpressible(f"dtype {dtype}: superopt programs compute {', '.join(DTYPES.values())}")
    return DTYPES[dtype]


def tensor_meta(node: fx.Node) -> torch.Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unexpressible(f"{node.name} is not a tensor ({type(val).__name__})")
    return val


class AtenTranslator:
    """Builds a program from ATen FX nodes. Placeholders become inputs when first used (so an
    unused parameter is not an input); `names` renames them (a parameter's placeholder to its
    module path), `scalars` gives the placeholders that hold one-element constants. With
    `operands_as_inputs`, any operand not yet translated is an input too (one op imported alone)."""

    def __init__(self, builder: ModelBuilder, names: Mapping[str, str] | None = None,
                 scalars: Mapping[str, float] | None = None, operands_as_inputs: bool = False) -> None:
        self.b = builder
        self.operands_as_inputs = operands_as_inputs
        self.names = dict(names or {})
        self.scalars = dict(scalars or {})
        self.values: dict[str, Any] = {}
        self.broadcast: dict[str, fx.Node] = {}  # values still of their expand's operand shape
        self.inputs: dict[str, str] = {}  # placeholder name -> program input id

    # -- whole graphs ----------------------------------------------------------------------------
    def graph(self, graph: fx.Graph) -> list[Value]:
        """Translate every computing node; return the values of the graph's outputs."""
        outputs: list[Value] = []
        for node in graph.nodes:
            if node.op == "call_function":
                self.node(node)
            elif node.op == "output":
                outputs = [self.value(n, node) for n in _flat(node.args[0])]
            elif node.op not in ("placeholder", "get_attr"):
                raise UnsupportedOp(node.op, source_line(node), f"FX {node.op} nodes are not imported")
        return outputs

    def value(self, node: Any, user: fx.Node) -> Any:
        """The value of an FX argument of `user` (inputs made on first use, scalars as they are)."""
        if isinstance(node, list | tuple):
            return type(node)(self.value(n, user) for n in node)
        if not isinstance(node, fx.Node):
            return node
        if node.name not in self.values:
            if node.op not in ("placeholder", "get_attr") and not self.operands_as_inputs:
                raise UnsupportedOp(op_name(user), source_line(user), f"operand {node.name} was not imported")
            self.values[node.name] = self._leaf(node, user)
        if node.name in self.broadcast and op_name(user) not in BROADCASTING:
            origin = self.broadcast[node.name]
            raise UnsupportedOp(op_name(origin), source_line(origin),
                                f"its result reaches {op_name(user)}, which needs the broadcast materialized, and "
                                "the IR has no op that materializes one")
        return self.values[node.name]

    def _leaf(self, node: fx.Node, user: fx.Node) -> Value:
        if node.name in self.scalars:
            return self.scalars[node.name]
        meta = node.meta.get("val")
        if not isinstance(meta, torch.Tensor):
            raise UnsupportedOp(op_name(user), source_line(user), f"operand {node.name} is not a tensor")
        try:
            t = self.b.input(self.names.get(node.name, node.name), tuple(meta.shape), dtype_name(meta.dtype))
        except (Unexpressible, ProgramError) as e:
            raise UnsupportedOp(op_name(user), source_line(user), f"operand {node.name}: {e}") from None
        self.inputs[node.name] = t.node.inputs[0] if t.node.op == Op.RESHAPE else t.id
        return t

    # -- one node ------------------------------------------------------------------------------
    def node(self, node: fx.Node) -> None:
        name, where = op_name(node), source_line(node)
        if node.target is operator.getitem:
            self.values[node.name] = self._item(node)
            return
        if name in CHECKS_ONLY:
            return
        handler = HANDLERS.handler(name, where)
        try:
            out = handler(self, self._arguments(node), node)
            self._check(node, out)
        except (Unexpressible, ProgramError, SizeError) as e:
            if isinstance(e, UnsupportedOp):
                raise
            raise UnsupportedOp(name, where, str(e)) from None
        self.values[node.name] = out

    def _arguments(self, node: fx.Node) -> dict[str, Any]:
        """The op's arguments by their schema names, defaults filled in, FX nodes as values."""
        schema = node.target._schema  # type: ignore[union-attr]
        args: dict[str, Any] = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args) and not a.kwarg_only:
                raw = node.args[i]
            elif a.name in node.kwargs:
                raw = node.kwargs[a.name]
            elif a.has_default_value():
                raw = a.default_value
            else:
                raw = None
            args[a.name] = self.value(raw, node)
        return args

    def _item(self, node: fx.Node) -> Any:
        source, index = node.args
        values = self.value(source, node)
        item = values[index] if isinstance(values, tuple) and isinstance(index, int) else None
        if item is None:
            producer = op_name(source) if isinstance(source, fx.Node) else "?"
            raise UnsupportedOp(producer, source_line(node),
                                f"output {index} of {producer} is used, and superopt computes only its first")
        return item

    def _check(self, node: fx.Node, out: Any) -> None:
        """`out` has the shape and dtype PyTorch recorded (an expand's may still broadcast to it)."""
        if isinstance(out, tuple):
            return
        meta = tensor_meta(node)
        shape = tuple(meta.shape)
        if not isinstance(out, Tensor):
            raise UnsupportedOp(op_name(node), source_line(node), "computes a scalar; the IR computes tensors")
        if out.dtype is not None and out.dtype != DTYPES.get(meta.dtype):
            raise UnsupportedOp(op_name(node), source_line(node), f"computes {meta.dtype}; the program is {out.dtype}")
        if out.shape != shape:
            pending = [self.broadcast[n.name] for n in node.all_input_nodes if n.name in self.broadcast]
            if (op_name(node) == "aten.expand" or pending) and _broadcasts(out.shape, shape):
                self.broadcast[node.name] = pending[0] if pending else node
                return
            raise UnsupportedOp(op_name(node), source_line(node),
                                f"imported with shape {out.shape}, PyTorch computes {shape}")


# Ops that only check what torch.export saw (a cast to the dtype a tensor has): they compute nothing.
CHECKS_ONLY = frozenset({"aten._assert_tensor_metadata"})

# Ops whose operands may still be of an expand's operand shape: they broadcast as numpy does.
BROADCASTING = {"aten.add", "aten.sub", "aten.mul", "aten.div", "aten.rsub", "aten.matmul", "aten.expand",
                 "aten.clone", "aten.contiguous", "aten.alias", "aten.detach"}


def _broadcasts(shape: Sequence[int], target: Sequence[int]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False))


def _flat(args: Any) -> Iterable[Any]:
    if isinstance(args, list | tuple):
        for a in args:
            yield from _flat(a)
    else:
        yield args


TRAINING_DROPOUT = "dropout in training mode (call model.eval() first)"


def _refuse(cond: bool, reason: str) -> None:
    if cond:
        raise Unexpressible(reason)


def _out_shape(node: fx.Node) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor_meta(node).shape)


def _same_dtype(node: fx.Node, dtype: Any) -> None:
    _refuse((dtype is not None and dtype != tensor_meta(node).dtype) or
            any(isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dtype != tensor_meta(node).dtype
                for n in node.all_input_nodes),
            "changes the dtype; a program computes in one dtype")


# -- elementwise -------------------------------------------------------------------------------


@handles("aten.add", "aten.sub")
def _add_sub(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    other = a["other"] if a["alpha"] == 1 else t.b.binary("mul", a["other"], float(a["alpha"]))
    return t.b.binary(node.target.overloadpacket.__name__, a["self"], other)  # type: ignore[union-attr]


@handles("aten.rsub")
def _rsub(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    scaled = a["self"] if a["alpha"] == 1 else t.b.binary("mul", a["self"], float(a["alpha"]))
    return t.b.binary("sub", a["other"], scaled)


@handles("aten.mul")
def _mul(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    return t.b.binary("mul", a["self"], a["other"])


@handles("aten.div")
def _div(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    _refuse(a.get("rounding_mode") is not None, f"rounding_mode={a.get('rounding_mode')!r}: the IR divides exactly")
    return t.b.binary("div", a["self"], a["other"])


@handles("aten.neg", "aten.exp", "aten.sqrt", "aten.rsqrt", "aten.silu", "aten.sigmoid", "aten.relu", "aten.square")
def _unary(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    return t.b.unary(node.target.overloadpacket.__name__, a["self"])  # type: ignore[union-attr]


@handles("aten.reciprocal")
def _reciprocal(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    return t.b.power(a["self"], -1)


@handles("aten.pow")
def _pow(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    exponent = a.get("exponent")
    if not isinstance(exponent, int | float) or not isinstance(a.get("self"), Tensor):
        raise Unexpressible("pow of a tensor exponent: the IR raises tensors to the constant powers 2, 1/2, -1/2, -1")
    return t.b.power(a["self"], float(exponent))


@handles("aten.gelu")
def _gelu(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    _refuse(a["approximate"] != "tanh", f"gelu(approximate={a['approximate']!r}) is the erf form; superopt's gelu is "
                                        "the tanh approximation (use approximate='tanh')")
    return t.b.unary("gelu", a["self"])


# -- views and no-ops -------------------------------------------------------------------------


@handles("aten.view", "aten.reshape", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze", "aten.flatten",
         "aten.unflatten", "aten.view_copy")
def _reshape(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    return t.b.reshape(t.b.tensor(a["self"]), _out_shape(node))


@handles("aten.t")
def _t(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    x = t.b.tensor(a["self"])
    return t.b.transpose(x, [1, 0]) if len(x.shape) == 2 else x


@handles("aten.transpose", "aten.swapaxes")
def _transpose(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    x = t.b.tensor(a["self"])
    d0, d1 = (a["dim0"], a["dim1"]) if "dim0" in a else (a["axis0"], a["axis1"])
    perm = list(range(len(x.shape)))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return t.b.transpose(x, perm)


@handles("aten.permute")
def _permute(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    return t.b.transpose(t.b.tensor(a["self"]), a["dims"])


@handles("aten.expand")
def _expand(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    """Kept at its operand's shape (with leading unit dims): the ops that read it broadcast."""
    x, target = t.b.tensor(a["self"]), _out_shape(node)
    return t.b.reshape(x, (1,) * (len(target) - len(x.shape)) + x.shape)


@handles("aten.contiguous", "aten.clone", "aten.alias", "aten.detach", "aten.lift_fresh_copy")
def _same(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    return a["self"]


@handles("aten._to_copy", "aten.to", "aten.type_as")
def _to(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    _same_dtype(node, a.get("dtype"))
    return a["self"]


@handles("aten.dropout")
def _dropout(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    _refuse(bool(a["train"]) and a["p"] != 0, TRAINING_DROPOUT)
    return a["input"]


@handles("aten.native_dropout")
def _native_dropout(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    raise Unexpressible(TRAINING_DROPOUT)  # what torch.export makes of nn.Dropout in training mode


# -- products ----------------------------------------------------------------------------------


@handles("aten.mm", "aten.bmm", "aten.matmul")
def _matmul(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    other = a["mat2"] if "mat2" in a else a["other"]
    return t.b.matmul(t.b.tensor(a["self"]), t.b.tensor(other))


@handles("aten.linear")
def _linear(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    return t.b.linear(t.b.tensor(a["input"]), t.b.tensor(a["weight"]), a["bias"])


@handles("aten.addmm", "aten.baddbmm")
def _addmm(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    """beta * self + alpha * (mat1 @ mat2), written product first as Gemm and linear are."""
    mat1, mat2 = (a["mat1"], a["mat2"]) if "mat1" in a else (a["batch1"], a["batch2"])
    product: Value = t.b.matmul(t.b.tensor(mat1), t.b.tensor(mat2))
    if a["alpha"] != 1:
        product = t.b.binary("mul", product, float(a["alpha"]))
    bias = a["self"] if a["beta"] == 1 else t.b.binary("mul", a["self"], float(a["beta"]))
    return t.b.binary("add", product, bias)


# -- reductions and normalizations --------------------------------------------------------------


@handles("aten.sum", "aten.mean", "aten.amax")
def _reduce(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    _same_dtype(node, a.get("dtype"))
    op = {"sum": Op.SUM, "mean": Op.MEAN, "amax": Op.MAX}[node.target.overloadpacket.__name__]  # type: ignore[union-attr]
    return t.b.reduce(op, t.b.tensor(a["self"]), a.get("dim"), bool(a.get("keepdim", False)))


@handles("aten.max")
def _max(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Any:
    """max over a dim gives (values, indices): the values only; max of all elements, one value."""
    _refuse("other" in a, "max of two tensors (an elementwise maximum): the IR has max over a dim")
    x = t.b.tensor(a["self"])
    if "dim" not in a:
        return t.b.reduce("max", x, None, False)
    return (t.b.reduce("max", x, [a["dim"]], bool(a["keepdim"])), None)


@handles("aten.softmax", "aten._softmax")
def _softmax(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    _refuse(bool(a.get("half_to_float")), "softmax computed in float32 from half inputs (half_to_float)")
    _same_dtype(node, a.get("dtype"))
    return t.b.op("softmax", t.b.tensor(a["self"]), dim=a["dim"])


def _eps(node: fx.Node, eps: float | None) -> float:
    """PyTorch's default epsilon for rms_norm: its dtype's machine epsilon."""
    return float(torch.finfo(tensor_meta(node).dtype).eps) if eps is None else float(eps)


@handles("aten.rms_norm")
def _rms_norm(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Value:
    x = t.b.tensor(a["input"])
    return t.b.rms_norm(x, len(x.shape) - len(a["normalized_shape"]), a["weight"], _eps(node, a["eps"]))


@handles("aten.layer_norm", "aten.native_layer_norm")
def _layer_norm(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Any:
    x = t.b.tensor(a["input"])
    y = t.b.layer_norm(x, len(x.shape) - len(a["normalized_shape"]), a["weight"], a["bias"], float(a["eps"]))
    return (y, None, None) if node.target.overloadpacket.__name__ == "native_layer_norm" else y  # type: ignore[union-attr]


@handles("aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
         "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
         "aten._scaled_dot_product_cudnn_attention")
def _attention(t: AtenTranslator, a: dict[str, Any], node: fx.Node) -> Any:
    mask = a.get("attn_mask", a.get("attn_bias"))
    _refuse(mask is not None, "attention with a mask: the IR has no masked softmax (masks and biases are refused)")
    _refuse(bool(a["is_causal"]), "causal attention needs a mask, and the IR has no masked softmax")
    _refuse(a["dropout_p"] != 0, "attention with dropout (call model.eval() first)")
    q, k, v = (t.b.tensor(a[n]) for n in ("query", "key", "value"))
    out = t.b.attention(q, k, v, a["scale"])
    if node.target.overloadpacket.__name__ == "scaled_dot_product_attention":  # type: ignore[union-attr]
        return out
    return (out, *([None] * (len(node.meta["val"]) - 1)))
