"""The command line: listing, showing, checking and running, with exit codes and messages."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from superopt import workloads
from superopt.cli import app
from superopt.program import Program

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


def test_an_sgraph_file_with_an_unknown_field_is_one_clear_error(tmp_path):
    """Exit 2 and one line naming the file and the field's place, for every command that reads one."""
    for edit, message in ((lambda d: d["kernels"][0].update(bogus_field=1), "kernels[0]: unexpected field 'bogus_field'"),
                          (lambda d: d["inputs"][0].update(typo_dtpye="f16"), "inputs[0]: unexpected field 'typo_dtpye'")):
        data = workloads.reference_for("lora:ci")[1].to_json()
        edit(data)
        f = tmp_path / "sg.json"
        f.write_text(json.dumps(data))
        for command in (["show", str(f)], ["verify", "lora:ci", str(f)]):
            res = invoke(*command)
            assert res.exit_code == 2 and f"error: {f}: {message}" in res.stderr, (command, res.output)
            assert "Traceback" not in res.output


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


@pytest.mark.parametrize(("value", "message"), [
    (1e300, "scaled: constant 'c' (1e+300) is not finite in f32, the precision constants are computed in"),
    (1e5, "scaled: node 'O' (mul) is not finite in f16 at random inputs of any sign or offset"),
])
def test_check_refuses_what_optimize_would_refuse_as_not_finite(tmp_path, value, message):
    """X * 1e300 in f16 passed `check` and was then refused by `optimize` (no schedule can be
    checked against a program that overflows); the constant's message said f32 with no reason."""
    p = Program("scaled")
    p.output(p.op("mul", p.input("X", (4, 8), "f16"), value, name="O"))
    data = p.to_json()
    data["nodes"] = [dict(n, id="c") if n["op"] == "const" else n for n in data["nodes"]]
    data["nodes"] = [dict(n, inputs=["X", "c"]) if n["id"] == "O" else n for n in data["nodes"]]
    f = tmp_path / "scaled.json"
    f.write_text(json.dumps(data))
    for command in ("check", "optimize"):
        res = invoke(command, str(f), *(["--no-cache"] if command == "optimize" else []))
        assert res.exit_code == 2 and res.stderr == f"error: {message}, so no schedule can be checked against the " \
            "program\n", (command, res.output)


def test_check_missing_file_and_bad_json(tmp_path):
    res = invoke("check", str(tmp_path / "none.json"))
    assert res.exit_code == 2 and "no such file" in res.stderr
    f = tmp_path / "x.json"
    f.write_text("{")
    res = invoke("check", str(f))
    assert res.exit_code == 2 and "not valid JSON" in res.stderr
    # The decoder's other failures: one line each too, not a traceback.
    for text, message in ((b"[" * 200_000, "not valid JSON: nested too deeply"),
                          (b"\xff\xfe{}", "not UTF-8 text (invalid start byte at byte 0)"),
                          (b'{"shape": [' + b"9" * 5000 + b"]}", "not valid JSON: Exceeds the limit (4300 digits)"),
                          # Python's decoder keeps the last of a key given twice: one of two shapes, silently
                          (b'{"nodes": [{"id": "X", "shape": [4, 8], "shape": [8, 4]}]}',
                           "not valid JSON: the key 'shape' is given twice in one object")):
        f.write_bytes(text)
        for command in (["check", str(f)], ["verify", "gqa:ci", str(f)], ["optimize", str(f)]):
            res = invoke(*command)
            assert res.exit_code == 2 and f"{f}: {message}" in res.stderr and "Traceback" not in res.output, command
    res = invoke("check", str(tmp_path))
    assert res.exit_code == 2 and f"{tmp_path}: a directory, not a file" in res.stderr


