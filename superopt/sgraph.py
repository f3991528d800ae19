"""The sGraph IR: what the search produces. Kernel graphs whose graph-defined kernels are block graphs.

Levels (DESIGN.md §4):
- kernel graph: tensors in device memory; each kernel is a *library* kernel (one program op run by
  a library, e.g. cuBLAS) or a *graph* kernel whose body is a block graph;
- block graph: a grid of 1–3 axes and one loop axis, whose sizes are symbolic `Size`s. Inputs
  carry an imap (per grid axis: the data dim it splits, or None = every block sees the whole dim)
  and an fmap (the data dim the loop walks, or None). The body runs once per iteration on tiles;
  accumulators (`sum`, `mean`, `concat`) combine iterations; post-loop ops run once per block;
  outputs carry an omap (per grid axis: a distinct dim of the output), so blocks write disjoint
  regions. A data dim split by a grid axis and by the loop is split grid-outer, loop-inner.

Axes are named. The same name in two kernels means the same index space (it must have the same
size): a later kernel's loop may walk the dim an earlier kernel's grid axis wrote, which is how
the flash-decoding merge kernel sums the chunks of the first one.

`SGraph.from_json` checks the structure of its JSON (`superopt.sgraph_schema`: no unknown field,
each of its type); `analyze` checks what the fields mean together and derives the shape of every
tensor and tile; `constraints` lists what an instantiation must satisfy; `superopt.instantiate`
assigns the symbols.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal, TypeGuard

from pydantic import ValidationError

from superopt import ops
from superopt.dtypes import dtype as get_dtype
from superopt.jsontext import JSONDocument
from superopt.object_cache import ObjectCache
from superopt.ops import Op, OpError, Shape
from superopt.program import Program
from superopt.sgraph_schema import (
    AxisJSON,
    BlockOpJSON,
    GraphKernelJSON,
    LibraryKernelJSON,
    SGraphJSON,
    structure_error,
)
from superopt.sizes import Size, SizeError, product, total

SCHEMA = "superopt.sgraph/1"


class AccKind(StrEnum):
    """How an accumulator combines the loop's iterations (its JSON spelling, as `Op`)."""

    SUM = "sum"
    MEAN = "mean"  # the sum over the loop's extent
    CONCAT = "concat"  # along `Accumulator.dim`

    __repr__ = str.__repr__


ACCUMULATORS = tuple(AccKind)


class SGraphError(ValueError):
    """A malformed sGraph. The message names the kernel, tensor or field and the problem."""


@dataclass(frozen=True)
class Axis:
    name: str
    size: Size


@dataclass(frozen=True)
class BlockInput:
    id: str
    tensor: str
    imap: tuple[int | None, ...]
    fmap: int | None


@dataclass(frozen=True)
class BlockOp:
    id: str
    op: str  # an `Op` once known; an unknown name stays a string for `analyze` to report
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", _known(self.op))
        object.__setattr__(self, "attrs", _complete_attrs(self.op, self.attrs, f"block op {self.id!r}"))


@dataclass(frozen=True)
class Accumulator:
    id: str
    source: str
    kind: str  # an `AccKind` once known; an unknown name stays a string for `analyze` to report
    dim: int | None = None  # the concatenation dim, for "concat"

    def __post_init__(self) -> None:
        if self.kind in ACCUMULATORS:
            object.__setattr__(self, "kind", AccKind(self.kind))


@dataclass(frozen=True)
class BlockOutput:
    source: str
    tensor: str
    omap: tuple[int, ...]


@dataclass(frozen=True)
class BlockGraph:
    grid: tuple[Axis, ...]
    loop: Axis
    inputs: tuple[BlockInput, ...]
    body: tuple[BlockOp, ...]
    accumulators: tuple[Accumulator, ...]
    post: tuple[BlockOp, ...]
    outputs: tuple[BlockOutput, ...]

    @property
    def axes(self) -> tuple[Axis, ...]:
        return (*self.grid, self.loop)

    def ops(self) -> Iterator[BlockOp]:
        yield from self.body
        yield from self.post


