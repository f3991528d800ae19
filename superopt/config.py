"""Search configuration: the bounds that define the space searched, and their stable hash.

The hash is part of the kernel cache key: a winner found in a smaller space is not the answer for
a larger one. Budgets (seconds, states) are not part of it: they decide how long to look, and a
search that ran out of budget says so in its stats.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

SPACE_VERSION = 1  # bump when the enumeration rules change what a configuration covers
DEFAULT_BUDGET_S = 300.0  # seconds a search may take unless told otherwise (`optimize`, a job)


@dataclass(frozen=True)
class SearchConfig:
    max_kernel_ops: int = 5
    max_block_ops: int = 11
    max_grid_axes: int = 3
    max_block_inputs: int = 4  # LoRA's best schedule reads X, W, X @ A and B in one kernel
    concrete: bool = False

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "space_version": SPACE_VERSION}

    def hash(self) -> str:
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]
