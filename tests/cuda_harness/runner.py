"""Run a generated `CudaProgram` on the CPU: the same CUDA source, compiled by g++ against the
emulation headers in `include/`, launched over the whole grid; library kernels run in numpy.

Every launch gets its argument tensors in files with guard bytes around each tensor. Outputs start
poisoned (0xFF bytes: NaN in f16, bf16 and f32), so an element no block writes fails any
comparison; guard bytes that change mean a block wrote outside its tensor. A crash, a deadlock or
a misaligned access ends the kernel's process and raises `HarnessError`.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from superopt.codegen import CudaProgram, KernelLaunch, LibraryCall
from superopt.dtypes import dtype as get_dtype
from superopt.primitives import apply
from superopt.reference import FloatAlgebra
from superopt.runtime.tensors import STORAGE, decode, encode

INCLUDE = Path(__file__).parent / "include"
CXX_FLAGS = ("-std=c++17", "-O1", "-fno-strict-aliasing", "-Wall", "-Werror", "-Wno-unknown-pragmas")
POISON = 0xFF
GUARD = 256

_work = Path(tempfile.mkdtemp(prefix="superopt-cuda-emu-"))
atexit.register(shutil.rmtree, _work, True)
_binaries: dict[str, Path] = {}


class HarnessError(RuntimeError):
    """The emulated program did not compile, crashed, deadlocked or wrote out of bounds."""


def gxx() -> str | None:
    return shutil.which("g++")


def _headers_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(INCLUDE.iterdir()):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


_HEADERS = _headers_digest()


def _driver(prog: CudaProgram) -> str:
    entries = ", ".join(f"SO_EMU_KERNEL({ln.name})" for ln in prog.launches)
    return f'#include "program.cu"\n#include "so_driver.h"\nSO_EMU_MAIN({entries})\n'


def compile_program(prog: CudaProgram) -> Path:
    """The emulation binary for `prog`, built once per source within this session."""
    key = hashlib.sha256((_HEADERS + " ".join(CXX_FLAGS) + prog.source + _driver(prog)).encode()).hexdigest()[:24]
    if key in _binaries:
        return _binaries[key]
    d = _work / key
    d.mkdir(exist_ok=True)
    (d / "program.cu").write_text(prog.source)
    (d / "driver.cpp").write_text(_driver(prog))
    cmd = [gxx() or "g++", *CXX_FLAGS, "-I", str(INCLUDE), "-include", "cuda_emu.h", "driver.cpp", "-o", "emu"]
    res = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    if res.returncode != 0:
        raise HarnessError(f"g++ failed for {d / 'program.cu'}:\n{res.stderr[-4000:]}")
    _binaries[key] = d / "emu"
    return d / "emu"


def compile_all(progs: Sequence[CudaProgram], workers: int = 2) -> None:
    """Build several binaries in parallel (the cache then serves `run`)."""
    distinct = {p.source_hash: p for p in progs if p.launches}
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(compile_program, distinct.values()))


def _library(call: LibraryCall, prog: CudaProgram, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """A pre-defined kernel as the interpreter defines it: computed in float32, stored in its dtype."""
    dt = get_dtype(prog.tensors[call.output].dtype)
    alg = FloatAlgebra(dt)
    args = [alg.cast(values[i]) for i in call.inputs]
    out = apply(alg, call.op, args, call.attrs, [prog.tensors[i].shape for i in call.inputs])
    return np.asarray(dt.round(out), dtype=np.float64)


def _launch(binary: Path, launch: KernelLaunch, prog: CudaProgram, values: dict[str, np.ndarray], d: Path) -> None:
    specs, files = [], {}
    for j, t in enumerate(launch.args):
        spec = prog.tensors[t]
        nbytes = math.prod(spec.shape) * get_dtype(spec.dtype).nbytes
        pad = GUARD + -(-nbytes // GUARD) * GUARD
        buf = np.full(2 * pad + nbytes, POISON, dtype=np.uint8)
        written = t in launch.outputs
        if not written:  # a view's bytes are its stored tensor's, in that tensor's order
            stored = prog.stored(t) or t
            buf[pad : pad + nbytes] = encode(values[stored], spec.dtype).view(np.uint8).reshape(-1)
        path = d / f"{launch.name}.{j}.bin"
        path.write_bytes(buf.tobytes())
        files[t] = (path, pad, nbytes)
        specs.append(f"{'w' if written else 'r'}:{path}:{pad}")
    grid = [str(g) for g in launch.grid]
    res = subprocess.run([str(binary), launch.name, *grid, str(launch.smem_bytes), *specs],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise HarnessError(f"{launch.name} failed (exit {res.returncode}): {res.stderr.strip()[-2000:]}")
    for t in launch.outputs:
        path, pad, nbytes = files[t]
        raw = path.read_bytes()
        guards = np.frombuffer(raw[:pad] + raw[pad + nbytes :], dtype=np.uint8)
        if np.any(guards != POISON):
            raise HarnessError(f"{launch.name} wrote outside tensor {t!r}")
        spec = prog.tensors[t]
        values[t] = decode(np.frombuffer(raw[pad : pad + nbytes], dtype=STORAGE[spec.dtype]), spec.dtype).reshape(spec.shape)


def run(prog: CudaProgram, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run every kernel of the program in order; returns its outputs as float64 arrays."""
    values: dict[str, np.ndarray] = {}
    for name in prog.inputs:
        dt = prog.tensors[name].dtype
        values[name] = decode(encode(inputs[name], dt), dt)
    binary = compile_program(prog) if prog.launches else None
    with tempfile.TemporaryDirectory(dir=_work) as tmp:
        for step in prog.steps:
            if isinstance(step, LibraryCall):
                values[step.output] = _library(step, prog, values)
            else:
                assert binary is not None
                _launch(binary, step, prog, values, Path(tmp))
    return [values[o] for o in prog.outputs]
