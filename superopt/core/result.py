"""What an optimization produces: verdicts, ranked candidates and the result report.

These are plain data shared by the search (which fills them), the kernel cache (which stores
them) and the front ends (which print them). `Result.report()` is the JSON document of
`superopt optimize --json` and of `cache export`; `Result.from_report` reads it back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from superopt.costmodel import is_free
from superopt.program import Program
from superopt.sgraph import GraphKernel, SGraph


@dataclass
class Verdict:
    """The outcome of every verification layer for one sGraph (see superopt.verifier)."""

    egraph: str = "not run"  # "proved" | "not proved" | "not run"
    egraph_reason: str = ""
    egraph_stats: dict[str, Any] = field(default_factory=dict)
    finite_field_trials: int = 0
    finite_field_passed: bool = False
    finite_field_error_bound: float = 1.0
    float_max_rel_err: float = math.inf
    float_tolerance: float = 0.0
    float_instantiations: int = 0
    layers: list[dict[str, Any]] = field(default_factory=list)  # in the order they ran
    max_treatment: str = ""  # how the numeric layers evaluated max, when the program or the sGraph takes one

    @property
    def shapes_checked(self) -> list[dict[str, list[int]]]:
        """The input shapes the numeric layers ran at, each once, in the order first checked: a
        reader sees whether the real shapes were among them, and how far the others shrank."""
        seen: list[dict[str, list[int]]] = []
        for layer in self.layers:
            shapes = layer["detail"].get("shapes") if isinstance(layer["detail"], dict) else None
            if shapes is not None and shapes not in seen:
                seen.append(shapes)
        return seen

    @property
    def proved(self) -> bool:
        """Layer 1 proved, layers 3 and 4 passed: the condition for returning or caching a kernel."""
        return (
            self.egraph == "proved"
            and self.finite_field_passed
            and self.float_instantiations > 0
            and self.float_max_rel_err <= self.float_tolerance
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "egraph": self.egraph,
            "egraph_reason": self.egraph_reason,
            "egraph_stats": self.egraph_stats,
            "finite_field_trials": self.finite_field_trials,
            "finite_field_passed": self.finite_field_passed,
            "finite_field_error_bound": self.finite_field_error_bound,
            "float_max_rel_err": _finite(self.float_max_rel_err),
            "float_tolerance": self.float_tolerance,
            "float_instantiations": self.float_instantiations,
            "layers": self.layers,
            "max_treatment": self.max_treatment,
            "shapes_checked": self.shapes_checked,
            "proved": self.proved,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Verdict:
        err = d.get("float_max_rel_err")
        return Verdict(
            egraph=d["egraph"],
            egraph_reason=d.get("egraph_reason", ""),
            egraph_stats=dict(d.get("egraph_stats", {})),
            finite_field_trials=int(d.get("finite_field_trials", 0)),
            finite_field_passed=bool(d.get("finite_field_passed", False)),
            finite_field_error_bound=float(d.get("finite_field_error_bound", 1.0)),
            float_max_rel_err=math.inf if err is None else float(err),
            float_tolerance=float(d.get("float_tolerance", 0.0)),
            float_instantiations=int(d.get("float_instantiations", 0)),
            layers=list(d.get("layers", [])),
            max_treatment=d.get("max_treatment", ""),
        )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class Candidate:
    """One instantiated sGraph with its time and verdict."""

    sgraph: SGraph
    params: dict[str, int]
    time_us: float
    time_source: str  # "estimated" | "measured"
    dram_bytes: int
    flops: int
    verdict: Verdict | None = None
    estimated_us: float | None = None  # the cost model's figure, also when time_us is measured
    cuda: str | None = None  # generated CUDA source of the graph-defined kernels, when built
    launch: list[dict[str, Any]] = field(default_factory=list)  # per kernel: grid, block, smem

    @property
    def kernels(self) -> int:
        return sum(1 for k in self.sgraph.kernels if not is_free(self.sgraph, k))

    @property
    def graph_defined_kernels(self) -> int:
        return sum(1 for k in self.sgraph.kernels if isinstance(k, GraphKernel))

    def to_json(self) -> dict[str, Any]:
        return {
            "sgraph": self.sgraph.to_json(),
            "params": dict(sorted(self.params.items())),
            "kernels": self.kernels,
            "graph_defined_kernels": self.graph_defined_kernels,
            "time_us": self.time_us,
            "time_source": self.time_source,
            "estimated_us": self.estimated_us if self.estimated_us is not None else self.time_us,
            "dram_bytes": self.dram_bytes,
            "flops": self.flops,
            "verdict": self.verdict.to_json() if self.verdict else None,
            "cuda": self.cuda,
            "launch": self.launch,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Candidate:
        return Candidate(
            sgraph=SGraph.from_json(d["sgraph"]),
            params={k: int(v) for k, v in d["params"].items()},
            time_us=float(d["time_us"]),
            time_source=d["time_source"],
            dram_bytes=int(d["dram_bytes"]),
            flops=int(d.get("flops", 0)),
            verdict=Verdict.from_json(d["verdict"]) if d.get("verdict") else None,
            estimated_us=d.get("estimated_us"),
            cuda=d.get("cuda"),
            launch=list(d.get("launch", [])),
        )


@dataclass
class SearchStats:
    seconds: float = 0.0
    states: int = 0
    pruned: int = 0
    verified: int = 0  # candidates proved (the result keeps the best and the baseline)
    rejected: int = 0
    dominated: int = 0  # candidates the result leaves out: ranked behind the best ones (most never proved)
    symbolic: bool = True
    reused: bool = False  # verified sGraphs of an earlier search re-instantiated for this shape
    budget_exhausted: bool = False
    best_found_s: float = 0.0  # when it first held a candidate as fast as the winner (estimated)
    depth: int = 0  # kernel counts searched completely: 1..depth (deeper ones were bounded out or not reached)
    generic_depth: int = 0  # of those, the ones no time bound cut (their sGraphs stand for any shape)
    bounds: dict[str, int] = field(default_factory=dict)  # states the time bound cut, by the floor that cut them
    peak_rss_mib: float = 0.0
    workers: int = 1
    executor: str = "in-process"
    budget_s: float | None = None  # the limits the search ran under (None: none)
    max_states: int | None = None
    final_check_s: float = 0.0  # checking the returned kernel at the real shapes, after the search

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "bounds": dict(self.bounds)}

    def answers(self, budget_s: float | None, max_states: int | None) -> bool:
        """Whether this search's winner answers a search with these limits: one that finished
        does; one its limits cut short only for limits no larger (a larger budget may find a
        faster schedule). Limits not recorded (older caches) are taken to be no smaller."""
        if not self.budget_exhausted:
            return True

        def within(asked: float | None, ran: float | None) -> bool:
            return ran is None or (asked is not None and asked <= ran)

        return within(budget_s, self.budget_s) and within(max_states, self.max_states)


@dataclass
class Result:
    program: Program
    target: str
    measured: bool
    search: SearchStats
    best: Candidate
    baseline: Candidate
    floor_dram_bytes: int
    floor_time_us: float
    candidates: list[Candidate] = field(default_factory=list)
    cache_hit: bool = False
    target_fingerprint: str = ""

    @property
    def speedup(self) -> float:
        """Baseline over best time; 1 when both are free (a program of views only)."""
        if self.best.time_us > 0:
            return self.baseline.time_us / self.best.time_us
        return 1.0 if self.baseline.time_us <= 0 else math.inf

    def to_svg(self) -> str:
        """The winner's picture (`superopt.svg`) at its chosen parameters, captioned with what it won."""
        from superopt.svg import render_svg  # drawing is the front ends' concern: loaded when asked

        best = self.best
        return render_svg(best.sgraph, best.params, caption=(
            f"best schedule of {self.program.name} on {self.target}: {best.time_us:.3g} us ({best.time_source}), "
            f"{self.speedup:.2f}x over the unfused baseline"))

    def report(self) -> dict[str, Any]:
        best = self.best.to_json()
        best.update({
            "baseline_time_us": self.baseline.time_us,
            "speedup": _finite(self.speedup),
            "floor_dram_bytes": self.floor_dram_bytes,
            "floor_time_us": self.floor_time_us,
        })
        return {
            "program": {
                "name": self.program.name,
                "hash": self.program.canonical_hash(),
                "json": self.program.to_json(),
            },
            "target": {"name": self.target, "measured": self.measured, "fingerprint": self.target_fingerprint},
            "search": self.search.to_json(),
            "cache_hit": self.cache_hit,
            "best": best,
            "baseline": self.baseline.to_json(),
            "candidates": [c.to_json() for c in self.candidates],
        }

    def to_json(self) -> dict[str, Any]:
        """The report (`report()`): what `optimize --json` prints and `cache export` writes, named
        as the other objects of the API name their JSON form."""
        return self.report()

    def summary(self) -> str:
        """A few lines for a person: what `superopt optimize` says first, without the sGraph and
        the table, so a notebook or a log shows the answer at a glance."""
        best, v = self.best, self.best.verdict
        how = "from the kernel cache" if self.cache_hit else "searched"
        verdict = ("PROVED" if v and v.proved else "NOT PROVED") + (f" (e-graph {v.egraph})" if v else "")
        return "\n".join((
            f"program: {self.program.name} ({self.program.canonical_hash()[:16]}), {how}",
            f"target: {self.target}",
            f"best: {best.time_us:.3g} us ({best.time_source}), {best.kernels} kernel(s)",
            f"speedup: {self.speedup:.2f}x over the unfused baseline ({self.baseline.time_us:.3g} us)",
            f"verdict: {verdict}",
        ))

    @staticmethod
    def from_report(d: dict[str, Any]) -> Result:
        stats = SearchStats(**{k: v for k, v in d["search"].items() if k in SearchStats.__dataclass_fields__})
        best = d["best"]
        return Result(
            program=Program.from_json(d["program"]["json"]),
            target=d["target"]["name"],
            measured=bool(d["target"]["measured"]),
            search=stats,
            best=Candidate.from_json(best),
            baseline=Candidate.from_json(d["baseline"]),
            floor_dram_bytes=int(best["floor_dram_bytes"]),
            floor_time_us=float(best["floor_time_us"]),
            candidates=[Candidate.from_json(c) for c in d.get("candidates", [])],
            cache_hit=bool(d.get("cache_hit", False)),
            target_fingerprint=d["target"].get("fingerprint", ""),
        )
