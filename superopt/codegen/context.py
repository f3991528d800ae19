"""Everything a stage emitter needs to know about one graph-defined kernel: tiles, names, storage."""

from __future__ import annotations

import math

from superopt import ops
from superopt.codegen.layout import Slot, smem_slots
from superopt.codegen.names import c_names, param_names
from superopt.codegen.prelude import C_TYPE
from superopt.codegen.program import CodegenError
from superopt.codegen.values import TensorRef
from superopt.dtypes import dtype as get_dtype
from superopt.instantiate import Instance
from superopt.ops import Op
from superopt.sgraph import BlockOp, GraphKernel

WMMA_TILE = 16


class KernelContext:
    def __init__(self, inst: Instance, k: GraphKernel, name: str) -> None:
        sg = inst.sgraph
        self.inst, self.k, self.name = inst, k, name
        self.block = k.block
        self.info = sg.info.blocks[k.id]
        self.dt = sg.info.dtypes[k.outputs[0]]
        self.ops: dict[str, BlockOp] = {op.id: op for op in k.block.ops()}
        self.grid = inst.grid(k)
        self.loop = inst.loop(k)
        tiles = list(self.info.shapes)
        self._smem = c_names(tiles, "t_")
        self._reg = c_names(tiles, "v_")
        self.global_names = param_names([*k.tensor_inputs, *k.outputs], k.outputs)
        self.axis_vars = {a.name: f"blk_{dim}" for a, dim in zip(k.block.grid, "xyz", strict=False)}
        self.loop_var = "it"
        stored = [(t, st, self.tile(t)) for t, st in self.info.storage.items() if st is not None]
        self.slots: list[Slot] = smem_slots(stored)
        for tensor in self.global_names:
            if get_dtype(sg.info.dtypes[tensor]).nbytes * math.prod(inst.shape(tensor)) >= 2**31:
                raise CodegenError(f"kernel {k.id}: tensor {tensor!r} is too large for 32-bit indexing")

    def tile(self, tid: str) -> tuple[int, ...]:
        return self.inst.tile(self.k.id, tid)

    def storage(self, tid: str) -> str | None:
        return self.info.storage[tid]

    def smem(self, tid: str) -> str:
        return self._smem[tid]

    def ctype(self, tid: str) -> str:
        st = self.storage(tid)
        assert st is not None, tid
        return C_TYPE[st]

    def gname(self, tensor: str) -> str:
        return self.global_names[tensor]

    def gtype(self, tensor: str) -> str:
        return C_TYPE[self.inst.sgraph.info.dtypes[tensor]]

    def ref(self, tid: str) -> TensorRef:
        shape = self.tile(tid)
        if self.storage(tid) is not None:
            return TensorRef(self.smem(tid), shape, True)
        op = self.ops[tid]
        if op.op == Op.CONST:
            return TensorRef(self._reg[tid], shape, False, Op.CONST, value=op.attrs["value"])
        if op.op not in ops.ELEMENTWISE:
            raise CodegenError(f"kernel {self.k.id}: {tid!r} ({op.op}) is neither stored nor elementwise")
        return TensorRef(self._reg[tid], shape, False, op.op, op.inputs)

    def wmma(self, op: BlockOp) -> bool:
        """Tensor cores take f16/bf16 operand tiles in shared memory whose M, N, K are multiples
        of 16, producing fp32 (stored as fp32 or added into fp32 accumulators)."""
        a, b = op.inputs
        if self.dt not in ("f16", "bf16") or self.storage(a) != self.dt or self.storage(b) != self.dt:
            return False
        if self.storage(op.id) not in (None, "f32"):
            return False
        m, kk = self.tile(a)[-2:]
        n = self.tile(b)[-1]
        return all(d % WMMA_TILE == 0 for d in (m, n, kk))

