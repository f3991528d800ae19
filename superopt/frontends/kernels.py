"""How an imported program runs on PyTorch tensors: its proved kernels on the GPU, or torch eager.

`KernelPath` decides once per program: a proved winner from the kernel cache (or from a search,
when asked for one), a GPU, and code that generates; without any of them the caller runs the
model eagerly, and the reason is logged once. `TorchKernels` runs the kernels on the caller's
torch tensors in place: inputs and outputs are shared with CuPy through DLPack (no copies, on
torch's current stream); only the intermediate tensors are the runtime's own buffers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from superopt.codegen import LibraryCall
from superopt.config import DEFAULT_BUDGET_S, SearchConfig
from superopt.frontends.aten import TORCH_DTYPES
from superopt.program import Program
from superopt.runtime.executor import DeviceProgram
from superopt.runtime.tensors import STORAGE

if TYPE_CHECKING:
    from superopt.core.result import Result

log = logging.getLogger("superopt.torch")

# The device type kernels read tensors on (tests fake a GPU with CPU tensors and numpy for CuPy).
KERNEL_DEVICE = "cuda"
NO_GPU = "no GPU"
_told_no_gpu = False


@dataclass(frozen=True)
class SearchOptions:
    """What `superopt.compile` and the torch.compile backend pass to `superopt.optimize`, plus
    `search`: without it a program is only looked up in the kernel cache (a miss runs eager)."""

    search: bool = False
    target: str = "auto"
    budget_s: float | None = DEFAULT_BUDGET_S
    max_states: int | None = None
    config: SearchConfig | None = None
    force: bool = False
    cache: bool = True
    db: str | None = None
    workers: int | None = None
    ray_address: str | None = None

    def optimize_options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "search"}


def optimized(program: Program, options: SearchOptions) -> Result | None:
    """The program's proved winner: searched when asked, else the kernel cache's (None on a miss)."""
    from superopt.api import optimize, resolve_target

    if options.search:
        return optimize(program, **options.optimize_options())
    if not options.cache:
        return None
    from superopt.db.cache import KernelCache
    from superopt.db.engine import open_database

    choice = resolve_target(options.target)
    return KernelCache(open_database(options.db)).lookup(
        program, choice.fingerprint, options.config or SearchConfig(), budget_s=options.budget_s,
        max_states=options.max_states)


class TorchKernels(DeviceProgram):
    """A `DeviceProgram` whose inputs and outputs are the caller's torch tensors."""

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Run on `inputs` (by program input id; contiguous, on one device) into fresh outputs."""
        device = next(iter(inputs.values())).device
        arrays = {name: self._array(inputs[name]) for name in self.prog.inputs}
        outputs: dict[str, torch.Tensor] = {}
        for name in self.prog.outputs:
            if name not in self.aliases:
                t = self.prog.tensors[name]
                outputs[name] = torch.empty(t.shape, dtype=TORCH_DTYPES[t.dtype], device=device)
                arrays[name] = self._array(outputs[name])
        self._bind(arrays)
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        with self.cp.cuda.ExternalStream(stream):
            self.run()
        # An output that is a view of another tensor is copied out of the runtime's buffer.
        return [outputs[o] if o in outputs else self._tensor(self.buffers[o], self.prog.tensors[o].dtype).clone()
                for o in self.prog.outputs]

    def _array(self, t: torch.Tensor) -> Any:
        """A CuPy array sharing `t`'s memory (bf16 as its uint16 bit patterns, as kernels read it)."""
        t = t.detach()
        if t.dtype == torch.bfloat16:
            return self.cp.from_dlpack(t.view(torch.int16)).view(STORAGE["bf16"])
        return self.cp.from_dlpack(t)

    @staticmethod
    def _tensor(array: Any, dtype: str) -> torch.Tensor:
        t = torch.from_dlpack(array)
        return t.view(torch.bfloat16) if dtype == "bf16" else t

    def _bind(self, arrays: Mapping[str, Any]) -> None:
        """Make `arrays` the buffers of their tensors, and re-derive every view of them as
        `DeviceProgram` derives its aliases (a view of an input must read this call's input)."""
        self.buffers.update(arrays)
        prog = self.prog
        for step in prog.steps:
            if isinstance(step, LibraryCall) and step.output in self.aliases:
                if step.output in prog.reshaped_views:
                    self.buffers[step.output] = self.buffers[prog.reshaped_views[step.output]]
                    continue
                stored, perm = prog.views.get(step.output, (step.inputs[0], None))
                base = self.buffers[stored]
                shape = prog.tensors[step.output].shape
                self.buffers[step.output] = base.transpose(perm) if perm else base.reshape(shape)


class KernelPath:
    """A program's way to run, decided once: `kernels` when a proved winner, a GPU and its
    generated code are all there; else None, with `reason` (logged once) and eager it is."""

    def __init__(self, program: Program, options: SearchOptions, what: str) -> None:
        self.program = program
        self.result = optimized(program, options)
        self.kernels: TorchKernels | None = None
        self.reason = self._prepare(options)
        self._told_off_device = False
        global _told_no_gpu
        if self.kernels is not None:
            log.info("%s: %s", what, self.describe())
        elif self.reason.startswith(NO_GPU):
            if not _told_no_gpu:  # said once: without a GPU nothing runs kernels
                _told_no_gpu = True
                log.warning("superopt runs torch eager: %s", self.reason)
        else:
            log.warning("%s: runs torch eager: %s", what, self.reason)

    def _prepare(self, options: SearchOptions) -> str:
        import superopt.runtime
        from superopt.api import resolve_target
        from superopt.codegen import CodegenError, generate
        from superopt.instantiate import instantiate
        from superopt.runtime import GpuUnavailable

        ok, why = superopt.runtime.gpu_available()
        if not ok:
            return f"{NO_GPU} ({why})"
        if self.result is None:
            where = "in the kernel cache" if options.cache else "(the kernel cache is off)"
            return f"no proved kernel {where} for this program (search=True searches for one)"
        best = self.result.best
        try:
            prog = generate(instantiate(best.sgraph, best.params, resolve_target(options.target).target))
            self.kernels = TorchKernels(prog)
        except (CodegenError, GpuUnavailable, RuntimeError) as e:
            return f"its kernels cannot run here: {e}"
        return ""

    def describe(self) -> str:
        r = self.result
        if r is None:
            return "no proved kernel"
        best = r.best
        return (f"{best.kernels} kernel(s), {best.time_us:.2f} us ({best.time_source}) against "
                f"{r.baseline.time_us:.2f} us unfused: {r.speedup:.2f}x on {r.target}")

    def run(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor] | None:
        """The program's outputs from the kernels, or None where they cannot run on these tensors
        (no kernels; tensors not on the GPU): the caller runs eager."""
        if self.kernels is None:
            return None
        if any(t.device.type != KERNEL_DEVICE for t in inputs.values()):
            if not self._told_off_device:
                self._told_off_device = True
                log.warning("%s: runs torch eager: its inputs are not on %s", self.program.name, KERNEL_DEVICE)
            return None
        for name, t in inputs.items():  # the kernels read raw memory: a changed weight must not reach them
            node = self.program.nodes[name]
            if tuple(t.shape) != node.shape or t.dtype != TORCH_DTYPES[node.dtype or "f32"]:
                raise ValueError(f"{self.program.name}: input {name!r} is {tuple(t.shape)} {t.dtype}; the program "
                                 f"was compiled for {node.shape} {TORCH_DTYPES[node.dtype or 'f32']}")
        return self.kernels({k: v.contiguous() for k, v in inputs.items()})
