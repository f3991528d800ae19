"""The program IR: what users write. A DAG of tensor operations with static shapes and dtypes.

    p = Program("rmsnorm_matmul")
    x = p.input("X", (16, 4096), "f16")
    w = p.input("W", (4096, 6144), "f16")
    p.output(p.rms_norm(x) @ w)

Programs are validated as they are built (and when loaded from JSON); every error names the node
and the problem. Names (the program's and every node id) follow one grammar, and tensors and
programs stay within size limits: see `superopt.limits`. `to_json` / `Program.from_json`
round-trip losslessly; `canonical_hash` is the identity used by the kernel cache (see
`superopt.canonical`).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from superopt import ops
from superopt.dtypes import DTYPES
from superopt.dtypes import dtype as get_dtype
from superopt.jsontext import JSONDocument
from superopt.limits import (
    MAX_NODES,
    MAX_RANK,
    PROGRAM_BYTES_ENV,
    TENSOR_ELEMENTS_ENV,
    max_program_bytes,
    max_tensor_elements,
    name_problem,
    shown,
)
from superopt.ops import Op, OpError
from superopt.sizes import Size

SCHEMA = "superopt.program/1"


class ProgramError(ValueError):
    """A malformed program. The message names the node (or field) and the problem."""


@dataclass(frozen=True)
class Node:
    id: str
    op: Op | Literal["input"]
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    shape: tuple[int, ...]
    dtype: str | None  # None only for scalar constants, which adopt their partner's dtype

    @property
    def size_shape(self) -> tuple[Size, ...]:
        return tuple(Size.const(d) for d in self.shape)


@dataclass
class Program(JSONDocument):
    text_error = ProgramError
    name: str = "program"
    nodes: dict[str, Node] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    _counter: int = 0

    # -- building ------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str = "f16") -> Tensor:
        return self._add(name, "input", (), {"shape": _plain_dims(shape), "dtype": dtype})

    def const(self, value: float) -> Tensor:
        return self._add(None, Op.CONST, (), {"value": value})

    def op(self, op: str, *args: Tensor | float, name: str | None = None, **attrs: Any) -> Tensor:
        ids = tuple(self._operand(a) for a in args)
        return self._add(name, op, ids, attrs)

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return self.op(Op.MATMUL, a, b)

    def add(self, a: Tensor | float, b: Tensor | float) -> Tensor:
        return self.op(Op.ADD, a, b)

    def sub(self, a: Tensor | float, b: Tensor | float) -> Tensor:
        return self.op(Op.SUB, a, b)

    def mul(self, a: Tensor | float, b: Tensor | float) -> Tensor:
        return self.op(Op.MUL, a, b)

    def div(self, a: Tensor | float, b: Tensor | float) -> Tensor:
        return self.op(Op.DIV, a, b)

    def sum(self, x: Tensor, dim: int, keepdim: bool = False) -> Tensor:
        return self.op(Op.SUM, x, dim=dim, keepdim=keepdim)

    def mean(self, x: Tensor, dim: int, keepdim: bool = False) -> Tensor:
        return self.op(Op.MEAN, x, dim=dim, keepdim=keepdim)

    def max(self, x: Tensor, dim: int, keepdim: bool = False) -> Tensor:
        return self.op(Op.MAX, x, dim=dim, keepdim=keepdim)

    def rms_norm(self, x: Tensor, dim: int = -1, eps: float = 1e-6) -> Tensor:
        return self.op(Op.RMS_NORM, x, dim=dim, eps=eps)

    def softmax(self, x: Tensor, dim: int = -1) -> Tensor:
        return self.op(Op.SOFTMAX, x, dim=dim)

    def transpose(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        return self.op(Op.TRANSPOSE, x, perm=list(perm))

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        return self.op(Op.RESHAPE, x, shape=list(shape))

    def output(self, *tensors: Tensor) -> None:
        for t in tensors:
            if t.program is not self:
                raise ProgramError("output: tensor belongs to another program")
            self.outputs.append(t.id)

    def __getattr__(self, name: str) -> Any:
        # Unary elementwise ops: p.exp(x), p.silu(x), ...
        if name in ops.UNARY:
            return lambda x, name_=None: self.op(name, x, name=name_)
        raise AttributeError(name)

    def _operand(self, a: Tensor | float) -> str:
        if isinstance(a, Tensor):
            if a.program is not self:
                raise ProgramError("operand belongs to another program")
            return a.id
        if isinstance(a, numbers.Real) and not isinstance(a, bool):  # numpy's numbers too
            return self.const(float(a)).id
        raise ProgramError(f"operand must be a tensor or a number, got {type(a).__name__}")

    def _fresh(self, op: str) -> str:
        while True:
            self._counter += 1
            name = f"{op}_{self._counter}"
            if name not in self.nodes:
                return name

    def _add(self, name: str | None, op: str, inputs: tuple[str, ...], attrs: Mapping[str, Any]) -> Tensor:
        nid = self._fresh(op) if name is None else name
        node = _make_node(nid, op, inputs, dict(attrs), self.nodes)
        self.nodes[nid] = node
        return Tensor(self, nid)

    # -- queries -------------------------------------------------------------------------
    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.op == "input"]

    def node(self, nid: str) -> Node:
        return self.nodes[nid]

    def topological(self) -> list[Node]:
        """Nodes in dependency order (insertion order is already one, as validated)."""
        return list(self.nodes.values())

    @property
    def dtype(self) -> str:
        """The dtype of the program's outputs (all outputs share it)."""
        return self.nodes[self.outputs[0]].dtype or "f32"

    def validate(self) -> Program:
        """Whole-program checks that building node by node cannot make: a valid name, outputs
        exist, all used, within the node and byte limits."""
        _named(self.name, "program name")
        if not self.outputs:
            raise ProgramError(f"program {self.name!r} has no output")
        for o in self.outputs:
            if o not in self.nodes:
                raise ProgramError(f"output {o!r} is not a node of the program")
            if self.nodes[o].op in ("input", Op.CONST):
                kind = "an input" if self.nodes[o].op == "input" else "a constant"
                raise ProgramError(f"output {o!r} is {kind}, not a computed tensor")
        twice = next((o for k, o in enumerate(self.outputs) if o in self.outputs[:k]), None)
        if twice is not None:
            raise ProgramError(f"output {twice!r} is listed twice (each output is one tensor)")
        live = self._live()
        for n in self.nodes.values():
            if n.id not in live:
                kind = "input" if n.op == "input" else "node"
                raise ProgramError(f"{kind} {n.id!r} ({n.op}) is not used by any output")
        _check_node_count(self.name, len(self.nodes))
        first = next(iter(self.inputs), None)
        other = next((n for n in self.inputs if first and n.dtype != first.dtype), None)
        if first and other:
            raise ProgramError(f"inputs mix dtypes: {first.id!r} is {first.dtype}, {other.id!r} is {other.dtype} "
                               "(a program, like its kernels, has one dtype)")
        self._check_bytes()
        return self

    def _check_bytes(self) -> None:
        """Refuse a program whose tensors do not fit a worker together (the byte limit)."""
        sizes = {n.id: math.prod(n.shape) * get_dtype(n.dtype).nbytes for n in self.nodes.values() if n.dtype}
        total, limit = sum(sizes.values()), max_program_bytes()
        if total > limit:
            largest = max(sizes, key=lambda k: sizes[k])
            raise ProgramError(f"program {self.name!r}: its tensors take {total:,} bytes in their dtypes; at most "
                               f"{limit:,} ({PROGRAM_BYTES_ENV}); the largest is node {largest!r} with "
                               f"{sizes[largest]:,} bytes")

    def _live(self) -> set[str]:
        live: set[str] = set()
        stack = list(self.outputs)
        while stack:
            nid = stack.pop()
            if nid not in live:
                live.add(nid)
                stack.extend(self.nodes[nid].inputs)
        return live

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        nodes = []
        for n in self.nodes.values():
            entry: dict[str, Any] = {"id": n.id, "op": n.op}
            if n.op == "input":
                entry["shape"] = list(n.shape)
                entry["dtype"] = n.dtype
            else:
                if n.inputs:
                    entry["inputs"] = list(n.inputs)
                if n.attrs:
                    entry["attrs"] = {k: list(v) if isinstance(v, tuple) else v for k, v in n.attrs.items()}
            nodes.append(entry)
        return {"schema": SCHEMA, "name": self.name, "nodes": nodes, "outputs": list(self.outputs)}

    @classmethod
    def from_json(cls, data: Any) -> Program:
        return _load(data)

    def canonical_hash(self) -> str:
        from superopt.canonical import canonical_hash

        return canonical_hash(self)

    def summary(self) -> str:
        ins = ", ".join(f"{n.id}{_shape_text(n.shape)}:{n.dtype}" for n in self.inputs)
        return f"{self.name}({ins})"


