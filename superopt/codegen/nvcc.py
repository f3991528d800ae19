"""Compile generated source with nvcc (no GPU needed) and read ptxas's resource report.

`nvcc -arch=sm_90 -cubin -Xptxas -v` proves the source compiles for the device and says what
each kernel costs: registers per thread, static shared memory, stack frame and spill bytes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_ARCH = "sm_90"


class NvccError(RuntimeError):
    """nvcc is missing or rejected the source (the message holds its diagnostics)."""


@dataclass(frozen=True)
class KernelResources:
    name: str
    registers: int
    static_smem_bytes: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> list[KernelResources]:
    """Per kernel, the resources in ptxas's verbose log (device helpers are inlined)."""
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, tuple[int, int]] = {}
    entry = frame_of = ""
    for line in log.splitlines():
        if m := _PROPERTIES.search(line):
            frame_of = m.group(1)
        elif (m := _FRAME.search(line)) and frame_of:
            frames[frame_of] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            frame_of = ""
        if m := _ENTRY.search(line):
            entry = m.group(1)
        elif (m := _REGISTERS.search(line)) and entry:
            smem = _SMEM.search(line)
            used[entry] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
    return [KernelResources(name, regs, smem, *frames.get(name, (0, 0, 0))) for name, (regs, smem) in used.items()]


def compile_report(source: str, arch: str = DEFAULT_ARCH, timeout_s: float = 300) -> list[KernelResources]:
    """Compile `source` to a cubin for `arch`; the resources of each `__global__` function."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise NvccError("nvcc is not on PATH")
    with tempfile.TemporaryDirectory(prefix="superopt-nvcc-") as d:
        src = Path(d) / "kernels.cu"
        src.write_text(source)
        cmd = [nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", str(Path(d) / "kernels.cubin"), str(src)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        raise NvccError(f"nvcc failed:\n{res.stderr[-4000:]}")
    return parse_ptxas(res.stderr + res.stdout)
