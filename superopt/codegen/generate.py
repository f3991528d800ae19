"""`generate(instance)`: the CUDA source and host plan of an instantiated sGraph.

The source starts with a header comment (the rendered sGraph, its parameters and every launch),
then the device helpers, one `__global__` function per graph-defined kernel and, for nvcc only,
host launchers that request the dynamic shared memory and launch each kernel. Output is a pure
function of the instance: the same instance gives byte-identical source.
"""

from __future__ import annotations

from dataclasses import replace

from superopt.codegen.context import KernelContext
from superopt.codegen.kernel import kernel_source
from superopt.codegen.names import comment_text, kernel_name, param_names
from superopt.codegen.prelude import C_TYPE, prelude
from superopt.codegen.program import (
    THREADS_PER_BLOCK,
    CodegenError,
    CudaProgram,
    KernelLaunch,
    LibraryCall,
    Step,
)
from superopt.instantiate import Instance
from superopt.render import render_sgraph
from superopt.sgraph import GraphKernel, LibraryKernel, TensorDecl


def generate(inst: Instance) -> CudaProgram:
    sg = inst.sgraph
    if inst.target.threads_per_block != THREADS_PER_BLOCK:
        raise CodegenError(
            f"target {inst.target.name} asks for {inst.target.threads_per_block} threads per block; "
            f"code generation emits {THREADS_PER_BLOCK}"
        )
    steps: list[Step] = []
    bodies: list[str] = []
    uses_wmma = False
    for position, k in enumerate(sg.kernels):
        if isinstance(k, LibraryKernel):
            steps.append(LibraryCall(k.id, k.op, k.inputs, dict(k.attrs), k.output))
            continue
        ctx = KernelContext(inst, k, kernel_name(sg.name, position))
        text, wmma = kernel_source(ctx)
        uses_wmma |= wmma
        smem = sum(s.nbytes for s in ctx.slots)
        if smem != inst.smem(k):
            raise CodegenError(f"kernel {k.id}: layout has {smem} bytes, the storage plan {inst.smem(k)}")
        bodies.append(text)
        steps.append(_launch(inst, k, ctx.name, smem, wmma))
    tensors = {t: TensorDecl(t, inst.shape(t), sg.info.dtypes[t]) for t in sg.info.shapes}
    dtypes = set(sg.info.dtypes.values())
    program = CudaProgram("", tuple(steps), tensors, tuple(t.id for t in sg.inputs), tuple(sg.outputs),
                          dict(inst.values), dict(sg.views), {r: sg.views[v][0] for r, v in sg.reshaped_views.items()})
    parts = [_header(inst, program), prelude(dtypes, uses_wmma, "\n".join(bodies)), *bodies, _host_launchers(program)]
    return replace(program, source="\n".join(p for p in parts if p))


def _launch(inst: Instance, k: GraphKernel, name: str, smem: int, wmma: bool) -> KernelLaunch:
    grid = (*inst.grid(k), 1, 1)[:3]
    return KernelLaunch(k.id, name, (grid[0], grid[1], grid[2]), (THREADS_PER_BLOCK, 1, 1), smem,
                        (*k.tensor_inputs, *k.outputs), k.outputs, wmma)


def describe_steps(program: CudaProgram) -> list[str]:
    """One line per kernel in launch order (for headers and reports)."""
    lines = []
    for i, s in enumerate(program.steps, 1):
        if isinstance(s, LibraryCall):
            attrs = "".join(f", {a}={v}" for a, v in s.attrs.items())
            view = f"  [a view of {stored}: no copy]" if (stored := program.stored(s.output)) else ""
            lines.append(f"{i}. library {s.op}({', '.join(s.inputs)}{attrs}) -> {s.output}{view}")
        else:
            grid = ", ".join(map(str, s.grid))
            lines.append(f"{i}. {s.name}<<<({grid}), {s.block[0]}, {s.smem_bytes} B>>>({', '.join(s.args)})"
                         + ("  [tensor cores]" if s.wmma else ""))
    return lines


def _header(inst: Instance, program: CudaProgram) -> str:
    sg = inst.sgraph
    lines = [
        f"superopt generated CUDA: sGraph {sg.name}",
        f"params: {inst.params_text() or '(none)'}   target: {inst.target.name}   "
        f"threads per block: {THREADS_PER_BLOCK}",
        "",
        *render_sgraph(sg, inst.values).split("\n"),  # its own lines: a name's \r or U+2028 is escaped
        "",
        "launches, in order (grid, block threads, dynamic shared memory bytes; library kernels run on the host side):",
        *describe_steps(program),
        "",
        "tensors (row-major, device pointers 16-byte aligned; a view reads its stored tensor's memory):",
        *(f"{t.id} {t.shape} {t.dtype}" + _view_text(program, t.id) for t in program.tensors.values()),
    ]
    return "/*\n" + "\n".join(f" * {comment_text(ln)}".rstrip() for ln in lines) + "\n */\n"


def _view_text(program: CudaProgram, tensor: str) -> str:
    if tensor in program.views:
        return f" = view of {program.views[tensor][0]}, dims {list(program.views[tensor][1])}"
    if tensor in program.reshaped_views:
        return f" = reshaped view of {program.reshaped_views[tensor]}, read in place by generated kernels"
    return ""


def _host_launchers(program: CudaProgram) -> str:
    """Host-side launchers, compiled by nvcc only (NVRTC and the CPU emulation skip them)."""
    if not program.launches:
        return ""
    out = ["#if defined(__CUDACC__) && !defined(__CUDACC_RTC__)",
           "// Host launchers: request the kernel's dynamic shared memory, then launch it on `stream`."]
    for ln in program.launches:
        names = param_names(ln.args, ln.outputs)
        params = [f"{'' if t in ln.outputs else 'const '}{C_TYPE[program.tensors[t].dtype]}* {names[t]}"
                  for t in ln.args]
        out.append(f'extern "C" cudaError_t launch_{ln.name}({", ".join([*params, "cudaStream_t stream"])}) {{')
        out.append(f"  cudaError_t err = cudaFuncSetAttribute({ln.name}, "
                   f"cudaFuncAttributeMaxDynamicSharedMemorySize, {ln.smem_bytes});")
        out.append("  if (err != cudaSuccess) return err;")
        grid = ", ".join(map(str, ln.grid))
        out.append(f"  {ln.name}<<<dim3({grid}), dim3({ln.block[0]}), {ln.smem_bytes}, stream>>>"
                   f"({', '.join(names[t] for t in ln.args)});")
        out.append("  return cudaGetLastError();")
        out.append("}")
    out.append("#endif")
    return "\n".join(out) + "\n"

