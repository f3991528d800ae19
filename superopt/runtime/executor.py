"""A `CudaProgram` resident on the GPU: device buffers for every tensor and the host plan that
runs its kernels in order (generated kernels through CuPy, library kernels through `LibraryOps`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from superopt.codegen import CudaProgram, LibraryCall
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
        for step in prog.steps:
            if isinstance(step, LibraryCall) and prog.tensors[step.output].dtype == "bf16":
                raise RuntimeError(f"library kernel {step.kernel} ({step.op}) on bf16: CuPy has no bfloat16 arrays")
        self.buffers: dict[str, Any] = {
            t.id: self.cp.empty(t.shape, dtype=STORAGE[t.dtype])
            for t in prog.tensors.values() if t.id not in prog.views
        }
        for view, (stored, perm) in prog.views.items():  # views alias their stored tensor (no copy)
            self.buffers[view] = self.buffers[stored].transpose(perm)

    def set_inputs(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name in self.prog.inputs:
            self.buffers[name].set(encode(inputs[name], self.prog.tensors[name].dtype))

    def poison(self) -> None:
        """Fill every computed tensor with all-ones bytes (NaN in f16, bf16 and f32), so an element
        no kernel writes can never pass a comparison."""
        for name, buf in self.buffers.items():
            if name not in self.prog.inputs and name not in self.prog.views:
                buf.reshape(-1).view(self.cp.uint8).fill(0xFF)

    def run(self) -> None:
        """Enqueue every kernel of the graph on the current stream (no synchronization)."""
        b = self.buffers
        for step in self.prog.steps:
            if isinstance(step, LibraryCall):
                if step.output in self.prog.views:
                    continue
                self.library(step, [b[i] for i in step.inputs], b[step.output])
            else:
                self.functions[step.name](step.grid, step.block, tuple(b[t] for t in step.args),
                                          shared_mem=step.smem_bytes)

    def outputs(self) -> list[np.ndarray]:
        """The program's outputs as float64 host arrays (synchronizes)."""
        return [decode(self.buffers[o].get(), self.prog.tensors[o].dtype) for o in self.prog.outputs]