@dataclass(frozen=True)
class LibraryKernel:
    """A pre-defined kernel: one program op on device tensors, run by a library."""

    id: str
    op: str  # an `Op` once known, as `BlockOp.op`
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    output: str
    kind: Literal["library"] = "library"

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", _known(self.op))
        object.__setattr__(self, "attrs", _complete_attrs(self.op, self.attrs, f"kernel {self.id}"))

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)

    @property
    def tensor_inputs(self) -> tuple[str, ...]:
        return self.inputs


@dataclass(frozen=True)
class GraphKernel:
    """A graph-defined kernel: one launch whose blocks run `block`."""

    id: str
    block: BlockGraph
    kind: Literal["graph"] = "graph"

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o.tensor for o in self.block.outputs)

    @property
    def tensor_inputs(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for i in self.block.inputs:
            seen.setdefault(i.tensor, None)
        return tuple(seen)


Kernel = LibraryKernel | GraphKernel


def read_by_library(kernels: Sequence[Kernel], tensor: str) -> bool:
    return any(isinstance(k, LibraryKernel) and tensor in k.inputs for k in kernels)


def stored_order(dims: Sequence[Any], perm: Sequence[int]) -> tuple[Any, ...]:
    """Per-dim values of a view (`SGraph.views`: view dim i is stored dim perm[i]) in the order of
    its stored tensor's dims: a view tile's extents as they lie in memory."""
    return tuple(dims[list(perm).index(d)] for d in range(len(perm)))


def _known(op: str) -> str:
    return Op(op) if op in ops.OPS else op


def _complete_attrs(op: str, attrs: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """Attributes with defaults filled in (unknown ops are left for `analyze` to report)."""
    if op not in ops.OPS:
        return dict(attrs)
    try:
        return ops.check_attrs(op, attrs)
    except OpError as e:
        raise SGraphError(f"{where} ({op}): {e}") from None


@dataclass(frozen=True)
class TensorDecl:
    id: str
    shape: tuple[int, ...]
    dtype: str


def input_decls(program: Program) -> tuple[TensorDecl, ...]:
    """A program's inputs as the inputs of an sGraph computing it."""
    return tuple(TensorDecl(n.id, n.shape, n.dtype or "f32") for n in program.inputs)


@dataclass(frozen=True)
class SGraph(JSONDocument):
    text_error = SGraphError
    inputs: tuple[TensorDecl, ...]
    kernels: tuple[Kernel, ...]
    outputs: tuple[str, ...]
    name: str = "sgraph"

    @cached_property
    def info(self) -> Analysis:
        return analyze(self)

    @property
    def symbols(self) -> frozenset[str]:
        return self.info.symbols

    @cached_property
    def views(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Tensors a library transpose makes: each is a view (no copy) of a stored tensor,
        `view -> (stored tensor, perm)` with view dim i being the stored tensor's dim perm[i].
        Whatever reads a view reads the stored tensor's memory with permuted strides."""
        views: dict[str, tuple[str, tuple[int, ...]]] = {}
        for k in self.kernels:
            if isinstance(k, LibraryKernel) and k.op == Op.TRANSPOSE:
                stored, inner = views.get(k.inputs[0], (k.inputs[0], None))
                perm = tuple(k.attrs["perm"])
                views[k.output] = stored, perm if inner is None else tuple(inner[p] for p in perm)
        return views

    @cached_property
    def reshaped_views(self) -> dict[str, str]:
        """Reshapes of views (`views`) that graph kernels read, and nothing else: no library
        kernel, not the graph's outputs. `reshaped -> transposed view`, whose elements it holds in
        the same row-major order: a generated kernel reads it in place by that order (heads merged
        after attention, read by the output projection); any other reader needs a copy."""
        read = {i for k in self.graph_kernels for i in k.tensor_inputs}
        return {k.output: k.inputs[0] for k in self.kernels
                if self.reshapes_view(k) and k.output in read and k.output not in self.outputs
                and not read_by_library(self.kernels, k.output)}

    def reshapes_view(self, k: Kernel) -> TypeGuard[LibraryKernel]:
        """Is `k` a library reshape of a transposed view: a copy, or nothing where the readers
        index the stored tensor themselves (`reshaped_views`)?"""
        return isinstance(k, LibraryKernel) and k.op == Op.RESHAPE and k.inputs[0] in self.views

    @property
    def graph_kernels(self) -> list[GraphKernel]:
        return [k for k in self.kernels if isinstance(k, GraphKernel)]

    def kernel(self, kid: str) -> Kernel:
        for k in self.kernels:
            if k.id == kid:
                return k
        raise KeyError(kid)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any) -> SGraph:
        return _from_json(data)


# ---------------------------------------------------------------------------------------------
# Analysis: validation, shapes, storage, constraints


@dataclass(frozen=True)
class Constraint:
    """One condition on the symbols. kind: 'divides' (expr must be a positive integer),
    'smem' (expr bytes <= the target's shared memory per block), 'blocks' (expr <= max blocks)."""

    kind: str
    expr: Size
    kernel: str
    where: str  # what it constrains; a `str.format` template of `parts` when there are parts
    parts: tuple[Any, ...] = ()  # formatted only when described: sizes print slowly, and most never are

    def describe(self) -> str:
        return f"kernel {self.kernel}: {self.where.format(*self.parts) if self.parts else self.where}"


@dataclass
class BlockInfo:
    """Derived facts about one block graph: tile shapes and where each tile lives."""

    shapes: dict[str, Shape]  # every block tensor (inputs, body, accumulators, post) -> tile shape
    storage: dict[str, str | None]  # block tensor -> dtype name it is stored in (None: registers)
    consumers: dict[str, list[str]]  # block tensor -> ids of ops/accumulators/outputs reading it
    phase: dict[str, str]  # block tensor -> "input" | "body" | "acc" | "post"


@dataclass
class Analysis:
    shapes: dict[str, Shape]  # kernel tensor -> shape
    dtypes: dict[str, str]
    producer: dict[str, str]  # kernel tensor -> kernel id (inputs: "")
    blocks: dict[str, BlockInfo]
    constraints: list[Constraint]
    symbols: frozenset[str]
    axis_sizes: dict[str, Size]
    # instantiate's compiled evaluators of sizes, per kernel id or ("tensor", id), built on first use
    evaluators: dict[str | tuple[str, str], Any] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to Ray workers and back) without the evaluators: generated functions, which
        only cloudpickle can carry, slowly; the receiver compiles its own on first use."""
        return {**self.__dict__, "evaluators": {}}


def analyze(sg: SGraph, require_used: bool = True) -> Analysis:
    shapes: dict[str, Shape] = {}
    dtypes: dict[str, str] = {}
    producer: dict[str, str] = {}
    for t in sg.inputs:
        if t.id in shapes:
            raise SGraphError(f"input {t.id!r} is declared twice")
        try:
            get_dtype(t.dtype)
        except ValueError as e:
            raise SGraphError(f"input {t.id!r}: {e}") from None
        if not t.shape or any(not isinstance(d, int) or d <= 0 for d in t.shape):
            raise SGraphError(f"input {t.id!r}: shape must be a list of positive integers, got {list(t.shape)}")
        shapes[t.id] = tuple(Size.const(d) for d in t.shape)
        dtypes[t.id] = t.dtype
        producer[t.id] = ""
    if not sg.kernels:
        raise SGraphError("an sGraph needs at least one kernel")
    kernel_ids: set[str] = set()
    axis_sizes: dict[str, Size] = {}
    axis_owner: dict[str, str] = {}
    blocks: dict[str, BlockInfo] = {}
    constraints: list[Constraint] = []
    dtype_all = {t.dtype for t in sg.inputs}
    if len(dtype_all) > 1:
        raise SGraphError(f"inputs mix dtypes {sorted(dtype_all)}; an sGraph has one dtype")
    dt = dtype_all.pop() if dtype_all else "f32"
    for k in sg.kernels:
        if k.id in kernel_ids:
            raise SGraphError(f"kernel id {k.id!r} is used twice")
        kernel_ids.add(k.id)
        for out in k.outputs:
            if out in shapes:
                raise SGraphError(f"kernel {k.id}: tensor {out!r} is already defined")
        if isinstance(k, LibraryKernel):
            _analyze_library(k, shapes, dtypes, dt)
        else:
            blocks[k.id] = _analyze_block(k, shapes, dtypes, dt, axis_sizes, axis_owner, constraints)
        for out in k.outputs:
            producer[out] = k.id
    if not sg.outputs:
        raise SGraphError("an sGraph needs at least one output")
    for o in sg.outputs:
        if o not in shapes:
            raise SGraphError(f"output {o!r} is not a tensor of the sGraph")
    if require_used:
        _check_all_used(sg, shapes)
    symbols = frozenset(s for a in axis_sizes.values() for s in a.symbols)
    return Analysis(shapes, dtypes, producer, blocks, constraints, symbols, axis_sizes)


def _analyze_library(k: LibraryKernel, shapes: dict[str, Shape], dtypes: dict[str, str], dt: str) -> None:
    where = f"kernel {k.id} ({k.op})"
    if k.op not in ops.OPS:
        raise SGraphError(f"{where}: unknown op {k.op!r}")
    for i in k.inputs:
        if i not in shapes:
            raise SGraphError(f"{where}: input tensor {i!r} is not defined before this kernel")
    try:
        shapes[k.output] = ops.infer_shape(k.op, [shapes[i] for i in k.inputs], k.attrs)
    except OpError as e:
        raise SGraphError(f"{where}: {e}") from None
    dtypes[k.output] = dt


def _analyze_block(
    k: GraphKernel, shapes: dict[str, Shape], dtypes: dict[str, str], dt: str,
    axis_sizes: dict[str, Size], axis_owner: dict[str, str], constraints: list[Constraint],
) -> BlockInfo:
    b = k.block
    where = f"kernel {k.id}"
    if not 1 <= len(b.grid) <= 3:
        raise SGraphError(f"{where}: the grid must have 1 to 3 axes, got {len(b.grid)}")
    names = [a.name for a in b.axes]
    if len(set(names)) != len(names):
        raise SGraphError(f"{where}: axis names must be distinct within a block graph, got {names}")
    for a in b.axes:
        if a.name in axis_sizes and axis_sizes[a.name] != a.size:
            raise SGraphError(
                f"{where}: axis {a.name!r} has size {a.size} here but {axis_sizes[a.name]} in kernel "
                f"{axis_owner[a.name]} (axes with one name share one size)"
            )
        if len(a.size.terms) != 1 or a.size.terms[0][1] <= 0 or a.size.terms[0][1].denominator != 1:
            raise SGraphError(f"{where}: axis {a.name!r} size {a.size} must be a positive product of symbols")
        axis_sizes.setdefault(a.name, a.size)
        axis_owner.setdefault(a.name, k.id)
    for inp in b.inputs:
        if inp.tensor not in shapes:
            raise SGraphError(f"{where}: input {inp.id!r} ({inp.tensor}): tensor {inp.tensor!r} is not defined before "
                              "this kernel")
    input_shapes = tuple(shapes[t] for t in k.tensor_inputs)
    info, outputs, own = _BLOCK_ANALYSES.get(k, (input_shapes, dt), lambda: _block_analysis(k, input_shapes, dt))
    for tensor, shape in outputs:
        shapes[tensor] = shape
        dtypes[tensor] = dt
    constraints.extend(own)
    return info


# Analyses of graph kernels, by kernel object and input shapes: the search grows many candidate
# sGraphs from one kernel object (every candidate after a first kernel shares it), and sizes are
# slow to multiply.
BlockAnalysis = tuple[BlockInfo, tuple[tuple[str, Shape], ...], tuple[Constraint, ...]]  # tiles, outputs, constraints
_BLOCK_ANALYSES: ObjectCache[GraphKernel, BlockAnalysis] = ObjectCache(4096)


def _block_analysis(
    k: GraphKernel, input_shapes: tuple[Shape, ...], dt: str,
) -> BlockAnalysis:
    """A graph kernel's tiles, output shapes and constraints, from its input tensors' shapes."""
    b = k.block
    where = f"kernel {k.id}"
    shapes = dict(zip(k.tensor_inputs, input_shapes, strict=True))
    constraints: list[Constraint] = []
    outputs: list[tuple[str, Shape]] = []
    grid_sizes = [a.size for a in b.grid]
    loop = b.loop.size
    tiles: dict[str, Shape] = {}
    phase: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}

    def define(tid: str, ph: str, shape: Shape) -> None:
        if tid in tiles:
            raise SGraphError(f"{where}: block tensor id {tid!r} is defined twice")
        tiles[tid] = shape
        phase[tid] = ph
        consumers[tid] = []

    def use(tid: str, by: str, allowed: tuple[str, ...], what: str) -> None:
        if tid not in tiles:
            raise SGraphError(f"{where}: {what} reads {tid!r}, which is not defined before it")
        if phase[tid] not in allowed:
            raise SGraphError(
                f"{where}: {what} reads {tid!r} from the {_PHASE_TEXT[phase[tid]]}; it may only read "
                + " or ".join(_PHASE_TEXT[p] for p in allowed)
                + " (every input-to-output path passes exactly one accumulator)"
            )
        consumers[tid].append(by)

    for part, items in (("input", b.inputs), ("accumulator", b.accumulators), ("output", b.outputs)):
        if not items:
            raise SGraphError(f"{where}: a block graph needs at least one {part}")
    for inp in b.inputs:
        w = f"input {inp.id!r} ({inp.tensor})"
        full = shapes[inp.tensor]
        if len(inp.imap) != len(b.grid):
            raise SGraphError(f"{where}: {w}: imap has {len(inp.imap)} entries for {len(b.grid)} grid axes")
        split: dict[int, list[Size]] = {}
        for a, d in zip(b.grid, inp.imap, strict=True):
            if d is None:
                continue
            if not 0 <= d < len(full):
                raise SGraphError(
                    f"{where}: {w}: imap sends axis {a.name} to dim {d}, out of range for rank {len(full)}"
                )
            if d in split:
                raise SGraphError(f"{where}: {w}: dim {d} is split by two grid axes")
            split[d] = [a.size]
        if inp.fmap is not None:
            if not 0 <= inp.fmap < len(full):
                raise SGraphError(f"{where}: {w}: fmap dim {inp.fmap} is out of range for rank {len(full)}")
            split.setdefault(inp.fmap, []).append(loop)
        in_tile: list[Size] = []
        for d, n in enumerate(full):
            factor = product(split.get(d, []))
            share = n / factor
            in_tile.append(share)
            if d in split:
                axes = [a.name for a, m in zip(b.grid, inp.imap, strict=True) if m == d]
                if inp.fmap == d:
                    axes.append(f"the loop {b.loop.name}")
                constraints.append(Constraint(
                    "divides", share, k.id, "{} dim {} ({}) must divide evenly by {} ({})",
                    (w, d, n, " and ".join(axes), factor),
                ))
        define(inp.id, "input", tuple(in_tile))
    for op in b.body:
        _block_op(op, "body", ("input", "body"), tiles, define, use, where)
    for acc in b.accumulators:
        w = f"accumulator {acc.id!r}"
        if acc.kind not in ACCUMULATORS:
            raise SGraphError(f"{where}: {w}: unknown kind {acc.kind!r} (expected {', '.join(ACCUMULATORS)})")
        use(acc.source, acc.id, ("input", "body"), w)
        src = tiles[acc.source]
        if acc.kind == AccKind.CONCAT:
            if acc.dim is None or not 0 <= acc.dim < len(src):
                raise SGraphError(f"{where}: {w}: concat needs a dim in range for rank {len(src)}, got {acc.dim}")
            shape = (*src[: acc.dim], src[acc.dim] * loop, *src[acc.dim + 1 :])
        else:
            if acc.dim is not None:
                raise SGraphError(f"{where}: {w}: only concat accumulators take a dim")
            shape = src
        define(acc.id, "acc", shape)
    for op in b.post:
        _block_op(op, "post", ("acc", "post"), tiles, define, use, where)
    for out in b.outputs:
        w = f"output {out.tensor!r}"
        use(out.source, f"->{out.tensor}", ("acc", "post"), w)
        tile = tiles[out.source]
        if len(out.omap) != len(b.grid):
            raise SGraphError(f"{where}: {w}: omap has {len(out.omap)} entries for {len(b.grid)} grid axes")
        if len(set(out.omap)) != len(out.omap):
            raise SGraphError(f"{where}: {w}: omap sends two grid axes to one dim (blocks would overlap)")
        whole = list(tile)
        for a, d in zip(b.grid, out.omap, strict=True):
            if d is None or not 0 <= d < len(tile):
                raise SGraphError(
                    f"{where}: {w}: omap sends axis {a.name} to dim {d}, out of range for rank {len(tile)}"
                )
            whole[d] = whole[d] * a.size
        outputs.append((out.tensor, tuple(whole)))
    for tid, users in consumers.items():
        if not users:
            raise SGraphError(f"{where}: block tensor {tid!r} is computed but never used")
    constraints.append(Constraint("blocks", product(grid_sizes), k.id, "grid {} blocks",
                                  (_Joined(" x ", tuple(grid_sizes)),)))
    info = BlockInfo(tiles, {}, consumers, phase)
    info.storage = _storage_plan(b, info, dt)
    constraints.append(Constraint("smem", smem_bytes(info), k.id, "shared memory of the block's tiles"))
    return info, tuple(outputs), tuple(constraints)


_PHASE_TEXT = {"input": "block inputs", "body": "loop body", "acc": "accumulators", "post": "post-loop ops"}


def _block_op(
    op: BlockOp, phase: str, allowed: tuple[str, ...], tiles: dict[str, Shape], define: Any, use: Any, where: str
) -> None:
    w = f"{phase} op {op.id!r} ({op.op})"
    if op.op not in ops.OPS or not ops.OPS[op.op].block_level:
        raise SGraphError(f"{where}: {w}: {op.op!r} is not a block-level op")
    for i in op.inputs:
        use(i, op.id, allowed, w)
    try:
        shape = ops.infer_shape(op.op, [tiles[i] for i in op.inputs], op.attrs)
    except OpError as e:
        raise SGraphError(f"{where}: {w}: {e}") from None
    define(op.id, phase, shape)


def _storage_plan(b: BlockGraph, info: BlockInfo, dt: str) -> dict[str, str | None]:
    """Where each block tensor lives: the kernel dtype, 'f32', or None (registers, fused).

    Input tiles are staged in the kernel dtype. An elementwise result read only by elementwise
    ops of its own shape, accumulators or outputs is recomputed in registers (thread-level
    fusion) and never stored. A matmul read only by sum/mean accumulators adds straight into
    them. Anything a matmul reads is stored in the kernel dtype (tensor-core operands); other
    stored tiles and all accumulators are fp32.
    """
    by_id = {op.id: op for op in b.ops()}
    accs = {a.id: a for a in b.accumulators}
    plan: dict[str, str | None] = {}
    for tid, ph in info.phase.items():
        users = info.consumers[tid]
        if ph == "input":
            plan[tid] = dt
            continue
        if ph == "acc":
            plan[tid] = "f32"
            continue
        op = by_id[tid]
        feeds_matmul = any(u in by_id and by_id[u].op == Op.MATMUL for u in users)
        if op.op in ops.ELEMENTWISE or op.op == Op.CONST:
            fused = all(
                (u in by_id and by_id[u].op in ops.ELEMENTWISE and info.shapes[u] == info.shapes[tid])
                or (u in accs and accs[u].kind != AccKind.CONCAT)
                or u.startswith("->")
                for u in users
            )
            if op.op == Op.CONST or fused:
                plan[tid] = None
                continue
        if op.op == Op.MATMUL and all(u in accs and accs[u].kind in (AccKind.SUM, AccKind.MEAN) for u in users):
            plan[tid] = None
            continue
        plan[tid] = dt if feeds_matmul else "f32"
    return plan


def smem_bytes(info: BlockInfo) -> Size:
    return total(product(info.shapes[tid]) * get_dtype(st).nbytes for tid, st in info.storage.items() if st is not None)


@dataclass(frozen=True)
class _Joined:
    """Items printed with a separator between them, when printed (a constraint's message part)."""

    sep: str
    items: tuple[Any, ...]

    def __str__(self) -> str:
        return self.sep.join(str(i) for i in self.items)


def _check_all_used(sg: SGraph, shapes: Mapping[str, Shape]) -> None:
    used = set(sg.outputs)
    for k in sg.kernels:
        used.update(k.tensor_inputs)
    for t in shapes:
        if t not in used:
            raise SGraphError(f"tensor {t!r} is never used (not an output and not read by a kernel)")


# ---------------------------------------------------------------------------------------------
# JSON


def _size_text(s: Size) -> str | int:
    return s.int_value() if s.is_const() and s.const_value().denominator == 1 else str(s)


def _to_json(sg: SGraph) -> dict[str, Any]:
    kernels: list[dict[str, Any]] = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            entry: dict[str, Any] = {
                "id": k.id, "kind": "library", "op": k.op, "inputs": list(k.inputs), "output": k.output,
            }
            if k.attrs:
                entry["attrs"] = {a: list(v) if isinstance(v, tuple) else v for a, v in k.attrs.items()}
            kernels.append(entry)
            continue
        b = k.block
        kernels.append({
            "id": k.id,
            "kind": "graph",
            "grid": [{"name": a.name, "size": _size_text(a.size)} for a in b.grid],
            "loop": {"name": b.loop.name, "size": _size_text(b.loop.size)},
            "inputs": [{"id": i.id, "tensor": i.tensor, "imap": list(i.imap), "fmap": i.fmap} for i in b.inputs],
            "body": [_op_json(o) for o in b.body],
            "accumulators": [
                {"id": a.id, "source": a.source, "kind": a.kind, **({"dim": a.dim} if a.dim is not None else {})}
                for a in b.accumulators
            ],
            "post": [_op_json(o) for o in b.post],
            "outputs": [{"source": o.source, "tensor": o.tensor, "omap": list(o.omap)} for o in b.outputs],
        })
    return {
        "schema": SCHEMA,
        "name": sg.name,
        "inputs": [{"id": t.id, "shape": list(t.shape), "dtype": t.dtype} for t in sg.inputs],
        "kernels": kernels,
        "outputs": list(sg.outputs),
    }


def _op_json(o: BlockOp) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": o.id, "op": o.op, "inputs": list(o.inputs)}
    if o.attrs:
        entry["attrs"] = {a: list(v) if isinstance(v, tuple) else v for a, v in o.attrs.items()}
    return entry


def _from_json(data: Any) -> SGraph:
    try:
        return _parse(data)
    except SGraphError:
        raise
    except (KeyError, TypeError, ValueError, SizeError) as e:
        raise SGraphError(f"malformed sGraph JSON: {type(e).__name__}: {e}") from None


def _parse(data: Any) -> SGraph:
    if not isinstance(data, dict):
        raise SGraphError("sGraph JSON must be an object")
    if data.get("schema") != SCHEMA:
        raise SGraphError(f"unknown sGraph schema {data.get('schema')!r} (this version reads {SCHEMA!r})")
    try:
        doc = SGraphJSON.model_validate(data)
    except ValidationError as e:
        raise SGraphError(structure_error(e)) from None
    sg = SGraph(tuple(TensorDecl(t.id, tuple(t.shape), t.dtype) for t in doc.inputs),
                tuple(_kernel(k) for k in doc.kernels), tuple(doc.outputs), doc.name)
    analyze(sg)
    return sg


def _kernel(k: LibraryKernelJSON | GraphKernelJSON) -> Kernel:
    if isinstance(k, LibraryKernelJSON):
        return LibraryKernel(k.id, k.op, tuple(k.inputs), dict(k.attrs), k.output)
    return GraphKernel(k.id, BlockGraph(
        grid=tuple(_axis(a) for a in k.grid),
        loop=_axis(k.loop),
        inputs=tuple(BlockInput(i.id, i.tensor, tuple(i.imap), i.fmap) for i in k.inputs),
        body=tuple(_op(o) for o in k.body),
        accumulators=tuple(Accumulator(a.id, a.source, a.kind, a.dim) for a in k.accumulators),
        post=tuple(_op(o) for o in k.post),
        outputs=tuple(BlockOutput(o.source, o.tensor, tuple(o.omap)) for o in k.outputs),
    ))


def _axis(a: AxisJSON) -> Axis:
    return Axis(a.name, Size.of(a.size))


def _op(o: BlockOpJSON) -> BlockOp:
    return BlockOp(o.id, o.op, tuple(o.inputs), dict(o.attrs))


# ---------------------------------------------------------------------------------------------
# Pairing with a program


def check_matches(sg: SGraph, program: Any) -> None:
    """Raise SGraphError unless `sg` reads the program's inputs and writes outputs of its shapes."""
    prog_inputs = {n.id: n for n in program.inputs}
    decl = {t.id: t for t in sg.inputs}
    if set(prog_inputs) != set(decl):
        raise SGraphError(
            f"sGraph inputs {sorted(decl)} do not match the program's inputs {sorted(prog_inputs)}"
        )
    for name, n in prog_inputs.items():
        if tuple(decl[name].shape) != tuple(n.shape) or decl[name].dtype != n.dtype:
            raise SGraphError(
                f"sGraph input {name!r} is {list(decl[name].shape)}:{decl[name].dtype}, "
                f"the program's is {list(n.shape)}:{n.dtype}"
            )
    if len(sg.outputs) != len(program.outputs):
        raise SGraphError(f"sGraph has {len(sg.outputs)} outputs, the program {len(program.outputs)}")
    for o, po in zip(sg.outputs, program.outputs, strict=True):
        want = tuple(Size.const(d) for d in program.nodes[po].shape)
        if sg.info.shapes[o] != want:
            raise SGraphError(
                f"sGraph output {o!r} has shape {ops.fmt_shape(sg.info.shapes[o])}, "
                f"the program's output {po!r} has {ops.fmt_shape(want)}"
            )


def renamed(sg: SGraph, names: Mapping[str, str], name: str | None = None) -> SGraph:
    """The same sGraph with tensors renamed (`names`: old id -> new id, the others kept): a cached
    kernel bound to the names of another program with the same canonical hash."""
    def tensor(t: str) -> str:
        return names.get(t, t)

    kernels: list[Kernel] = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            kernels.append(replace(k, inputs=tuple(map(tensor, k.inputs)), output=tensor(k.output)))
        else:
            b = k.block
            block = replace(b, inputs=tuple(replace(i, tensor=tensor(i.tensor)) for i in b.inputs),
                            outputs=tuple(replace(o, tensor=tensor(o.tensor)) for o in b.outputs))
            kernels.append(replace(k, block=block))
    inputs = tuple(replace(d, id=tensor(d.id)) for d in sg.inputs)
    return SGraph(inputs, tuple(kernels), tuple(map(tensor, sg.outputs)), name or sg.name)


def named_for(program_name: str | None, stored: str) -> str | None:
    """The name of a stored sGraph (`t0.searched`) served to another program with its form: that
    program's, with the stored name's suffix (`.searched`, `.unfused`). None: keep the stored one."""
    return f"{program_name}.{stored.rsplit('.', 1)[1]}" if program_name and "." in stored else None


def rebind(sg: SGraph, inputs: Sequence[TensorDecl], name: str | None = None) -> SGraph:
    """The same structure over inputs of other shapes (shape reuse); analysis is redone."""
    return SGraph(tuple(inputs), sg.kernels, sg.outputs, name or sg.name)
