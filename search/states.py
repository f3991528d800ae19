"""The states of the kernel-level search: the tensors a partial kernel graph holds, the graph
itself, and a first kernel ranked by its least estimated time (`search.kernel`, `search.floors`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from superopt.search.tiling import Chunk
from superopt.sgraph import Kernel
from superopt.sizes import Size
from superopt.verifier.oracle import AE


@dataclass(frozen=True)
class KTensor:
    id: str
    shape: tuple[Size, ...]
    ae: AE
    classes: tuple[int, ...]  # program dim class of each dim
    chunk: Chunk | None = None

    @cached_property
    def leaves(self) -> frozenset[str]:
        """The program inputs its value reads (asked of the same tensors in state after state)."""
        return frozenset(input_leaves(self.ae))


@dataclass(frozen=True)
class KState:
    tensors: tuple[KTensor, ...]
    kernels: tuple[Kernel, ...]
    last_key: tuple[Any, ...]
    graph_kernels: int = 0


@dataclass(frozen=True)
class FirstKernel:
    """A state of one first kernel (not the last), ranked among those computing the same values
    (`undominated`): its least estimated time per chunk count and its prefix sGraph's text;
    `floors` is None when not known (then it is never cut)."""

    state: KState
    floors: dict[int, float] | None
    text: str


def input_leaves(e: AE) -> set[str]:
    """The program inputs an abstract expression reads."""
    if e[0] == "inp":
        return {e[1]}
    return set().union(*(input_leaves(k) for k in e[1:] if isinstance(k, tuple))) if len(e) > 1 else set()
