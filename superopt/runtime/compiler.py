"""Compile generated CUDA with CuPy (NVRTC), once per source: modules are cached by source hash
in this process, and CuPy caches the binaries on disk across processes. CuPy locates the CUDA
headers the source includes (cuda_fp16.h, mma.h) itself, from its CUDA wheels or CUDA_PATH."""

from __future__ import annotations

import hashlib
from typing import Any

from superopt.codegen import CudaProgram
from superopt.runtime.device import require_cupy

OPTIONS = ("--std=c++17",)

_modules: dict[str, Any] = {}


def load_module(prog: CudaProgram) -> Any:
    """The compiled `cupy.RawModule` of a program's source."""
    key = hashlib.sha256(prog.source.encode()).hexdigest()
    if key not in _modules:
        cp = require_cupy()
        module = cp.RawModule(code=prog.source, options=OPTIONS)
        try:
            module.compile()
        except cp.cuda.compiler.CompileException as e:
            raise RuntimeError(
                f"NVRTC could not compile the generated kernels: {e}\n(if it cannot find cuda_fp16.h or mma.h, "
                "install CuPy's CUDA headers, e.g. cupy-cuda13x[ctk], or set CUDA_PATH to a CUDA toolkit)"
            ) from None
        _modules[key] = module
    return _modules[key]


def kernel_functions(prog: CudaProgram) -> dict[str, Any]:
    """Each launch's kernel function, allowed the dynamic shared memory it requests."""
    module = load_module(prog)
    functions = {}
    for ln in prog.launches:
        fn = module.get_function(ln.name)
        if ln.needs_smem_opt_in:
            fn.max_dynamic_shared_size_bytes = ln.smem_bytes
        functions[ln.name] = fn
    return functions
