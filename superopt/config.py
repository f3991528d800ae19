"""Search configuration: the bounds that define the space searched, and their stable hash.

The hash is part of the kernel cache key (and of the shape-reuse key): a winner found in a smaller
space is not the answer for a larger one. Some bounds are chosen per request (`SearchConfig`);
the rest are fixed by this version of the search and kept here, below, so that the space version
in the hash is derived from them and moves whenever one of them does (`space_version`). Budgets
(seconds, states) and memo sizes are not part of it: they decide how long to look and what is
computed again, and a search that ran out of budget says so in its stats.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from superopt.digest import stable_digest

DEFAULT_BUDGET_S = 300.0  # seconds a search may take unless told otherwise (`optimize`, a job)

# -- the fixed bounds of the space (the search imports them from here) ---------------------------
MAX_ACCUMULATORS = 3  # per block graph, as in Mirage's generator
# A program part's block graph (`Generator.program_graphs`) is given, not grown: it may take one
# more, so a norm and the three products that read it (rms_norm before Q, K and V) make one kernel.
PART_ACCUMULATORS = MAX_ACCUMULATORS + 1
# Values a block graph writes: flash decoding writes partial numerators and denominators; a
# program returning more values may write them all from one kernel (`Generator.max_outputs`).
MAX_OUTPUTS = 2
MIDDLES = ("library", "graph")  # kinds of second kernel, in the order graphs of 3+ kernels are grown
SPLIT_KEEP = 8  # partial schedules kept at each point of `program_split`'s cut (the cheapest)
SPLIT_ENDS = 2  # the longest parts with valid sizes tried from each point of `program_split`
GRID_TILES = (8, 16, 32, 64, 128, 256)  # Mirage's 1-D grid candidates: dim / tile for these tiles
LOOP_RANGES = (4, 16, 64)  # Mirage's loop ranges
# Composites with a reduction, and the primitives a fused schedule splits them into.
SPLITTABLE = {
    "rms_norm": ("square", "mean", "add", "sqrt", "div"),
    "softmax": ("sub", "max", "exp", "sum", "div"),
}
UNSUPPORTED = ("transpose", "reshape")  # layout ops stay library kernels; blocks never contain them
# The rules written as code rather than as the numbers above: bump when a change to how the search
# enumerates changes what a configuration covers.
SPACE_RULES = 2  # 2: elementwise chains are one block op


def space_constants() -> dict[str, object]:
    """The fixed bounds of the space by name, as they are now (read at each call, so that a test
    that changes one sees the version move)."""
    return {
        "MAX_ACCUMULATORS": MAX_ACCUMULATORS, "PART_ACCUMULATORS": PART_ACCUMULATORS, "MAX_OUTPUTS": MAX_OUTPUTS,
        "MIDDLES": MIDDLES, "SPLIT_KEEP": SPLIT_KEEP, "SPLIT_ENDS": SPLIT_ENDS, "GRID_TILES": GRID_TILES,
        "LOOP_RANGES": LOOP_RANGES, "SPLITTABLE": SPLITTABLE, "UNSUPPORTED": UNSUPPORTED, "SPACE_RULES": SPACE_RULES,
    }


def space_version() -> str:
    """A digest of the fixed bounds: a change to any of them is a new space, whose cache entries
    are not those of the old one."""
    return stable_digest(space_constants())[:16]


@dataclass(frozen=True)
class SearchConfig:
    max_kernel_ops: int = 5
    max_block_ops: int = 11
    max_grid_axes: int = 3
    max_block_inputs: int = 4  # LoRA's best schedule reads X, W, X @ A and B in one kernel
    concrete: bool = False

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "space_version": space_version()}

    def hash(self) -> str:
        return stable_digest(self.to_json())[:16]
