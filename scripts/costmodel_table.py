"""The cost model's estimates for every built-in workload at its published shape: the physical
floor, the hand-written reference sGraph and the unfused baseline (time, kernels, DRAM bytes over
the floor), each at the parameters the cost model picks. Prints a markdown table; writes JSON.

    .venv/bin/python scripts/costmodel_table.py [--target h100] [--json out/costmodel_table.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from superopt import costmodel, workloads
from superopt.build import unfused_baseline
from superopt.targets import TARGETS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="h100", choices=sorted(TARGETS))
    ap.add_argument("--json", default="out/costmodel_table.json")
    args = ap.parse_args()
    target = TARGETS[args.target]
    rows = []
    for name in workloads.WORKLOADS:
        program, reference = workloads.reference_for(name)
        floor = costmodel.floor(program, target)
        row: dict[str, object] = {"workload": name, "floor_us": round(floor.time_s * 1e6, 3),
                                  "floor_mb": floor.dram_bytes / 1e6}
        for label, sg in (("reference", reference), ("unfused", unfused_baseline(program))):
            params, est = costmodel.rank(sg, target, keep=1)[0]
            row[label] = {"us": round(est.time_us, 3), "kernels": len(sg.kernels), "params": params,
                          "dram_over_floor": round(est.dram_bytes / floor.dram_bytes, 3)}
        rows.append(row)
    print(f"| workload ({target.name}) | floor us | floor MB | reference us | kernels | DRAM/floor "
          "| unfused us | kernels | DRAM/floor | reference speedup |\n|" + "---|" * 10)
    for r in rows:
        ref, unf = r["reference"], r["unfused"]
        assert isinstance(ref, dict) and isinstance(unf, dict)
        print(f"| {r['workload']} | {r['floor_us']} | {r['floor_mb']:.2f} | {ref['us']} | {ref['kernels']} | "
              f"{ref['dram_over_floor']} | {unf['us']} | {unf['kernels']} | {unf['dram_over_floor']} | "
              f"{unf['us'] / ref['us']:.2f}x |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"target": target.name, "rows": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
