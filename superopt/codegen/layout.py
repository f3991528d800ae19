"""Memory layout of a generated kernel: shared-memory slots and how tiles sit in device tensors.

Shared memory holds exactly the tiles the sGraph's storage plan stores, densely, row-major, with
no padding, so a kernel uses precisely the bytes the search's shared-memory constraint checked.
Slots are ordered by decreasing power-of-two alignment of their byte size, which puts every slot
at an offset aligned to its own size's alignment (32 bytes for any WMMA operand, 16 for vector
copies) without a single byte of padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from superopt.dtypes import dtype as get_dtype

MAX_ALIGN = 128
VECTOR_TYPES = {16: "uint4", 8: "uint2", 4: "unsigned int"}


@dataclass(frozen=True)
class Slot:
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def alignment(nbytes: int) -> int:
    """The largest power of two dividing nbytes, capped at MAX_ALIGN."""
    return min(MAX_ALIGN, nbytes & -nbytes) if nbytes else MAX_ALIGN


def smem_slots(stored: list[tuple[str, str, tuple[int, ...]]]) -> list[Slot]:
    """Slots for (tensor, dtype, shape) in definition order; returned in address order."""
    sized = [(t, d, s, math.prod(s) * get_dtype(d).nbytes) for t, d, s in stored]
    order = sorted(range(len(sized)), key=lambda i: (-alignment(sized[i][3]), i))
    slots, offset = [], 0
    for i in order:
        t, d, s, n = sized[i]
        slots.append(Slot(t, d, s, offset, n))
        offset += n
    return slots


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


@dataclass(frozen=True)
class TileRuns:
    """A tile of a device tensor seen as `rows` contiguous runs of `run` elements.

    The run is the trailing tile dims that span their whole tensor dim, times the first one that
    does not (`split_dim`); the outer dims `shape[:split_dim]` enumerate the runs. Every run starts
    at a multiple of `run` elements in the tensor, so a vector width that divides the run's bytes
    is always aligned.
    """

    shape: tuple[int, ...]
    full: tuple[int, ...]
    split_dim: int
    run: int

    @property
    def rows(self) -> int:
        return math.prod(self.shape[: self.split_dim])


def tile_runs(tile: tuple[int, ...], full: tuple[int, ...]) -> TileRuns:
    split = 0
    for d in range(len(tile) - 1, -1, -1):
        if tile[d] != full[d]:
            split = d
            break
    return TileRuns(tile, full, split, math.prod(tile[split:]))


def vector_bytes(run: int, elem_bytes: int) -> int:
    """Widest copy unit (16, 8 or 4 bytes, else one element) that divides a run."""
    for v in (16, 8, 4):
        if v > elem_bytes and (run * elem_bytes) % v == 0:
            return v
    return elem_bytes
