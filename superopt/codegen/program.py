"""What code generation produces: CUDA source plus the host plan that runs a whole kernel graph.

A `CudaProgram` is self-contained: the source holds one `__global__` function per graph-defined
kernel; `steps` lists every kernel of the sGraph in order, each either a `KernelLaunch` (grid,
block, dynamic shared memory, argument tensors) or a `LibraryCall` (one program op that the host
runs with a library, e.g. cuBLAS through CuPy). Runtimes (CuPy on a GPU, the CPU emulation
harness in the tests) walk `steps` and allocate `tensors`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from superopt.sgraph import LibraryKernel, TensorDecl

THREADS_PER_BLOCK = 128
STATIC_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in to more dynamic shared memory


class CodegenError(ValueError):
    """An instance the code generator cannot express (the message says what and why)."""


@dataclass(frozen=True)
class KernelLaunch:
    """One launch of a generated `__global__` function."""

    kernel: str  # sGraph kernel id
    name: str  # C function name
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory, exactly the storage plan's bytes
    args: tuple[str, ...]  # tensor names, in parameter order: inputs, then outputs
    outputs: tuple[str, ...]
    wmma: bool  # uses tensor cores (WMMA)

    @property
    def needs_smem_opt_in(self) -> bool:
        return self.smem_bytes > STATIC_SMEM_LIMIT

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "kind": "graph",
            "name": self.name,
            "grid": list(self.grid),
            "block": list(self.block),
            "smem_bytes": self.smem_bytes,
            "args": list(self.args),
            "outputs": list(self.outputs),
            "tensor_cores": self.wmma,
        }


@dataclass(frozen=True)
class LibraryCall(LibraryKernel):
    """A pre-defined kernel as a step of the host plan: the sGraph's library kernel (one program op
    on whole tensors, run on the host side by a library), in the launch plan's JSON."""

    @property
    def kernel(self) -> str:
        return self.id

    def to_json(self) -> dict[str, Any]:
        attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in self.attrs.items()}
        return {
            "kernel": self.kernel, "kind": "library", "op": self.op, "inputs": list(self.inputs),
            "attrs": attrs, "output": self.output,
        }


Step = KernelLaunch | LibraryCall


@dataclass(frozen=True)
class CudaProgram:
    source: str
    steps: tuple[Step, ...]
    tensors: Mapping[str, TensorDecl]  # every tensor of the kernel graph
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, int] = field(default_factory=dict)
    views: Mapping[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # `SGraph.views`: no buffer, no copy
    # `SGraph.reshaped_views`, each to its stored tensor: no buffer, no copy, read by generated kernels only
    reshaped_views: Mapping[str, str] = field(default_factory=dict)

    def stored(self, tensor: str) -> str | None:
        """The tensor whose memory a view or a reshaped view reads (None for any other tensor)."""
        return self.views[tensor][0] if tensor in self.views else self.reshaped_views.get(tensor)

    @property
    def launches(self) -> tuple[KernelLaunch, ...]:
        return tuple(s for s in self.steps if isinstance(s, KernelLaunch))

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    def launch_json(self) -> list[dict[str, Any]]:
        """Per kernel, in order: what `Candidate.launch` holds."""
        return [{**s.to_json(), "view_of": stored} if isinstance(s, LibraryCall) and (stored := self.stored(s.output))
                else s.to_json() for s in self.steps]
