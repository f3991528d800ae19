"""The command line: listing, showing, checking and running, with exit codes and messages."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from superopt import workloads
from superopt.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_programs_json_lists_every_workload_with_shapes():
    res = invoke("programs", "--json")
    assert res.exit_code == 0
    rows = json.loads(res.stdout)
    names = {r["name"] for r in rows}
    for w in workloads.WORKLOADS:
        assert w in names and f"{w}:ci" in names
    gqa = next(r for r in rows if r["name"] == "gqa")
    assert gqa["inputs"] == {"Q": [2, 256, 64], "K": [2, 64, 4096], "V": [2, 4096, 64]}
    assert gqa["hash"] == workloads.resolve("gqa").canonical_hash()


def test_show_program_and_reference_sgraph():
    res = invoke("show", "rmsnorm_matmul:ci")
    assert res.exit_code == 0 and "O = matmul(rms_norm_1, W)" in res.stdout
    res = invoke("show", "gqa:ci", "--reference")
    assert res.exit_code == 0
    assert "kernel k1  graph-defined  grid u=hx v=hy  loop z=gz  -> O" in res.stdout


def test_show_sgraph_file(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(workloads.reference_for("lora:ci")[1].dumps())
    res = invoke("show", str(f), "--params", "gx=4,F=2")
    assert res.exit_code == 0
    assert "kernel k0  library matmul(X, A) -> D" in res.stdout and "params: F=2, gx=4" in res.stdout


def test_check_prints_canonical_hash(tmp_path):
    p = workloads.resolve("ntrans:ci")
    f = tmp_path / "p.json"
    f.write_text(p.dumps())
    res = invoke("check", str(f))
    assert res.exit_code == 0 and res.stdout.split()[0] == p.canonical_hash()


def test_check_rejects_invalid_program_with_exit_2(tmp_path):
    data = workloads.resolve("ntrans:ci").to_json()
    data["nodes"][0]["shape"] = [6, -1]
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(data))
    res = invoke("check", str(f))
    assert res.exit_code == 2
    assert "node 'H' (input): dimension -1 is not positive" in res.stderr
    assert "Traceback" not in res.output


def test_check_missing_file_and_bad_json(tmp_path):
    res = invoke("check", str(tmp_path / "none.json"))
    assert res.exit_code == 2 and "no such file" in res.stderr
    f = tmp_path / "x.json"
    f.write_text("{")
    res = invoke("check", str(f))
    assert res.exit_code == 2 and "not valid JSON" in res.stderr


def test_run_reports_error_against_reference():
    res = invoke("run", "gqa:ci", "--params", "F=2,gx=2,gy=2,gz=2,hx=1,hy=4", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["ok"] and 0 < out["max_rel_err"] < 1e-2


def test_run_with_broken_constraint_names_it():
    res = invoke("run", "gqa:ci", "--params", "F=3,gx=2,gy=2,gz=2,hx=1,hy=4")
    assert res.exit_code == 2
    assert "K_t' (K) dim 2 (64) must divide evenly by z and the loop f" in res.stderr


def test_run_wrong_sgraph_exits_1(tmp_path):
    _, ref = workloads.reference_for("gated_mlp:ci")
    data = ref.to_json()
    data["kernels"][0]["post"][0]["op"] = "sigmoid"
    f = tmp_path / "wrong.json"
    f.write_text(json.dumps(data))
    res = invoke("run", "gated_mlp:ci", "--sgraph", str(f), "--params", "gx=2,F=4")
    assert res.exit_code == 1 and "OUTSIDE" in res.stdout


def test_unknown_workload_is_one_clear_error():
    res = invoke("show", "nope")
    assert res.exit_code == 2 and "neither a built-in workload" in res.stderr
    res = invoke("show", "gqa:huge")
    assert res.exit_code == 2 and "has no shape 'huge'" in res.stderr
