"""Instantiation: assign integers to an sGraph's symbols and check every constraint.

`instantiate` returns an `Instance` (the sGraph plus its values, with concrete shapes) or raises
`InstantiationError` naming the first violated constraint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from superopt.ops import Shape
from superopt.sgraph import Constraint, GraphKernel, SGraph
from superopt.sizes import Size
from superopt.targets import Target


class InstantiationError(ValueError):
    """Values that break a constraint (or name unknown symbols); `constraint` says which."""

    def __init__(self, message: str, constraint: Constraint | None = None) -> None:
        super().__init__(message)
        self.constraint = constraint


@dataclass(frozen=True)
class Instance:
    sgraph: SGraph
    values: Mapping[str, int]
    target: Target
    _cache: dict[object, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    def size(self, s: Size) -> int:
        return s.int_value(self.values)

    def _ints(self, key: object, shape: Shape) -> tuple[int, ...]:
        if key not in self._cache:
            self._cache[key] = tuple(self.size(d) for d in shape)
        return self._cache[key]

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self._ints(tensor, self.sgraph.info.shapes[tensor])

    def tile(self, kernel: str, block_tensor: str) -> tuple[int, ...]:
        return self._ints((kernel, block_tensor), self.sgraph.info.blocks[kernel].shapes[block_tensor])

    def grid(self, k: GraphKernel) -> tuple[int, ...]:
        return tuple(self.size(a.size) for a in k.block.grid)

    def loop(self, k: GraphKernel) -> int:
        return self.size(k.block.loop.size)

    def smem(self, k: GraphKernel) -> int:
        return self.size_of_constraint(k.id, "smem")

    def size_of_constraint(self, kernel: str, kind: str) -> int:
        for c in self.sgraph.info.constraints:
            if c.kernel == kernel and c.kind == kind:
                return c.expr.int_value(self.values)
        raise KeyError((kernel, kind))

    def params_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.values.items()))


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
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise InstantiationError(f"parameter {name.strip()}={value!r} is not an integer") from None
    return out