def test_run_reports_error_against_reference():
    res = invoke("run", "gqa:ci", "--params", "F=2,gx=2,gy=2,gz=2,hx=1,hy=4", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["ok"] and 0 < out["max_rel_err"] < 1e-2


def test_run_takes_the_winner_and_a_program_file_runs_its_baseline_by_default(tmp_path, monkeypatch):
    """`run prog.json` failed for every program file (its default sGraph was 'reference', which
    only built-ins have), and the optimizer's winner could not be run without an sGraph file."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    p = Program("gelu_bias")
    p.output(p.op("gelu", p.op("add", p.input("X", (8, 32), "f32"), p.input("B", (1, 32), "f32")), name="O"))
    f = tmp_path / "gelu_bias.json"
    f.write_text(p.dumps())
    baseline = json.loads(invoke("run", str(f), "--json", "--seed", "3").stdout)
    assert baseline["sgraph"] == "gelu_bias.unfused" and baseline["ok"] and baseline["params"] == {}
    res = invoke("run", str(f), "--sgraph", "winner", "--target", "h100", "--json", "--seed", "3")
    assert res.exit_code == 0, res.output
    winner = json.loads(res.stdout)
    assert winner["sgraph"] == "gelu_bias.searched" and winner["ok"] and 0 < winner["max_rel_err"] < 1e-5
    report = json.loads(invoke("optimize", str(f), "--target", "h100", "--json").stdout)  # the same winner
    assert report["cache_hit"] and report["best"]["params"] == winner["params"]


def test_run_takes_the_parameters_given_and_fills_in_the_others():
    """`run lora:ci --sgraph winner --params gx0=3` failed with "no value for F0, gy0": the values
    not given are the winner's own, or the cost model's best for another sGraph."""
    whole = json.loads(invoke("run", "rmsnorm_matmul:ci", "--json").stdout)["params"]
    res = invoke("run", "rmsnorm_matmul:ci", "--params", "gx=2", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["params"] == {**whole, "gx": 2} and whole["gx"] != 2


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
    res = invoke("show", "gqa:")  # an empty label is not the default one
    assert res.exit_code == 2 and "has no shape ''" in res.stderr


def test_show_checks_the_parameters_it_prints():
    cases = [
        (("rmsnorm_matmul:ci", "--reference", "--params", "gx=4,F=99"), "must divide evenly by the loop f (F)"),
        (("rmsnorm_matmul:ci", "--reference", "--params", "gx=4,F=2,zz=3"), "unknown parameter(s) zz"),
        (("rmsnorm_matmul:ci", "--params", "gx=2"), "--params goes with an sGraph"),
        (("rmsnorm_matmul:ci", "--reference", "--baseline"), "choose one"),
    ]
    for args, message in cases:
        res = invoke("show", *args)
        assert res.exit_code == 2 and message in res.stderr, (args, res.output)


def test_unknown_target_is_one_clear_error_in_every_command(tmp_path):
    for args in (("run", "rmsnorm_matmul:ci"), ("verify", "rmsnorm_matmul:ci", "reference"),
                 ("optimize", "rmsnorm_matmul:ci", "--no-cache"),
                 ("export", "rmsnorm_matmul:ci", "--cuda", str(tmp_path / "x.cu"), "--sgraph", "reference")):
        res = invoke(*args, "--target", "bogus")
        assert res.exit_code == 2, (args, res.output)
        assert "unknown target 'bogus'" in res.stderr and "Traceback" not in res.output, args


def test_an_unreachable_ray_address_is_one_clear_error():
    """`--ray-address` to a port nothing listens on hung in ray.init for minutes, Ray's own log
    lines the only output."""
    for address, message in (("127.0.0.1:1", "ray address 127.0.0.1:1: no Ray cluster answers there"),
                             ("no-port", "ray address 'no-port': expected HOST:PORT")):
        res = invoke("optimize", "lora:ci", "--target", "h100", "--no-cache", "--ray-address", address)
        assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.output, res.output


def test_every_command_with_a_target_takes_auto(tmp_path):
    """The error for an unknown target offers 'auto'; run, verify and export refused it. Without
    a GPU, auto means the h100's limits, as it does for optimize."""
    for args in (("run", "gqa:ci", "--params", "F=2,gx=2,gy=2,gz=2,hx=1,hy=4"), ("verify", "gqa:ci", "reference"),
                 ("export", "gqa:ci", "--cuda", str(tmp_path / "x.cu"), "--sgraph", "reference")):
        auto, h100 = invoke(*args, "--target", "auto"), invoke(*args, "--target", "h100")
        assert auto.exit_code == 0 and auto.stdout.splitlines()[-1] == h100.stdout.splitlines()[-1], (args, auto.output)


def test_optimize_checks_its_bounds_and_budgets_as_a_job_request_does():
    cases = [
        (("--max-kernel-ops", "-3"), "config.max_kernel_ops: Input should be greater than or equal to 1"),
        (("--max-block-ops", "0"), "config.max_block_ops: Input should be greater than or equal to 1"),
        (("--max-block-inputs", "0"), "config.max_block_inputs: Input should be greater than or equal to 1"),
        (("--budget-s", "0"), "budget_s: Input should be greater than 0"),
        (("--budget-s", "nan"), "budget_s: Input should be a finite number"),
        (("--budget-s", "inf"), "budget_s: Input should be a finite number"),
        (("--max-states", "0"), "max_states: Input should be greater than 0"),
        (("--max-states", "99999999999999999999"), "max_states: Input should be less than or equal to"),
    ]
    for args, message in cases:
        res = invoke("optimize", "rmsnorm_matmul:ci", "--no-cache", *args)
        assert res.exit_code == 2 and message in res.stderr, (args, res.output)
    res = invoke("optimize", "rmsnorm_matmul:ci", "--no-cache", "--workers", "0")
    assert res.exit_code == 2 and "--workers" in res.output


def test_export_refuses_an_sgraph_it_cannot_prove_and_writes_nothing(tmp_path):
    _, ref = workloads.reference_for("gated_mlp:ci")
    data = ref.to_json()
    data["kernels"][0]["post"][0]["op"] = "sigmoid"  # no longer the program
    f = tmp_path / "wrong.json"
    f.write_text(json.dumps(data))
    cu = tmp_path / "wrong.cu"
    res = invoke("export", "gated_mlp:ci", "--cuda", str(cu), "--sgraph", str(f), "--params", "gx=2,F=4")
    assert res.exit_code == 1 and "is not proved equal to gated_mlp:ci" in res.stderr and "nothing written" in res.stderr
    assert not cu.exists()
    res = invoke("export", "gated_mlp:ci", "--cuda", str(cu), "--sgraph", "reference", "--params", "gx=2,F=4")
    assert res.exit_code == 0 and cu.read_text().startswith("/*")


def test_files_that_cannot_be_written_are_one_clear_error(tmp_path):
    res = invoke("export", "rmsnorm_matmul:ci", "--cuda", str(tmp_path / "none" / "x.cu"), "--sgraph", "reference")
    assert res.exit_code == 2 and f"cannot write {tmp_path / 'none' / 'x.cu'}: No such file or directory" in res.stderr
    res = invoke("export", "rmsnorm_matmul:ci", "--cuda", str(tmp_path), "--sgraph", "reference")
    assert res.exit_code == 2 and f"cannot write {tmp_path}: Is a directory" in res.stderr


def test_programs_too_large_to_check_or_index_are_refused_up_front(tmp_path):
    def program_file(n: int) -> str:
        p = Program("big")
        p.output(p.op("exp", p.input("X", (4, 8), "f16"), name="E"))
        f = tmp_path / f"p{n}.json"
        f.write_text(p.dumps().replace("8", str(n)))  # past what the builder itself accepts
        return str(f)

    res = invoke("optimize", program_file(2**31), "--no-cache")
    assert res.exit_code == 2 and "node 'X' (input): shape [4, 2147483648] has 8,589,934,592 elements" in res.stderr
    # 16,777,259 is prime: checks would evaluate X at its full 67 million elements.
    res = invoke("optimize", program_file(16_777_259), "--no-cache")
    assert res.exit_code == 2
    assert "node 'X' (input): checking the program needs it at shape [4, 16777259]" in res.stderr


def test_a_program_of_views_only_reports_strict_json(tmp_path, monkeypatch):
    """Its schedules are all free (0 us, like its baseline): the speedup is 1, not 0/0 printed as
    `Infinity`, which no JSON parser accepts."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    p = Program("views")
    p.output(p.op("reshape", p.input("X", (1, 1), "f16"), name="R", shape=[1]))
    f = tmp_path / "views.json"
    f.write_text(p.dumps())
    res = invoke("optimize", str(f), "--target", "h100", "--json")
    assert res.exit_code == 0, res.output

    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    report = json.loads(res.stdout, parse_constant=refuse)
    assert report["best"]["time_us"] == report["best"]["baseline_time_us"] == 0 and report["best"]["speedup"] == 1.0


def test_a_search_cut_short_says_how_far_it_got(tmp_path, monkeypatch):
    """A budget that runs out leaves the best so far: the summary names the kernel counts that
    were searched completely (the schedules the winner is fastest among) and when it was found."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    cut = invoke("optimize", "gqa", "--no-cache", "--target", "h100", "--max-states", "250")
    assert cut.exit_code == 0, cut.output
    assert "(budget exhausted: the best so far, found at" in cut.stdout
    assert "every schedule of up to 2 kernels was searched, deeper ones in part)" in cut.stdout
    early = invoke("optimize", "ntrans:ci", "--no-cache", "--target", "h100", "--max-states", "100")
    assert early.exit_code == 0, early.output
    assert "no kernel count was searched completely)" in early.stdout
    whole = invoke("optimize", "ntrans:ci", "--no-cache", "--target", "h100")
    assert whole.exit_code == 0 and "budget exhausted" not in whole.stdout and "searched completely" not in whole.stdout


def test_a_schedule_passes_from_command_to_command_as_sgraph_json(tmp_path, monkeypatch):
    """`optimize` and `show` could print a schedule but not hand it on: `verify`, `run --sgraph`
    and `export --sgraph` read sGraph JSON, and a report from `cache export` was "unknown sGraph
    schema None". `run` without --params takes the cost model's parameters, as `export` does."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    db = str(tmp_path / "superopt.db")
    win, ref, report = tmp_path / "win.json", tmp_path / "ref.json", tmp_path / "report.json"
    res = invoke("optimize", "gqa:ci", "--target", "h100", "--db", db, "--sgraph-out", str(win), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(win.read_text()) == json.loads(res.stdout)["best"]["sgraph"]
    shown = invoke("show", "gqa:ci", "--reference", "--sgraph-out", str(ref))
    assert shown.exit_code == 0 and shown.stdout == "" and f"wrote {ref}" in shown.stderr
    [entry] = json.loads(invoke("cache", "ls", "--db", db, "--json").stdout)
    assert invoke("cache", "export", str(entry["kernel_id"]), "--db", db, "--out", str(report)).exit_code == 0
    for sgraph in (win, ref, report):
        proved = invoke("verify", "gqa:ci", str(sgraph))
        assert proved.exit_code == 0 and "PROVED" in proved.stdout, proved.output
        ran = invoke("run", "gqa:ci", "--sgraph", str(sgraph), "--target", "h100")
        assert ran.exit_code == 0 and "within the f16 tolerance" in ran.stdout, ran.output
    assert "(no params)" not in invoke("run", "gqa:ci", "--sgraph", str(win)).stdout


def test_export_takes_the_search_options_optimize_takes(tmp_path, monkeypatch):
    """`export` searched with the default budget and the cache, whatever the user needed."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    cu = tmp_path / "x.cu"
    res = invoke("export", "gqa:ci", "--cuda", str(cu), "--target", "h100", "--budget-s", "20", "--no-cache",
                 "--force")
    assert res.exit_code == 0 and cu.is_file(), res.output
    bad = invoke("export", "gqa:ci", "--cuda", str(cu), "--budget-s", "0")
    assert bad.exit_code == 2 and "budget_s:" in bad.stderr
    given = invoke("export", "gqa:ci", "--cuda", str(cu), "--sgraph", "reference", "--budget-s", "20")
    assert given.exit_code == 2 and "--sgraph exports the schedule given" in given.stderr


def test_a_bad_limit_in_the_environment_is_one_error_line(monkeypatch):
    monkeypatch.setenv("SUPEROPT_MAX_TENSOR_ELEMENTS", "abc")
    res = invoke("programs")
    assert res.exit_code == 2
    assert res.stderr.strip() == ("error: SUPEROPT_MAX_TENSOR_ELEMENTS: expected a positive integer at most "
                                  "2,147,483,647, got 'abc'")


def test_help_shows_no_developer_notes():
    res = invoke("--help")
    assert res.exit_code == 0 and "Find, prove and time" in res.stdout
    assert "Typer" not in res.stdout and "exit 2" not in res.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["check", "a" * 300], f"error: {'a' * 64!r}... (300 characters): File name too long\n"),
    (["optimize", "a" * 300], f"error: {'a' * 64!r}... (300 characters): File name too long\n"),
    (["cache", "ls", "--db", "postgresql://user:hunter2@[::1"],
     "error: bad database URL 'postgresql://***@[::1': expected sqlite:///FILE or postgresql://...\n"),
    (["submit", "ntrans:ci", "--db", "sqlite:///file:x?mode=memory&cache=shared&uri=true"],
     "error: SQLite URL options are not supported in sqlite:///file%3Ax?cache=shared&mode=memory&uri=true: give "
     "sqlite:///FILE or a path\n"),
])
def test_what_the_system_or_a_url_refuses_is_one_error_line(tmp_path, monkeypatch, args, message):
    """A file name past the system's limit, a URL whose port is no number, and an SQLite URI
    (mode=memory: a queue that vanished with the process, its key file looked for elsewhere)
    printed tracebacks or were taken; none shows a password."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    res = invoke(*args)
    assert res.exit_code == 2 and res.stderr == message, res.output
    assert list(tmp_path.iterdir()) == []


def test_a_worker_lease_is_bounded():
    """A lease of 1e9 s kept a dead worker's job running (until 2058) out of every other worker's reach."""
    res = invoke("worker", "--lease-s", "1e9", "--once")
    assert res.exit_code == 2 and "less than or equal to 3600" in res.output


@pytest.mark.parametrize("option", ["--svg", "--sgraph-out"])
def test_optimize_refuses_an_output_path_it_cannot_write_before_searching(tmp_path, monkeypatch, option):
    """--svg DIR failed only after the search had run and stored its result."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    for path, why in ((tmp_path, "a directory"), (tmp_path / "no" / "x.svg", f"no directory {tmp_path / 'no'}")):
        res = invoke("optimize", "ntrans:ci", "--target", "h100", option, str(path))
        assert res.exit_code == 2 and res.stderr == f"error: cannot write {path}: {why}\n", res.output
    assert not (tmp_path / "cache").exists()  # no search ran, no cache was opened


