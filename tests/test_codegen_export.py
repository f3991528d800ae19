"""`superopt export`: one compilable CUDA file with the kernels and their launch parameters."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from superopt import workloads
from superopt.cli import app
from superopt.codegen.nvcc import compile_report, nvcc_path
from superopt.costmodel import best_params
from superopt.targets import TARGETS

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_export_reference_at_given_params_json(tmp_path):
    out = tmp_path / "gqa.cu"
    res = invoke("export", "gqa:ci", "--cuda", str(out), "--sgraph", "reference",
                 "--params", "F=2,gx=2,gy=2,gz=2,hx=1,hy=2", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    source = out.read_text()
    assert data["sgraph"] == "gqa.flashdecode" and data["params"]["gz"] == 2 and data["file"] == str(out)
    names = [k["name"] for k in data["kernels"]]
    assert names == [names[0], names[0].replace("_k0", "_k1")] and re.fullmatch(r"so_[0-9a-f]{8}_k0", names[0])
    k0 = data["kernels"][0]
    assert k0["grid"] == [2, 2, 2] and k0["block"] == [128, 1, 1] and k0["args"] == ["Q", "K", "V", "NUM", "DEN"]
    header = source.split("*/")[0]
    assert f"{names[0]}<<<(2, 2, 2), 128, {k0['smem_bytes']} B>>>(Q, K, V, NUM, DEN)" in header
    assert "params: F=2,gx=2,gy=2,gz=2,hx=1,hy=2" in header


def test_export_defaults_to_the_cost_model_best_params(tmp_path):
    out = tmp_path / "lora.cu"
    res = invoke("export", "lora", "--cuda", str(out), "--sgraph", "reference")
    assert res.exit_code == 0, res.output
    _, sg = workloads.reference_for("lora")
    best = best_params(sg, TARGETS["h100"])
    assert f"lora.fused {','.join(f'{k}={v}' for k, v in sorted(best.items()))} for h100" in res.stdout
    assert "1. library matmul(X, A) -> D" in res.stdout and re.search(r"2\. so_[0-9a-f]{8}_k1<<<", res.stdout)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_exported_file_compiles_with_nvcc(tmp_path):
    out = tmp_path / "ntrans.cu"
    assert invoke("export", "ntrans", "--cuda", str(out), "--sgraph", "reference").exit_code == 0
    (kernel,) = compile_report(out.read_text())  # host launchers included: the file is complete
    assert re.fullmatch(r"so_[0-9a-f]{8}_k0", kernel.name) and not kernel.spills


@pytest.mark.parametrize(("args", "message"), [
    (["--sgraph", "reference", "--params", "gx=5"], "must divide evenly"),
    (["--sgraph", "reference", "--params", "gx=2,F=2"], "unknown parameter(s) F"),
    (["--params", "gx=2"], "--params needs --sgraph"),
    (["--sgraph", "reference", "--target", "b200"], "unknown target 'b200'"),
])
def test_export_user_errors_exit_2(tmp_path, args, message):
    out = tmp_path / "x.cu"
    res = invoke("export", "ntrans:ci", "--cuda", str(out), *args)
    assert res.exit_code == 2 and message in res.output and not out.exists()
