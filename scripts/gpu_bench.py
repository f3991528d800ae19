"""Time every workload's best kernels against the unfused baseline (and PyTorch when importable)
on this machine's GPU; print a table and write JSON. Run by scripts/gpu_check.sh.

Each row: the schedule is checked against the float64 reference (fresh inputs, poisoned outputs)
before it is timed; times are medians of CUDA-event timings after warm-up. "GB/s" is the
program's floor bytes (inputs read once, outputs written once) over our time, and "% floor" is
the physical floor time (`superopt.costmodel.floor`) over ours.

Schedules: each workload's reference sGraph at the cost model's best parameters, or, with
`--report FILE` (repeatable), the winner in a `superopt optimize --json` / `superopt cache export`
report, which takes the place of the reference for its program.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from superopt import workloads
from superopt.build import unfused_baseline
from superopt.core.result import Result
from superopt.costmodel import best_params, estimate, floor
from superopt.instantiate import instantiate
from superopt.ops import Op
from superopt.program import Program
from superopt.reference import inputs_and_reference, max_rel_err
from superopt.runtime import device_fingerprint, fingerprint_text
from superopt.runtime.calibrate import calibrate
from superopt.runtime.measure import measure, measure_baseline
from superopt.sgraph import SGraph
from superopt.targets import Target, target


def schedules(args: argparse.Namespace) -> list[tuple[str, Program, SGraph, dict[str, int] | None]]:
    """(label, program, sGraph, params or None = the cost model's best) for every row."""
    from_reports: dict[str, tuple[SGraph, dict[str, int]]] = {}
    for path in args.report:
        res = Result.from_report(json.loads(Path(path).read_text()))
        from_reports[res.program.canonical_hash()] = (res.best.sgraph, dict(res.best.params))
    rows = []
    for name in args.workloads or list(workloads.WORKLOADS):
        w = workloads.get(name)
        labels = [lb for lb in w.shapes if lb != "ci"] if args.all_shapes else [w.default]
        for label in labels:
            program = w.program(label)
            sg, params = from_reports.get(program.canonical_hash(), (w.reference(program), None))
            rows.append((program.name, program, sg, params))
    return rows


def torch_time_us(program: Program, n_repeat: int, n_warmup: int) -> tuple[float, float] | None:
    """(median µs, max rel err) of the program run op by op in PyTorch eager, or None without it."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[program.dtype]
    inputs, refs = inputs_and_reference(program, 0)
    dev = {k: torch.tensor(v, dtype=tdt, device="cuda") for k, v in inputs.items()}

    def run() -> list[Any]:
        vals: dict[str, Any] = dict(dev)
        for n in program.topological():
            if n.op != "input":
                vals[n.id] = _torch_op(torch, n.op, [vals[i] for i in n.inputs], n.attrs, tdt)
        return [vals[o] for o in program.outputs]

    outs = run()
    err = max(max_rel_err(o.float().cpu().numpy(), r) for o, r in zip(outs, refs, strict=True))
    for _ in range(n_warmup):
        run()
    times = []
    for _ in range(n_repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times), err


def _torch_op(torch: Any, op: str, a: list[Any], attrs: Any, tdt: Any) -> Any:
    f = torch.nn.functional
    if op == Op.CONST:
        return torch.tensor(attrs["value"], dtype=tdt, device="cuda")
    simple: dict[str, Any] = {
        Op.MATMUL: torch.matmul, Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div,
        Op.NEG: torch.neg, Op.EXP: torch.exp, Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt, Op.RELU: torch.relu,
        Op.SIGMOID: torch.sigmoid, Op.SILU: f.silu,
    }
    if op in simple:
        return simple[op](*a)
    if op == Op.SQUARE:
        return a[0] * a[0]
    if op == Op.GELU:
        return f.gelu(a[0], approximate="tanh")
    if op in (Op.SUM, Op.MEAN):
        return getattr(torch, op)(a[0], dim=attrs["dim"], keepdim=attrs["keepdim"])
    if op == Op.MAX:
        return torch.amax(a[0], dim=attrs["dim"], keepdim=attrs["keepdim"])
    if op == Op.SOFTMAX:
        return torch.softmax(a[0], dim=attrs["dim"])
    if op == Op.RMS_NORM:
        x = a[0].float()
        return (x / torch.sqrt(x.pow(2).mean(dim=attrs["dim"], keepdim=True) + attrs["eps"])).to(tdt)
    if op == Op.TRANSPOSE:
        return a[0].permute(*attrs["perm"])
    if op == Op.RESHAPE:
        return a[0].reshape(*attrs["shape"])
    raise ValueError(f"no PyTorch spelling of op {op!r}")


def bench_row(label: str, program: Program, sg: SGraph, params: dict[str, int] | None, tgt: Target,
              args: argparse.Namespace) -> dict[str, Any]:
    params = params if params is not None else best_params(sg, tgt)
    fl = floor(program, tgt)
    ours = measure(program, sg, params, tgt, n_repeat=args.repeat, n_warmup=args.warmup)
    base = measure_baseline(program, tgt, n_repeat=args.repeat, n_warmup=args.warmup)
    row: dict[str, Any] = {
        "workload": label, "sgraph": sg.name, "params": params,
        "ours_us": ours.median_us, "ours_min_us": ours.min_us, "ours_err": ours.max_rel_err,
        "baseline_us": base.median_us, "baseline_err": base.max_rel_err,
        "speedup": base.median_us / ours.median_us,
        "achieved_gbs": fl.dram_bytes / (ours.median_us * 1e-6) / 1e9,
        "floor_us": fl.time_s * 1e6, "pct_of_floor": 100 * fl.time_s / (ours.median_us * 1e-6),
        "estimated_us": estimate(instantiate(sg, params, tgt)).time_us,
        "baseline_estimated_us": estimate(instantiate(unfused_baseline(program), {}, tgt)).time_us,
        "launches": ours.launches, "baseline_launches": base.launches,
    }
    torch_t = torch_time_us(program, args.repeat, args.warmup)
    if torch_t is not None:
        row["torch_us"], row["torch_err"] = torch_t
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'workload':<34} {'ours µs':>9} {'base µs':>9} {'speedup':>8} {'torch µs':>9} {'GB/s':>8} {'% floor':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:<34} FAILED: {r['error'].splitlines()[0][:90]}")
            continue
        torch_us = f"{r['torch_us']:>9.2f}" if "torch_us" in r else f"{'-':>9}"
        print(f"{r['workload']:<34} {r['ours_us']:>9.2f} {r['baseline_us']:>9.2f} {r['speedup']:>7.2f}x {torch_us} "
              f"{r['achieved_gbs']:>8.0f} {r['pct_of_floor']:>7.1f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="gpu_check.json", help="write the results here")
    ap.add_argument("--target", default="h200", help="cost-model target for parameters, floor and estimates")
    ap.add_argument("--workloads", nargs="*", help="only these workloads (default: all seven)")
    ap.add_argument("--all-shapes", action="store_true", help="every published shape, not only the default one")
    ap.add_argument("--report", action="append", default=[], help="optimize/cache report whose winner to time")
    ap.add_argument("--repeat", type=int, default=200, help="timed runs per measurement (median reported)")
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    tgt = target(args.target)
    fp = device_fingerprint()
    print(f"device: {fingerprint_text(fp)}")
    start = time.time()
    measured = calibrate(tgt)
    print(f"calibrated: {measured.dram_bytes_per_s / 1e12:.2f} TB/s, {measured.tensor_flops / 1e12:.0f} TFLOP/s f16, "
          f"launch {measured.launch_overhead_s * 1e6:.1f} µs (datasheet {tgt.name}: "
          f"{tgt.dram_bytes_per_s / 1e12:.2f} TB/s, {tgt.tensor_flops / 1e12:.0f} TFLOP/s)\n")
    rows = []
    for label, program, sg, params in schedules(args):
        try:
            rows.append(bench_row(label, program, sg, params, tgt, args))
        except Exception as e:  # one failing workload must not hide the others' numbers
            rows.append({"workload": label, "sgraph": sg.name, "error": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc()})
    print_table(rows)
    doc = {
        "device": fp, "fingerprint": fingerprint_text(fp), "target": tgt.name,
        "calibrated": {"dram_bytes_per_s": measured.dram_bytes_per_s, "tensor_flops": measured.tensor_flops,
                       "launch_overhead_s": measured.launch_overhead_s},
        "repeat": args.repeat, "warmup": args.warmup, "seconds": time.time() - start, "rows": rows,
    }
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.json} ({time.time() - start:.0f} s)")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