def test_serve_refuses_an_address_it_cannot_listen_on_in_one_line(tmp_path):
    """A port in use, or a host that is no address of this machine, printed uvicorn's log lines and
    exited 3."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = invoke("serve", "--port", str(port), "--db", str(tmp_path / "s.db"))
    assert res.exit_code == 2 and res.stderr == f"error: serve: cannot listen on 127.0.0.1:{port}: Address already " \
        "in use\n", res.output


@pytest.mark.parametrize(("args", "message"), [
    (["optimize", "--bogus", "gqa:ci"], "error: No such option: --bogus (see 'superopt optimize --help')"),
    (["optimize"], "error: Missing argument 'spec' (see 'superopt optimize --help')"),
    (["status", "abc"], "error: Invalid value for 'job_id': Input should be a valid integer, unable to parse "
                        "string as an integer (see 'superopt status --help')"),
    (["nocmd"], "error: No such command 'nocmd' (see 'superopt --help')"),
    (["cache", "ls", "--bogus"], "error: No such option: --bogus (see 'superopt cache ls --help')"),
])
def test_a_usage_error_is_one_error_line(args, message):
    """An unknown option or a value of the wrong type printed Typer's usage text and a boxed
    message: four lines or more, unlike every other error of the input."""
    res = runner.invoke(app, args, prog_name="superopt")
    assert res.exit_code == 2 and res.stderr.strip() == message and res.stdout == ""
