"""nvcc compiles the generated kernels of every workload's reference sGraph at its published shape
(parameters: the cost model's best) for sm_90, without a GPU; the reference schedules never spill.
The ptxas resource table is printed and kept in pytest's cache (key superopt/nvcc_resources)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from superopt import workloads
from superopt.codegen import generate
from superopt.codegen.nvcc import KernelResources, compile_report, nvcc_path
from superopt.costmodel import best_params
from superopt.instantiate import instantiate
from superopt.targets import TARGETS

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH: cannot compile for sm_90")

H100 = TARGETS["h100"]


@pytest.fixture(scope="module")
def reports() -> dict[str, tuple[dict[str, int], dict[str, int], list[KernelResources]]]:
    programs = {}
    for name in workloads.WORKLOADS:
        _, sg = workloads.reference_for(name)
        params = best_params(sg, H100)
        programs[name] = (params, generate(instantiate(sg, params, H100)))
    with ThreadPoolExecutor(2) as pool:  # one translation unit per workload, two at a time
        compiled = dict(zip(programs, pool.map(lambda p: compile_report(p[1].source), programs.values()),
                            strict=True))
    return {n: (params, {ln.name: ln.smem_bytes for ln in prog.launches}, compiled[n])
            for n, (params, prog) in programs.items()}


def test_published_shapes_compile_for_sm90_without_spills(reports, request):
    rows = []
    for name, (params, smem, resources) in reports.items():
        assert resources, f"{name}: ptxas reported no kernels"
        for r in resources:
            rows.append({"workload": name, "params": params, **r.to_json()})
            assert not r.spills, f"{name} {r.name} spills: {r}"
            assert r.registers <= 255 and r.static_smem_bytes == 0  # all shared memory is the dynamic plan
        assert sorted(r.name for r in resources) == sorted(smem)
    request.config.cache.set("superopt/nvcc_resources", rows)
    print("\nworkload          kernel                              regs  spill st/ld  dyn smem")
    for name, (_, smem, resources) in reports.items():
        for r in sorted(resources, key=lambda r: r.name):
            spills = f"{r.spill_store_bytes:>4}/{r.spill_load_bytes:<4}"
            print(f"{name:<17} {r.name:<35} {r.registers:>4}  {spills}  {smem[r.name]:>8}")
