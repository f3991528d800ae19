"""The cache key (DESIGN.md §8): what must be equal for a stored winner to answer a request.

Canonical program hash + shapes + dtypes + target fingerprint + superopt version + search config
hash. The canonical hash already covers shapes and dtypes; they are kept as their own fields too,
so that rows can be listed and told apart by shape without loading their programs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import superopt
from superopt.canonical import canonical_inputs
from superopt.config import SearchConfig
from superopt.program import Program


@dataclass(frozen=True)
class CacheKey:
    program_hash: str
    shapes: str  # JSON: input shapes in canonical order, then output shapes
    dtypes: str  # JSON: dtypes in the same order
    target_fingerprint: str
    version: str
    config_hash: str

    @staticmethod
    def of(program: Program, target_fingerprint: str, config: SearchConfig | None = None) -> CacheKey:
        shapes, dtypes = signature(program)
        return CacheKey(
            program.canonical_hash(), shapes, dtypes, target_fingerprint, superopt.__version__,
            (config or SearchConfig()).hash(),
        )

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def signature(program: Program) -> tuple[str, str]:
    """(shapes, dtypes) as compact JSON text in canonical order: stable across node names."""
    nodes = [program.nodes[i] for i in canonical_inputs(program)] + [program.nodes[o] for o in program.outputs]
    shapes = json.dumps([list(n.shape) for n in nodes], separators=(",", ":"))
    dtypes = json.dumps([n.dtype or "f32" for n in nodes], separators=(",", ":"))
    return shapes, dtypes