@dataclass(frozen=True)
class Tensor:
    """A handle on a program node, with operators for building: x @ w, x * 2.0, -x."""

    program: Program
    id: str

    @property
    def node(self) -> Node:
        return self.program.nodes[self.id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> str | None:
        return self.node.dtype

    def __matmul__(self, o: Tensor) -> Tensor:
        return self.program.matmul(self, o)

    def __add__(self, o: Tensor | float) -> Tensor:
        return self.program.add(self, o)

    def __radd__(self, o: float) -> Tensor:
        return self.program.add(o, self)

    def __sub__(self, o: Tensor | float) -> Tensor:
        return self.program.sub(self, o)

    def __rsub__(self, o: float) -> Tensor:
        return self.program.sub(o, self)

    def __mul__(self, o: Tensor | float) -> Tensor:
        return self.program.mul(self, o)

    def __rmul__(self, o: float) -> Tensor:
        return self.program.mul(o, self)

    def __truediv__(self, o: Tensor | float) -> Tensor:
        return self.program.div(self, o)

    def __rtruediv__(self, o: float) -> Tensor:
        return self.program.div(o, self)

    def __neg__(self) -> Tensor:
        return self.program.op(Op.NEG, self)


def _named(name: object, what: str) -> str:
    """`name`, or the ProgramError saying how it breaks the name grammar (`superopt.limits`):
    names reach database rows, messages and comments in generated code, so they are data only."""
    problem = name_problem(name)
    if problem is not None or not isinstance(name, str):
        raise ProgramError(f"{what} {shown(name)} is not a valid name: {problem}")
    return name


def _shape_text(shape: Iterable[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _plain_dims(shape: Any) -> Any:
    """A builder's shape given as any sequence of integers (numpy's too) as Python ints, which the
    checks of `_make_node` take; anything else is left for them to name."""
    if isinstance(shape, str) or not isinstance(shape, Iterable):
        return shape
    return tuple(int(d) if isinstance(d, numbers.Integral) and not isinstance(d, bool) else d for d in shape)


def _shown(value: Any) -> str:
    """A value from a program as its JSON reads (true, null), or as Python shows it otherwise."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _make_node(nid: Any, op: Any, inputs: tuple[str, ...], attrs: dict[str, Any], known: Mapping[str, Node]) -> Node:
    """Check one node against the nodes before it and infer its shape and dtype."""
    _named(nid, "node id")
    where = f"node {nid!r}"
    if nid in known:
        raise ProgramError(f"{where}: duplicate node id")
    if not isinstance(op, str) or (op not in ops.OPS and op != "input"):
        raise ProgramError(f"{where}: unknown op {op!r}")
    where = f"node {nid!r} ({op})"
    if op == "input":
        if inputs:
            raise ProgramError(f"{where}: an input takes no operands")
        shape = attrs.get("shape")
        if not isinstance(shape, list | tuple) or not shape:
            raise ProgramError(f"{where}: 'shape' must be a non-empty list of dimensions (a scalar is [1]), "
                               f"got {_shown(shape)}")
        _check_rank(len(shape), where)
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int):
                raise ProgramError(f"{where}: dimension {_shown(d)} is not an integer")
            if d <= 0:
                raise ProgramError(f"{where}: dimension {d} is not positive")
        dt = attrs.get("dtype")
        if not isinstance(dt, str) or dt not in DTYPES:
            raise ProgramError(f"{where}: unknown dtype {dt!r} (expected one of {', '.join(DTYPES)})")
        extra = set(attrs) - {"shape", "dtype"}
        if extra:
            raise ProgramError(f"{where}: unexpected field {sorted(extra)[0]!r}")
        return _sized(Node(nid, "input", (), {}, tuple(shape), dt), where)
    op = Op(op)  # a valid name from here on: compare against members
    spec = ops.OPS[op]
    if len(inputs) != spec.arity:
        raise ProgramError(f"{where}: takes {spec.arity} operand(s), got {len(inputs)}")
    for i in inputs:
        if i not in known:
            raise ProgramError(f"{where}: operand {i!r} is not defined")
    try:
        full = ops.check_attrs(op, attrs)
        args = [known[i] for i in inputs]
        shape_s = ops.infer_shape(op, [a.size_shape for a in args], full)
    except OpError as e:
        raise ProgramError(f"{where}: {e}") from None
    if op == Op.CONST and not math.isfinite(full["value"]):
        raise ProgramError(f"{where}: value must be finite")
    dtypes = {a.dtype for a in args if a.dtype is not None}
    if len(dtypes) > 1:
        raise ProgramError(f"{where}: operands have different dtypes {sorted(dtypes)}")
    dt = dtypes.pop() if dtypes else None
    if op != Op.CONST and dt is None:
        raise ProgramError(f"{where}: needs at least one tensor operand (all operands are constants)")
    return _sized(Node(nid, op, inputs, full, tuple(int(s.int_value()) for s in shape_s), dt), where)


def _check_node_count(name: str, count: int) -> None:
    if count > MAX_NODES:
        raise ProgramError(f"program {name!r} has {count} nodes; at most {MAX_NODES} are searched "
                           "(split it into smaller programs)")


def _check_rank(rank: int, where: str) -> None:
    if rank > MAX_RANK:
        raise ProgramError(f"{where}: rank {rank}; at most {MAX_RANK} dimensions")


def _sized(node: Node, where: str) -> Node:
    """`node`, unless its rank or its element count is above the limits (a reshape can raise both)."""
    _check_rank(len(node.shape), where)
    elements, limit = math.prod(node.shape), max_tensor_elements()
    if elements > limit:
        raise ProgramError(f"{where}: shape {list(node.shape)} has {elements:,} elements; at most {limit:,} "
                           f"({TENSOR_ELEMENTS_ENV})")
    return node


def _load(data: Any) -> Program:
    if not isinstance(data, dict):
        raise ProgramError("program JSON must be an object")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ProgramError(f"no 'schema' field (a program file has \"schema\": {json.dumps(SCHEMA)})"
                           if schema is None else f"unknown program schema {schema!r} (this version reads {SCHEMA!r})")
    extra = set(data) - {"schema", "name", "nodes", "outputs"}
    if extra:
        raise ProgramError(f"unexpected top-level field {sorted(extra)[0]!r}")
    name = _named(data.get("name", "program"), "'name'")
    raw = data.get("nodes")
    if not isinstance(raw, list) or not raw:
        raise ProgramError("'nodes' must be a non-empty list")
    _check_node_count(name, len(raw))  # before the work of checking each one
    entries: dict[str, dict[str, Any]] = {}
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise ProgramError(f"nodes[{i}] must be an object")
        nid = _named(e.get("id"), f"nodes[{i}]: 'id'")
        if nid in entries:
            raise ProgramError(f"node {nid!r}: duplicate node id")
        unknown = set(e) - {"id", "op", "inputs", "attrs", "shape", "dtype"}
        if unknown:
            raise ProgramError(f"node {nid!r}: unexpected field {sorted(unknown)[0]!r}")
        ins = e.get("inputs", [])
        if not isinstance(ins, list) or not all(isinstance(x, str) for x in ins):
            raise ProgramError(f"node {nid!r}: 'inputs' must be a list of node ids")
        attrs = e.get("attrs", {})
        if not isinstance(attrs, dict):
            raise ProgramError(f"node {nid!r}: 'attrs' must be an object")
        if e.get("op") == "input" and ("inputs" in e or "attrs" in e):
            field = "attrs" if "attrs" in e else "inputs"
            raise ProgramError(f"node {nid!r} (input): an input has no {field!r} (its fields are shape and dtype)")
        entries[nid] = e
    order = _toposort(entries)
    p = Program(name)
    for nid in order:
        e = entries[nid]
        attrs = dict(e.get("attrs", {}))
        if e.get("op") == "input":
            attrs = {"shape": e.get("shape"), "dtype": e.get("dtype")}
        node = _make_node(nid, e.get("op"), tuple(e.get("inputs", [])), attrs, p.nodes)
        if e.get("op") != "input":
            if e.get("shape") is not None and (not isinstance(e["shape"], list) or e["shape"] != list(node.shape)):
                raise ProgramError(f"node {nid!r}: declared shape {e['shape']} but the op gives {list(node.shape)}")
            if e.get("dtype") is not None and e["dtype"] != node.dtype:
                gives = repr(node.dtype) if node.dtype is not None else \
                    "none (a constant takes the dtype of the tensor it meets)" if node.op == Op.CONST else "none"
                raise ProgramError(f"node {nid!r}: declared dtype {e['dtype']!r} but the op gives {gives}")
        p.nodes[nid] = node
    outs = data.get("outputs")
    if not isinstance(outs, list) or not all(isinstance(o, str) for o in outs):
        raise ProgramError("'outputs' must be a list of node ids")
    p.outputs = list(outs)
    return p.validate()


def _toposort(entries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Order node ids so operands come first; report an undefined operand or a cycle by name."""
    for nid, e in entries.items():
        for i in e.get("inputs", []):
            if i not in entries:
                raise ProgramError(f"node {nid!r} ({e.get('op')}): operand {i!r} is not defined")
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for root in entries:
        if state.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            nid, k = stack.pop()
            if k == 0:
                if state.get(nid) == 2:
                    continue
                state[nid] = 1
                path.append(nid)
            ins = list(entries[nid].get("inputs", []))
            if k < len(ins):
                stack.append((nid, k + 1))
                child = ins[k]
                if state.get(child) == 1:
                    cycle = [*path[path.index(child) :], child]
                    raise ProgramError(f"cycle through nodes {' -> '.join(repr(c) for c in cycle)}")
                if state.get(child) != 2:
                    stack.append((child, 0))
            else:
                state[nid] = 2
                path.pop()
                order.append(nid)
    return order
