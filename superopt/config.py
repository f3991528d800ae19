"""Search configuration: the bounds that define the space searched, and their stable hash.

The hash is part of the kernel cache key (and of the shape-reuse key): a winner found in a smaller
space is not the answer for a larger one. Some bounds are chosen per request (`SearchConfig`);
the rest are fixed by this version of the search and kept here, below, so that the space version
in the hash is derived from them and moves whenever one of them does (`space_version`). Budgets
(seconds, states) and memo sizes are not part of it: they decide how long to look and what is
computed again, and a search that ran out of budget says so in its stats.
"""

from __future__ import annotations

from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any

from superopt.digest import stable_digest
from superopt.ops import LAYOUT, Op
from superopt.targets import TARGETS

DEFAULT_BUDGET_S = 300.0  # seconds a search may take unless told otherwise (`optimize`, a job)
# What a request that names no target gets (CLI, HTTP, Python): the local GPU, measured, when there is
# one, else the cost model's estimates for an H100 (superopt.api.resolve_target).
DEFAULT_TARGET = "auto"
TARGET_HELP = (f"auto: the local GPU (timed) when there is one, else h100 cost-model estimates; "
               f"or one of {', '.join(TARGETS)} (cost-model estimates)")

# -- the service and the workers: what `superopt serve` and `superopt worker` take unless told ---
SERVE_HOST, SERVE_PORT = "127.0.0.1", 8000  # loopback: nothing outside this host reaches it by default
MAX_BODY_BYTES = 1 << 20  # 1 MiB: the largest built-in program JSON is a few KB
BODY_TIMEOUT_S = 10.0  # a 1 MiB body over loopback takes milliseconds
LEASE_S = 60.0  # seconds a claimed job stays a worker's without a heartbeat
MAX_LEASE_S = 3600.0  # the longest lease a worker may take: a dead worker's job waits at most this
MAX_ROWS = 2**62  # the most rows a listing may skip or show (SQL integers are 64-bit)
POLL_S = 1.0  # seconds between a worker's looks at an empty queue
DB_RETRY_S = 600.0  # seconds a worker retries an unreachable database before it exits
# Environment variables the command line reads (through its options, so that --help names them).
DB_URL_ENV = "SUPEROPT_DB_URL"  # superopt.db.engine reads it too, for the Python API
TOKEN_ENV = "SUPEROPT_TOKEN"
HOSTS_ENV = "SUPEROPT_ALLOWED_HOSTS"

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
    Op.RMS_NORM: (Op.SQUARE, Op.MEAN, Op.ADD, Op.SQRT, Op.DIV),
    Op.SOFTMAX: (Op.SUB, Op.MAX, Op.EXP, Op.SUM, Op.DIV),
}
UNSUPPORTED = LAYOUT  # layout ops stay library kernels; blocks never contain them
# The rules written as code rather than as the numbers above: bump when a change to how the search
# enumerates changes what a configuration covers.
# 2: elementwise chains are one block op; 3: scales moved into a product's operand (program forms),
# biases and column scales of a row-summed product taken on the weight (and the rules proving them);
# 4: the oracle admits the program's own inner values (a chain before a row sum)
SPACE_RULES = 4


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


def _bound(default: int, low: int, high: int, meaning: str) -> Any:
    """A search bound with the range a request may ask for and what it means: the CLI's options
    and the HTTP schema (superopt.jobspec.ConfigSpec) take their defaults, ranges and help here."""
    return field(default=default, metadata={"ge": low, "le": high, "description": meaning})


@dataclass(frozen=True)
class SearchConfig:
    """The search bounds a request chooses; every front end's defaults are these."""

    max_kernel_ops: int = _bound(5, 1, 32, "kernels per kernel graph")
    max_block_ops: int = _bound(11, 1, 64, "compute ops per block graph")
    max_grid_axes: int = _bound(3, 1, 3, "grid axes of a graph-defined kernel")
    # LoRA's best schedule reads X, W, X @ A and B in one kernel
    max_block_inputs: int = _bound(4, 1, 16, "inputs per block graph")
    concrete: bool = field(default=False, metadata={
        "description": "enumerate concrete grid/loop sizes and maps (Mirage-style) instead of symbols"})

    def __post_init__(self) -> None:
        """Refuse a bound outside its range, as the CLI and the HTTP schema do (Python does not
        check the annotations): `max_kernel_ops=0` would search nothing and return the baseline."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in (bool, "bool"):
                if not isinstance(value, bool):
                    raise ValueError(f"config.{f.name}: must be true or false, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or \
                    not f.metadata["ge"] <= value <= f.metadata["le"]:
                raise ValueError(f"config.{f.name}: must be an integer from {f.metadata['ge']} to {f.metadata['le']} "
                                 f"({f.metadata['description']}), got {value!r}")

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "space_version": space_version()}

    def hash(self) -> str:
        return stable_digest(self.to_json())[:16]


DEFAULT_CONFIG = SearchConfig()


def bound(name: str) -> Field[Any]:
    """The dataclass field of the search bound `name`: its default and, in `metadata`, its range
    ("ge", "le") and meaning ("description"), as pydantic's Field takes them."""
    return next(f for f in fields(SearchConfig) if f.name == name)
