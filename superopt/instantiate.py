"""Instantiation: assign integers to an sGraph's symbols and check every constraint.

`instantiate` returns an `Instance` (the sGraph plus its values, with concrete shapes) or raises
`InstantiationError` naming the first violated constraint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from superopt.object_cache import ObjectCache
from superopt.sgraph import Constraint, GraphKernel, SGraph
from superopt.sizes import Size, compile_sizes
from superopt.targets import Target


class InstantiationError(ValueError):
    """Values that break a constraint (or name unknown symbols); `constraint` says which."""

    def __init__(self, message: str, constraint: Constraint | None = None) -> None:
        super().__init__(message)
        self.constraint = constraint


@dataclass(frozen=True)
class Instance:
    sgraph: SGraph
    values: Mapping[str, Any]  # ints; or numpy int64 columns, one element per assignment (bulk estimates)
    target: Target
    _cache: dict[object, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    def size(self, s: Size) -> int:
        return s.int_value(self.values)

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self._sizes(tensor, ("tensor", tensor))

    def tile(self, kernel: str, block_tensor: str) -> tuple[int, ...]:
        return self._sizes((kernel, block_tensor), kernel)

    def grid(self, k: GraphKernel) -> tuple[int, ...]:
        return self._sizes(("grid", k.id), k.id)

    def loop(self, k: GraphKernel) -> int:
        return self._sizes(("loop", k.id), k.id)[0]

    def smem(self, k: GraphKernel) -> int:
        return self._sizes(("smem", k.id), k.id)[0]

    def _sizes(self, key: object, owner: str | tuple[str, str]) -> tuple[int, ...]:
        """The sizes under `key`; on a miss, all the sizes of its owner (a kernel, or one tensor)
        are evaluated together. Values may be numpy columns: the sizes are columns too."""
        hit = self._cache.get(key)
        if hit is None:
            evaluators = self.sgraph.info.evaluators
            if owner not in evaluators:
                evaluators[owner] = _SizeSlots.of(self.sgraph, owner)
            evaluators[owner].fill(self.values, self._cache)
            hit = self._cache[key]
        return hit

    def params_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.values.items()))


@dataclass(frozen=True)
class _SizeSlots:
    """The sizes of one kernel that its estimate reads (its tensors' shapes; for a graph kernel
    also tiles, grid, loop and shared memory), or of one tensor, evaluated by one compiled
    function: the cost model's inner loop."""

    slots: tuple[tuple[object, int, int], ...]  # Instance cache key, start, stop in the values
    evaluate: Callable[[Mapping[str, int]], tuple[int, ...]]

    @staticmethod
    def of(sg: SGraph, owner: str | tuple[str, str]) -> _SizeSlots:
        """Compiled once per graph kernel object and input shapes: a search ranks many sGraphs
        that share kernel objects."""
        k = None if isinstance(owner, tuple) else sg.kernel(owner)
        if not isinstance(k, GraphKernel):
            return _SizeSlots._build(sg, owner)
        shapes = tuple(sg.info.shapes[t] for t in k.tensor_inputs)
        return _GRAPH_KERNEL_SLOTS.get(k, shapes, lambda: _SizeSlots._build(sg, owner))

    @staticmethod
    def _build(sg: SGraph, owner: str | tuple[str, str]) -> _SizeSlots:
        info = sg.info
        if isinstance(owner, tuple):
            groups: list[tuple[object, Sequence[Size]]] = [(owner[1], info.shapes[owner[1]])]
        else:
            k = sg.kernel(owner)
            groups = [(t, info.shapes[t]) for t in (*k.tensor_inputs, *k.outputs)]
            if isinstance(k, GraphKernel):
                smem = [c.expr for c in info.constraints if c.kernel == k.id and c.kind == "smem"]
                groups += [((k.id, bt), shape) for bt, shape in info.blocks[k.id].shapes.items()]
                groups += [(("grid", k.id), [a.size for a in k.block.grid]), (("loop", k.id), [k.block.loop.size]),
                           (("smem", k.id), smem)]
        slots: list[tuple[object, int, int]] = []
        sizes: list[Size] = []
        for key, group in groups:
            slots.append((key, len(sizes), len(sizes) + len(group)))
            sizes.extend(group)
        return _SizeSlots(tuple(slots), compile_sizes(sizes))

    def fill(self, values: Mapping[str, int], cache: dict[object, tuple[int, ...]]) -> None:
        ints = self.evaluate(values)
        for key, start, stop in self.slots:
            cache[key] = ints[start:stop]


_GRAPH_KERNEL_SLOTS: ObjectCache[GraphKernel, _SizeSlots] = ObjectCache(4096)


def instantiate(sg: SGraph, values: Mapping[str, int], target: Target) -> Instance:
    info = sg.info
    unknown = set(values) - info.symbols
    if unknown:
        raise InstantiationError(
            f"unknown parameter(s) {', '.join(sorted(unknown))}; this sGraph's symbols are "
            f"{', '.join(sorted(info.symbols)) or '(none)'}"
        )
    missing = info.symbols - set(values)
    if missing:
        raise InstantiationError(f"no value for {', '.join(sorted(missing))}")
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InstantiationError(f"parameter {name}={v!r} must be a positive integer")
    ordered = sorted(info.constraints, key=lambda c: ("divides", "blocks", "smem").index(c.kind))
    for c in ordered:
        got = c.expr.evaluate(values)
        if c.kind == "divides" and (got.denominator != 1 or got < 1):
            raise InstantiationError(f"constraint violated: {c.describe()} (it gives {got})", c)
        if c.kind == "blocks" and got > target.max_blocks:
            raise InstantiationError(
                f"constraint violated: kernel {c.kernel}: {int(got)} blocks exceed the cap of {target.max_blocks}", c
            )
        if c.kind == "smem" and got > target.smem_per_block:
            raise InstantiationError(
                f"constraint violated: kernel {c.kernel}: shared memory {int(got)} bytes exceeds "
                f"{target.name}'s {target.smem_per_block} bytes per block", c
            )
    return Instance(sg, dict(values), target)


def parse_params(text: str) -> dict[str, int]:
    """'gx=8,F=4' -> {'gx': 8, 'F': 4}."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise InstantiationError(f"bad parameter {part!r}; expected name=value")
        if name.strip() in out:
            raise InstantiationError(f"parameter {name.strip()} is given twice")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise InstantiationError(f"parameter {name.strip()}={value!r} is not an integer") from None
    return out
