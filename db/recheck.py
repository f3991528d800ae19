"""A stored kernel is proved again, and its CUDA generated again, before it is served.

A valid MAC shows that a holder of the key wrote a row, not that its kernel is right: a leaked
key (or an insider) could sign a wrong sGraph. So a kernel served as proved is first proved here
again (`verify` at one instantiation: finite fields, the e-graph proof, one float check), and the
CUDA source and launch parameters served are generated from the sGraph served, never read from
the row. Both are facts about a row's content, which its MAC pins down, so each is kept per
(row id, MAC) in this process: a repeated hit pays a dict lookup, not a proof (tens to hundreds of
milliseconds) or a code generation (milliseconds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

from superopt.object_cache import BoundedDict
from superopt.program import Program
from superopt.sgraph import SGraph
from superopt.targets import Target

Row = tuple[int, str]  # a row's id and MAC
Code = tuple[str, list[dict[str, Any]]]  # CUDA source and launch parameters
V = TypeVar("V")

_proofs: BoundedDict[Hashable, str | None] = BoundedDict(4096)
_code: BoundedDict[Hashable, Code | None] = BoundedDict(1024)
_lock = threading.Lock()


def reproof_problem(row: Row, program: Program, sgraph: SGraph, target: Target) -> str | None:
    """Why the kernel of `row` (as `sgraph`, for `program`) is not proved again; None when it is.
    A refusal is kept too, so that asking again for a forged row costs no second proof."""
    return _memo(_proofs, row, lambda: _prove(program, sgraph, target))


def served_code(row: Row, names: Hashable, sgraph: SGraph, params: Mapping[str, int], target: Target) -> Code | None:
    """The CUDA of `row`'s kernel as `sgraph` (its tensors named by `names`); None when none can
    be generated."""
    return _memo(_code, (*row, names), lambda: generate_code(sgraph, params, target))


def generate_code(sgraph: SGraph, params: Mapping[str, int], target: Target) -> Code | None:
    """What `superopt.api` attaches to a winner: source and launch parameters, or None."""
    from superopt.codegen import CodegenError, generate
    from superopt.instantiate import InstantiationError, instantiate

    try:
        prog = generate(instantiate(sgraph, dict(params), target))
    except (CodegenError, InstantiationError):
        return None
    return prog.source, prog.launch_json()


def _prove(program: Program, sgraph: SGraph, target: Target) -> str | None:
    from superopt.verifier.verify import verify

    try:
        verdict = verify(program, sgraph, target=target, instantiations=1, ff_trials=1)
    except ValueError as e:  # a signed sGraph that does not even fit the program
        return f"its kernel is not proved again: {e}"
    if verdict.proved:
        return None
    failed = next((layer["layer"] for layer in verdict.layers if not layer["passed"]), "a layer")
    return f"its kernel is not proved again (refuted by {failed}; e-graph: {verdict.egraph})"


def _memo(memo: BoundedDict[Hashable, V], key: Hashable, make: Callable[[], V]) -> V:
    """`memo`'s value of `key`, made outside the lock (two threads may both make it: both agree)."""
    with _lock:
        if key in memo:
            memo.move_to_end(key)
            return memo[key]
    value = make()
    with _lock:
        memo[key] = value
    return value
