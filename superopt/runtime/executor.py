"""A `CudaProgram` resident on the GPU: device buffers for every tensor and the host plan that
runs its kernels in order (generated kernels through CuPy, library kernels through `LibraryOps`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from superopt.codegen import CudaProgram, LibraryCall
from superopt.ops import Op
from superopt.runtime.compiler import kernel_functions
from superopt.runtime.device import require_cupy
from superopt.runtime.library import LibraryOps
from superopt.runtime.tensors import STORAGE, decode, encode


class DeviceProgram:
    def __init__(self, prog: CudaProgram) -> None:
        self.cp = require_cupy()
        self.prog = prog
        self.functions = kernel_functions(prog) if prog.launches else {}
        self.library = LibraryOps(self.cp)
        # Views alias their stored tensor (no buffer, no copy), and so does a reshape of a
        # contiguous tensor, and one of a transposed view that only generated kernels read (they
        # index the stored tensor's memory themselves); any other reshape of a transposed view is
        # a copy, run like any library kernel.
        self.aliases: set[str] = set(prog.views) | set(prog.reshaped_views)
        for step in prog.steps:
            if isinstance(step, LibraryCall) and step.op == Op.RESHAPE and step.inputs[0] not in prog.views:
                self.aliases.add(step.output)
        for step in prog.steps:  # aliases run no CuPy kernel
            if isinstance(step, LibraryCall) and step.output not in self.aliases and \
                    prog.tensors[step.output].dtype == "bf16":
                raise RuntimeError(f"library kernel {step.kernel} ({step.op}) on bf16: CuPy has no bfloat16 arrays")
        self.buffers: dict[str, Any] = {}
        for t in prog.tensors.values():
            if t.id not in self.aliases:
                self.buffers[t.id] = self.cp.empty(t.shape, dtype=STORAGE[t.dtype])
        for step in prog.steps:  # in order: a reshape may alias an alias
            if isinstance(step, LibraryCall) and step.output in prog.reshaped_views:
                self.buffers[step.output] = self.buffers[prog.reshaped_views[step.output]]  # its memory
            elif isinstance(step, LibraryCall) and step.output in self.aliases:
                stored, perm = prog.views.get(step.output, (step.inputs[0], None))
                base = self.buffers[stored]
                shape = prog.tensors[step.output].shape
                self.buffers[step.output] = base.transpose(perm) if perm else base.reshape(shape)

    @property
    def launches(self) -> int:
        """Kernels a run launches: every step but constants (launch arguments) and aliases."""
        return sum(1 for s in self.prog.steps if not (isinstance(s, LibraryCall) and
                                                       (s.op == Op.CONST or s.output in self.aliases)))

    def set_inputs(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name in self.prog.inputs:
            self.buffers[name].set(encode(inputs[name], self.prog.tensors[name].dtype))

    def poison(self) -> None:
        """Fill every computed tensor with all-ones bytes (NaN in f16, bf16 and f32), so an element
        no kernel writes can never pass a comparison."""
        for name, buf in self.buffers.items():
            if name not in self.prog.inputs and name not in self.aliases:
                buf.reshape(-1).view(self.cp.uint8).fill(0xFF)

    def run(self) -> None:
        """Enqueue every kernel of the graph on the current stream (no synchronization)."""
        b = self.buffers
        for step in self.prog.steps:
            if isinstance(step, LibraryCall):
                if step.output in self.aliases:
                    continue
                self.library(step, [b[i] for i in step.inputs], b[step.output])
            else:
                self.functions[step.name](step.grid, step.block, tuple(b[t] for t in step.args),
                                          shared_mem=step.smem_bytes)

    def outputs(self) -> list[np.ndarray]:
        """The program's outputs as float64 host arrays (synchronizes)."""
        return [decode(self.buffers[o].get(), self.prog.tensors[o].dtype) for o in self.prog.outputs]
