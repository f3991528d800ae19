"""Canonical form and hash of a program: the identity of a computation.

Nodes are numbered by a depth-first walk from the outputs (in output order, operands in operand
order), so node names and the order in which independent nodes were inserted do not matter, while
any difference in ops, attributes, shapes, dtypes or wiring does. Inputs are identified by where
the computation first uses them, not by name. The hash is `stable_digest` of the canonical form, so
it is stable across processes and machines (never Python's `hash`).
"""

from __future__ import annotations

from typing import Any

from superopt import ops
from superopt.digest import stable_digest
from superopt.ops import Op
from superopt.program import Program


def canonical_order(program: Program) -> list[str]:
    """Node ids in canonical order: post-order of a DFS from the outputs."""
    order: list[str] = []
    seen: set[str] = set()
    for out in program.outputs:
        stack: list[tuple[str, int]] = [(out, 0)]
        while stack:
            nid, k = stack.pop()
            if k == 0 and nid in seen:
                continue
            seen.add(nid)
            ins = program.nodes[nid].inputs
            if k < len(ins):
                stack.append((nid, k + 1))
                if ins[k] not in seen:
                    stack.append((ins[k], 0))
            else:
                order.append(nid)
    return order


def canonical_form(program: Program) -> dict[str, Any]:
    order = canonical_order(program)
    index = {nid: i for i, nid in enumerate(order)}
    nodes: list[list[Any]] = []
    for nid in order:
        n = program.nodes[nid]
        if n.op == "input":
            nodes.append(["input", list(n.shape), n.dtype])
            continue
        attrs = ops.canonical_attrs(n.op, n.attrs, [program.nodes[i].size_shape for i in n.inputs])
        if n.op == Op.CONST:
            attrs = {"value": float(attrs["value"]).hex()}
        for k, v in attrs.items():
            if isinstance(v, float):
                attrs[k] = v.hex()
        nodes.append([n.op, attrs, [index[i] for i in n.inputs], list(n.shape), n.dtype])
    return {"v": 1, "nodes": nodes, "outputs": [index[o] for o in program.outputs]}


def canonical_hash(program: Program) -> str:
    return stable_digest(canonical_form(program))


def canonical_inputs(program: Program) -> list[str]:
    """Input ids in canonical order: how a stored kernel binds to a program's named inputs."""
    return [nid for nid in canonical_order(program) if program.nodes[nid].op == "input"]


def input_names(stored: Program, asking: Program) -> dict[str, str]:
    """For two programs of one canonical hash: each input name of `stored` whose input `asking`
    names otherwise, mapped to that name (how a kernel cached for one binds to the other)."""
    return {old: new for old, new in zip(canonical_inputs(stored), canonical_inputs(asking), strict=True) if old != new}
