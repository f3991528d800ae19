"""CUDA C++ code generation for instantiated sGraphs (DESIGN.md §7).

`generate(instance)` gives a `CudaProgram`: one `__global__` function per graph-defined kernel
(128 threads per block, tiles in shared memory exactly per the storage plan) and the host plan
that runs the whole kernel graph, library kernels included.
"""

from superopt.codegen.generate import describe_steps, generate
from superopt.codegen.names import kernel_name
from superopt.codegen.program import CodegenError, CudaProgram, KernelLaunch, LibraryCall

__all__ = [
    "CodegenError",
    "CudaProgram",
    "KernelLaunch",
    "LibraryCall",
    "describe_steps",
    "generate",
    "kernel_name",
]
