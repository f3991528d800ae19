"""The cache key (DESIGN.md §8): what must be equal for a stored winner to answer a request.

Canonical program hash + shapes + dtypes + target fingerprint + superopt version + search config
hash. The canonical hash already covers shapes and dtypes; they are kept as their own fields too,
so that rows can be listed and told apart by shape without loading their programs.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from superopt.canonical import canonical_inputs
from superopt.config import SearchConfig
from superopt.core import version as superopt_version
from superopt.db.errors import RequestError
from superopt.program import Program

# What names programs in the cache, wherever a user types it (`cache ls --hash`, `cache invalidate
# --hash`, `GET /cache?hash=`): 4 to 64 lowercase hex digits, a canonical hash or a prefix of one.
HASH_PREFIX = re.compile(r"[0-9a-f]{4,64}")


def check_hash_prefix(text: str) -> str:
    """`text` when it is a hash prefix; else one error naming the rule, the same from the CLI and
    over HTTP. A typo must not quietly match nothing ("invalidated 0") or, shorter than 4
    digits, most of the cache."""
    if not HASH_PREFIX.fullmatch(text):
        raise RequestError("hash", f"expected 4 to 64 lowercase hex digits (a canonical program hash or a prefix), "
                                   f"got {text[:80]!r}")
    return text


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
            program.canonical_hash(), shapes, dtypes, target_fingerprint, superopt_version.__version__,
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
