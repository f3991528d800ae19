"""The Python API: `superopt.optimize(program, ...) -> Result`.

    from superopt import optimize, workloads
    result = optimize(workloads.resolve("rmsnorm_matmul"), target="h100")
    print(result.best.time_us, result.speedup, result.best.verdict.proved)

One call: look the program up in the kernel cache; else re-instantiate verified symbolic sGraphs
kept from a search of the same program at another shape; else search. The winner is verified
again at the program's real shapes with its chosen parameters (and, on a GPU, checked and timed as
generated CUDA), its CUDA source generated, and the result stored in the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from superopt import costmodel
from superopt.config import DEFAULT_BUDGET_S, DEFAULT_TARGET, SearchConfig
from superopt.core.progress import Progress
from superopt.core.result import Candidate, Result, SearchStats, Verdict
from superopt.limits import check_budgets
from superopt.ops import Op
from superopt.program import Program
from superopt.sgraph import SGraph
from superopt.targets import TARGETS, Target, fingerprint
from superopt.targets import target as named_target

if TYPE_CHECKING:  # the search loads when a search runs, not when the API is imported
    from superopt.search.driver import Outcome

REUSE_VERIFY = 5  # kept sGraphs re-verified at a new shape (the best by the cost model first)


class NoCandidate(ValueError):
    """The search found nothing it could prove (not even the baseline): the message says why."""


@dataclass(frozen=True)
class TargetChoice:
    target: Target
    measured: bool
    fingerprint: str


def resolve_target(name: str) -> TargetChoice:
    """'h100' | 'h200' | 'a100' (cost-model estimates) or 'auto': the local GPU, timed, when there
    is one (its datasheet figures for the cost model's ranking), else h100 estimates."""
    if name != "auto":
        t = named_target(name)
        return TargetChoice(t, False, fingerprint(t))
    from superopt.runtime import device_fingerprint, fingerprint_text, gpu_available

    ok, device = gpu_available()
    if not ok:
        return TargetChoice(TARGETS["h100"], False, fingerprint(TARGETS["h100"]))
    known = next((t for key, t in TARGETS.items() if key in device.lower().replace(" ", "")), TARGETS["h100"])
    return TargetChoice(known, True, fingerprint_text(device_fingerprint()))


def optimize(
    program: Program,
    *,
    target: str = DEFAULT_TARGET,
    budget_s: float | None = DEFAULT_BUDGET_S,
    max_states: int | None = None,
    config: SearchConfig | None = None,
    force: bool = False,
    cache: bool = True,
    reuse: bool = True,
    db: str | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
) -> Result:
    """Find, prove and time the fastest schedule of `program` within the search bounds.

    `force` searches even when the cache has an answer, or sGraphs kept from searches of the same
    program at other shapes could stand for one (shape reuse); `cache=False` neither reads nor
    writes the kernel cache (the job worker stores results itself); `reuse=False` neither reads
    nor keeps those sGraphs. `workers`/`ray_address` distribute the search on Ray."""
    program.validate()
    check_budgets(budget_s, max_states)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers: must be an integer of at least 1 (or None: search here), got {workers!r}")
    config = config or SearchConfig()
    choice = resolve_target(target)
    kernel_cache = None
    if cache:
        from superopt.db.cache import KernelCache
        from superopt.db.engine import open_database

        kernel_cache = KernelCache(open_database(db))
        if not force:
            hit = kernel_cache.lookup(program, choice.fingerprint, config, budget_s=budget_s, max_states=max_states)
            if hit is not None:
                if hit.best.cuda is None:  # bound to this program's input names
                    _attach_cuda(hit.best, choice.target)
                return hit
    check_defined(program)
    outcome = _verified_sgraphs(program, choice, config, budget_s, max_states, progress, reuse, force, workers,
                                ray_address)
    result = _result(program, choice, outcome)
    if kernel_cache is not None:
        kernel_cache.store(result, config)
    return result


def check_defined(program: Program) -> None:
    """Refuse at once a program that is not finite in its dtype at the first float check's
    inputs, of any sign or offset (small shapes, `FLOAT_SEED`): no schedule, the unfused one included,
    can pass that check, and a search would spend its whole budget proving nothing. (`superopt
    check` asks it too.)"""
    from superopt.reference import undefined_node
    from superopt.shrink import shrink
    from superopt.verifier.verify import FLOAT_SEED

    node = undefined_node(shrink(program), FLOAT_SEED)
    if node is None:
        return
    where = f"constant {node.id!r} ({node.attrs['value']:g}) is not finite in f32, the precision constants are " \
        "computed in" if node.op == Op.CONST else \
        f"node {node.id!r} ({node.op}) is not finite in {node.dtype or 'f32'} at random inputs of any sign or offset"
    raise NoCandidate(f"{program.name}: {where}, so no schedule can be checked against the program")


def _verified_sgraphs(
    program: Program, choice: TargetChoice, config: SearchConfig, budget_s: float | None,
    max_states: int | None, progress: Progress | None, reuse: bool, force: bool, workers: int | None,
    ray_address: str | None,
) -> Outcome:
    from superopt.build import unfused_baseline
    from superopt.search.driver import CONTENDERS, Outcome, Verified, run_search
    from superopt.search.instantiation import rank
    from superopt.search.reuse import SGraphStore
    from superopt.verifier.verify import verify

    store = SGraphStore()
    if reuse and not force:
        kept = store.load(program, config)
        if kept:
            # Rank every kept sGraph at the new shape (cost model only), then re-verify the leaders
            # until REUSE_VERIFY of them (and the baseline) are proved here. Proofs are the cost:
            # none is made when even the ranking says a deeper search could win.
            t0 = time.monotonic()
            sgraphs, earlier = kept
            stats = SearchStats(symbolic=earlier.get("symbolic", True), reused=True)
            stats.depth = int(earlier.get("depth", 0))
            stats.generic_depth = int(earlier.get("generic_depth", 0))
            # The baseline is made anew: a kept one that no longer proves (the file edited, say)
            # would leave the result without one.
            fresh = [unfused_baseline(program)] + [sg for sg in sgraphs if not sg.name.endswith(".unfused")]
            ranked = [(r, sg) for sg in fresh if (r := rank(sg, choice.target))]
            ranked.sort(key=lambda x: (x[0][0].estimate.time_s, len(x[1].kernels), x[1].dumps()))
            if _reuse_is_complete(program, choice.target, config, [(sg, r[0].estimate.time_s) for r, sg in ranked],
                                  stats.generic_depth):
                verified: list[Verified] = []
                for r, sg in ranked:
                    fused = sum(not v.sgraph.name.endswith(".unfused") for v in verified)
                    if fused >= REUSE_VERIFY and not sg.name.endswith(".unfused"):
                        continue
                    verdict = verify(program, sg, target=choice.target)
                    if verdict.proved:
                        verified.append(Verified(sg, verdict, r))
                stats.verified = len(verified)
                stats.seconds = stats.best_found_s = time.monotonic() - t0
                if _reuse_is_complete(program, choice.target, config,
                                      [(v.sgraph, v.best.estimate.time_s) for v in verified], stats.generic_depth):
                    return Outcome(verified, stats)
    contenders = CONTENDERS if choice.measured else 1  # the GPU re-times the best few; else the best decides
    if (workers is not None and workers > 1) or ray_address:
        from superopt.search.distributed import run_distributed

        outcome = run_distributed(program, choice.target, config, budget_s=budget_s, max_states=max_states,
                                  progress=progress, workers=workers, address=ray_address, contenders=contenders)
    else:
        outcome = run_search(program, choice.target, config, budget_s=budget_s, max_states=max_states,
                             progress=progress, contenders=contenders)
    outcome.stats.budget_s, outcome.stats.max_states = budget_s, max_states
    if reuse and outcome.verified:
        kept = [v.sgraph for v in outcome.verified] + outcome.dominated  # reuse re-verifies what it takes
        store.save(program, config, kept, outcome.stats.to_json())
    return outcome


def _reuse_is_complete(
    program: Program, target: Target, config: SearchConfig, timed: list[tuple[SGraph, float]], depth: int,
) -> bool:
    """Can these re-instantiated sGraphs (with their best estimated times) stand for a search at
    this shape? The earlier search kept every kernel graph of up to `depth` kernels (its generic
    depth: no time bound of that shape cut any); deeper ones pay at least one more launch over the
    physical floor, and where shapes are larger (a bigger floor, so more room above it) they may
    now win: then the program is searched again. (A searched program with a free op, a view, may grow
    a kernel that pays no launch.) Asked of the ranked ones before any is proved: the proved
    ones are among them, so if they cannot stand, neither can the proved."""
    from superopt.search.space import space_of
    from superopt.search.views import ProgramViews

    if not any(not sg.name.endswith(".unfused") for sg, _ in timed):
        return False
    if depth >= config.max_kernel_ops:
        return True
    best = min(time_s for _, time_s in timed)
    launches = space_of(ProgramViews(program).program).launches(depth + 1)  # the program searched
    return best <= costmodel.floor(program, target).time_s + launches * target.launch_overhead_s


def _result(program: Program, choice: TargetChoice, outcome: Outcome) -> Result:
    from superopt.verifier.verify import verify_at

    t = choice.target
    ordered = sorted(outcome.verified, key=lambda v: v.sort_key())
    baseline = next((v for v in ordered if v.sgraph.name.endswith(".unfused")), None)
    if baseline is None:
        why = next((why for name, why in outcome.rejected if name.endswith(".unfused")), "not reached")
        raise NoCandidate(f"{program.name}: not even the unfused baseline could be verified ({why})")
    candidates: list[Candidate] = []
    winner: Candidate | None = None
    no_code: list[str] = []  # proved candidates no CUDA can be generated for (a tile of rank 5)
    for v in ordered:
        c = _candidate(v.sgraph, v.best.params, v.best.estimate, v.verdict)
        candidates.append(c)
        if winner is None:
            # The returned kernel itself: checked again at the program's real shapes and parameters,
            # unless it is the program's own ops, one library kernel each: that would check the
            # program against itself (a 4096-square matmul: 100 s of float64 and field products).
            t0 = time.monotonic()
            final = v.verdict if v is baseline else verify_at(program, v.sgraph, v.best.params, v.verdict, target=t)
            outcome.stats.final_check_s += time.monotonic() - t0
            if not final.proved:
                continue
            # A winner is CUDA to run: one its kernels cannot be generated for gives way to the next.
            problem = _attach_cuda(c, t)
            if problem is not None:
                no_code.append(f"{v.sgraph.name}: {problem}")
                continue
            c.verdict = final
            winner = c
    if winner is None:
        raise NoCandidate(f"{program.name}: no candidate passed verification at its real shapes"
                          + (f" and generates CUDA ({no_code[0]})" if no_code else ""))
    base = next(c for c in candidates if c.sgraph is baseline.sgraph)
    if choice.measured:
        winner = _measure(program, t, candidates, base)
        if winner.cuda is None:  # the measured winner need not be the estimated one
            _attach_cuda(winner, t)
    floor = costmodel.floor(program, t)
    return Result(
        program=program, target=t.name, measured=choice.measured, search=outcome.stats, best=winner,
        baseline=base, floor_dram_bytes=floor.dram_bytes, floor_time_us=floor.time_s * 1e6,
        candidates=candidates, target_fingerprint=choice.fingerprint,
    )


def _candidate(sg: SGraph, params: dict[str, int], est: costmodel.Estimate, verdict: Verdict) -> Candidate:
    return Candidate(sg, dict(params), est.time_us, "estimated", est.dram_bytes, est.flops, verdict,
                     estimated_us=est.time_us)


def _attach_cuda(c: Candidate, t: Target) -> str | None:
    """Give `c` its CUDA source and launches; why none can be generated, or None."""
    from superopt.codegen import CodegenError, generate
    from superopt.instantiate import instantiate

    try:
        prog = generate(instantiate(c.sgraph, c.params, t))
    except CodegenError as e:
        return str(e)
    c.cuda, c.launch = prog.source, prog.launch_json()
    return None


def _measure(program: Program, t: Target, candidates: list[Candidate], base: Candidate) -> Candidate:
    """Time the best few candidates (and the baseline) as generated CUDA; the fastest correct one
    wins. A candidate whose kernels are wrong on the device is dropped, never returned."""
    from superopt.codegen import CodegenError
    from superopt.runtime.measure import IncorrectKernel, measure
    from superopt.search.driver import CONTENDERS  # the search proves at least these

    timed: list[Candidate] = []
    for c in [*candidates[:CONTENDERS], base]:
        if c in timed:
            continue
        try:
            m = measure(program, c.sgraph, c.params, t)
        except (IncorrectKernel, CodegenError):  # wrong on the device, or no CUDA to run
            continue
        c.time_us, c.time_source = m.median_us, "measured"
        timed.append(c)
    proved = [c for c in timed if c.verdict is not None and c.verdict.proved]
    if not proved:
        raise NoCandidate(f"{program.name}: no candidate was correct on the device")
    return min(proved, key=lambda c: (c.time_us, c.kernels))
