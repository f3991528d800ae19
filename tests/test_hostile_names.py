"""Names are data, never code. A name that could end a comment, splice a line or start a directive
in generated CUDA is refused by the program grammar wherever a program comes in (builder, JSON, the
CLI, HTTP, `optimize`); and names that reach code generation anyway (an sGraph from a file or a
database row, which follow no grammar) stay inside comments, escaped, but for their letters, digits
and `_` in parameter names. Checked on the preprocessed source: whatever the names, it is the one
the generator writes for plain names, line for line, parameters numbered by first use."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from typer.testing import CliRunner

from superopt import sgraph_schema, workloads
from superopt.api import optimize
from superopt.build import unfused_baseline
from superopt.cli import app
from superopt.codegen import generate
from superopt.codegen.names import comment_text
from superopt.costmodel import best_params
from superopt.db.cache import KernelCache
from superopt.db.engine import open_database
from superopt.db.errors import CacheIntegrityWarning
from superopt.db.models import Job
from superopt.instantiate import instantiate
from superopt.program import Program, ProgramError
from superopt.service import create_app
from superopt.sgraph import SGraph, SGraphError
from superopt.targets import TARGETS

H100 = TARGETS["h100"]
HARNESS_INCLUDE = Path(__file__).resolve().parent / "cuda_harness" / "include"
INCLUDE = '#include "/etc/hostname"'
HOSTILE = {
    "newline": f"X\n{INCLUDE}\n//",
    "end of block comment": f"X */ {INCLUDE} /*",
    "start of block comment": "X /* never closed",
    "directive": INCLUDE,
    "backslash splice": "X\\",
    "quotes": "X\"'",
    "carriage return": f"X\r{INCLUDE}\r//",
    "unicode line separators": f"X\u2028{INCLUDE}\u2029//",
    "nul": f"X\x00{INCLUDE}",
    "trigraph splice": "X??/",
    "lone surrogate": "X\ud800",
}
# sGraph JSON (files, database rows) holds only strings that encode: all but the lone surrogate.
IN_SGRAPHS = {k: v for k, v in HOSTILE.items() if k != "lone surrogate"}
# Accepted by the grammar, and found nowhere in generated code outside comments.
ACCEPTED = {"program": "tiny.prog:v1-a", "x": "in.X:0-a", "w": "_w.B:1", "norm": "norm:n-1", "out": "out.Y-2"}
REFUSED = "is not a valid name: a name is 1 to 64 characters"
runner = CliRunner()


def accepted_program() -> Program:
    p = Program(ACCEPTED["program"])
    x = p.input(ACCEPTED["x"], (8, 64), "f16")
    w = p.input(ACCEPTED["w"], (64, 32), "f16")
    p.output(p.op("matmul", p.op("rms_norm", x, name=ACCEPTED["norm"]), w, name=ACCEPTED["out"]))
    return p.validate()


def program_json(node_id: str = "X", name: str = "p") -> str:
    """A small program's JSON text with these names (escaped as JSON: NUL and lone surrogates too)."""
    data = {"schema": "superopt.program/1", "name": name, "nodes": [
        {"id": node_id, "op": "input", "shape": [4, 8], "dtype": "f16"},
        {"id": "E", "op": "exp", "inputs": [node_id]},
    ], "outputs": ["E"]}
    return json.dumps(data)


# -- the grammar refuses them wherever a program comes in --------------------------------------


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_builder_and_json_refuse_hostile_names_with_one_clear_message(name):
    attempts: list[Callable[[], Any]] = [
        lambda: Program("p").input(name, (4, 8)),
        lambda: Program(name).validate(),
        lambda: Program.loads(program_json(node_id=name)),
        lambda: Program.loads(program_json(name=name)),
    ]
    for attempt in attempts:
        with pytest.raises(ProgramError, match=REFUSED) as e:
            attempt()
        assert str(e.value).isprintable()  # the name quoted escaped: one line, no control characters


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_optimize_refuses_a_hostile_program_name_before_searching(name):
    p = Program(name)
    p.output(p.exp(p.input("X", (4, 8))))
    with pytest.raises(ProgramError, match=REFUSED):
        optimize(p, target="h100", cache=False, reuse=False)


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_export_refuses_hostile_names_and_writes_nothing(tmp_path, name):
    f, cu = tmp_path / "p.json", tmp_path / "p.cu"
    f.write_text(program_json(node_id=name))
    res = runner.invoke(app, ["export", str(f), "--cuda", str(cu), "--sgraph", "baseline"])
    assert res.exit_code == 2 and REFUSED in res.stderr, res.output
    assert not cu.exists()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    db = open_database(f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'superopt.db'}")
    yield db, TestClient(create_app(db), base_url="http://127.0.0.1")
    db.close()


def job_rows(db) -> int:
    with db.read() as s:
        return int(s.scalar(select(func.count()).select_from(Job)))


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_http_refuses_hostile_names_and_writes_nothing(service, name):
    db, client = service
    for program in (program_json(node_id=name), program_json(name=name)):
        res = client.post("/jobs", content=f'{{"program": {program}}}'.encode(),
                          headers={"content-type": "application/json"})
        assert res.status_code == 422 and res.json()["field"] == "program", res.text
        assert REFUSED in res.json()["detail"]
    assert job_rows(db) == 0


# -- generated source holds no line the generator did not write --------------------------------


def preprocessor() -> list[str]:
    """nvcc's preprocessor, else cpp against the CPU harness's stand-in CUDA headers."""
    if (nvcc := shutil.which("nvcc")) is not None:
        return [nvcc, "-E", "-x", "cu"]
    if (cpp := shutil.which("cpp")) is not None:
        return [cpp, "-x", "c++", "-I", str(HARNESS_INCLUDE)]
    pytest.skip("neither nvcc nor cpp is on PATH: generated source cannot be preprocessed here")


def preprocessed(source: str, workdir: Path) -> tuple[list[str], set[str]]:
    """What the compiler sees of `source`: its non-blank lines (comments gone, kernel names'
    digests of the sGraph name made equal, parameters named by first use) and the files it reads."""
    assert source.isascii(), "generated source must be ASCII whatever the names"
    path, out = workdir / "kernel.cu", workdir / "kernel.i"
    path.write_text(source)
    subprocess.run([*preprocessor(), str(path), "-o", str(out)], check=True, capture_output=True, timeout=120)
    lines, files, params = [], set(), {}
    for line in out.read_text(errors="replace").splitlines():
        if marker := re.match(r'#(?:line)? ?\d+ "([^"]*)"', line):
            files.add(marker.group(1))
        elif line.strip():
            line = re.sub(r"\b[po]_\w+", lambda m: params.setdefault(m.group(), f"param_{len(params)}"), line)
            lines.append(re.sub(r"so_[0-9a-f]{8}_k", "so_KERNEL_k", line))
    return lines, files


def directives(source: str) -> list[str]:
    return [ln.strip() for ln in source.splitlines() if ln.lstrip().startswith("#")]


def hostile_doc(sg: SGraph, name: str, *, keep_inputs: bool = False) -> dict[str, Any]:
    """`sg`'s JSON with `name` appended to every id in it (its name, tensors, kernels, tiles, grid
    and loop axes), as a hand-edited sGraph file may hold (the program's inputs kept when
    `keep_inputs`: a schedule for that program)."""
    doc = copy.deepcopy(sg.to_json())
    kept = {t["id"] for t in doc["inputs"]} if keep_inputs else set()

    def new(old: str) -> str:
        return old if old in kept else f"{old}{name}"  # last on its line in comments: a backslash splices

    doc["name"] = new(doc["name"])
    doc["inputs"] = [{**t, "id": new(t["id"])} for t in doc["inputs"]]
    doc["outputs"] = [new(t) for t in doc["outputs"]]
    for k in doc["kernels"]:
        k["id"] = new(k["id"])
        if k["kind"] == "library":
            k["inputs"], k["output"] = [new(t) for t in k["inputs"]], new(k["output"])
            continue
        for axis in [*k["grid"], k["loop"]]:
            axis["name"] = new(axis["name"])
        for i in k["inputs"]:
            i["id"], i["tensor"] = new(i["id"]), new(i["tensor"])
        for op in [*k.get("body", []), *k.get("post", [])]:
            op["id"], op["inputs"] = new(op["id"]), [new(t) for t in op["inputs"]]
        for a in k["accumulators"]:
            a["id"], a["source"] = new(a["id"]), new(a["source"])
        for o in k["outputs"]:
            o["source"], o["tensor"] = new(o["source"]), new(o["tensor"])
    return json.loads(json.dumps(doc))


def hostile_sgraph(sg: SGraph, name: str, *, keep_inputs: bool = False) -> SGraph:
    """`hostile_doc` as an SGraph, built past the name checks of its JSON (which refuse it): an
    SGraph made in Python, through the API, follows no grammar."""
    with mock.patch.multiple(sgraph_schema, name_problem=lambda _: None, sgraph_name_problem=lambda _: None):
        return SGraph.from_json(hostile_doc(sg, name, keep_inputs=keep_inputs))


@pytest.fixture(scope="module")
def winner():
    """The searched winner of the accepted-names program: its sGraph, parameters and source."""
    best = optimize(accepted_program(), target="h100", budget_s=60, max_states=300, cache=False, reuse=False).best
    assert best.cuda is not None
    return best.sgraph, dict(best.params), best.cuda


@pytest.fixture(scope="module")
def schedules(winner) -> dict[str, tuple[SGraph, dict[str, int]]]:
    baseline = unfused_baseline(accepted_program())
    _, lora = workloads.reference_for("lora:ci")  # library and graph kernels, a loop and accumulators
    return {"unfused baseline": (baseline, best_params(baseline, H100)), "searched winner": winner[:2],
            "lora reference": (lora, best_params(lora, H100))}


def assert_names_only_in_comments(source: str, tmp_path: Path) -> None:
    lines, files = preprocessed(source, tmp_path)
    assert not [ln for ln in lines if any(n in ln for n in ACCEPTED.values())]
    assert not [f for f in files if "hostname" in f]


@pytest.mark.parametrize("kind", ["unfused baseline", "searched winner"])
def test_accepted_names_appear_only_in_comments(schedules, winner, tmp_path, kind):
    sg, params = schedules[kind]
    source = generate(instantiate(sg, params, H100)).source
    assert all(n in source for n in (ACCEPTED["x"], ACCEPTED["w"]))  # readable: the comments name them
    assert_names_only_in_comments(source, tmp_path)
    if kind == "searched winner":
        assert source == winner[2]  # what optimize attached is the same source


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_comment_text_is_one_inert_line_of_ascii(name):
    text = comment_text(f"{name} *//* ?? \\")
    assert text.isascii() and text.isprintable() and "\\" not in text
    assert not any(d in text for d in ("*/", "/*", "??"))


def test_an_sgraph_file_cannot_hold_a_lone_surrogate(schedules):
    with pytest.raises(SGraphError, match="not a valid sGraph name"):
        SGraph.from_json(hostile_doc(schedules["unfused baseline"][0], HOSTILE["lone surrogate"]))


@pytest.mark.parametrize("name", IN_SGRAPHS.values(), ids=IN_SGRAPHS.keys())
@pytest.mark.parametrize("kind", ["unfused baseline", "searched winner", "lora reference"])
def test_hostile_names_in_an_sgraph_do_not_reach_the_code(schedules, tmp_path, kind, name):
    sg, params = schedules[kind]
    plain = generate(instantiate(sg, params, H100)).source
    hostile = generate(instantiate(hostile_sgraph(sg, name), params, H100)).source
    assert directives(hostile) == directives(plain)
    assert preprocessed(hostile, tmp_path) == preprocessed(plain, tmp_path)


def test_an_sgraph_file_with_hostile_names_is_refused(winner, tmp_path):
    """`superopt export PROGRAM --sgraph FILE`: the file's own tensors, tiles and axes carry
    hostile names (escape sequences, line breaks, comment ends, 100,000 characters). They were
    accepted, printed raw to the terminal, and stored, signed, in the kernel cache; an sGraph's
    names now keep to the program names' grammar: one error naming the place, nothing written."""
    sg, params, _ = winner
    prog = tmp_path / "p.json"
    prog.write_text(accepted_program().dumps())
    text = ",".join(f"{k}={v}" for k, v in params.items())
    for i, name in enumerate([*IN_SGRAPHS.values(), "\x1b[2J\x1b[31m", "x" * 100_000]):
        f, cu = tmp_path / f"s{i}.json", tmp_path / f"s{i}.cu"
        f.write_text(json.dumps(hostile_doc(sg, name, keep_inputs=True)))
        res = runner.invoke(app, ["export", str(prog), "--cuda", str(cu), "--sgraph", str(f), "--params", text])
        assert res.exit_code == 2 and not cu.exists(), res.output
        assert res.output.startswith("error: ") and res.output.count("\n") == 1 and len(res.output) < 600, res.output
        assert "not a valid" in res.output and "\x1b" not in res.output, res.output


def test_export_and_the_served_kernel_keep_accepted_names_in_comments(tmp_path):
    out = tmp_path / "baseline.cu"
    prog = tmp_path / "p.json"
    prog.write_text(accepted_program().dumps())
    res = runner.invoke(app, ["export", str(prog), "--cuda", str(out), "--sgraph", "baseline"])
    assert res.exit_code == 0, res.output
    assert_names_only_in_comments(out.read_text(), tmp_path)
    url = f"sqlite:///{tmp_path / 'superopt.db'}"
    program = accepted_program()
    optimize(program, target="h100", budget_s=60, max_states=300, db=url, reuse=False)
    db = open_database(url)
    (entry,) = KernelCache(db).entries(program.canonical_hash())
    served = TestClient(create_app(db), base_url="http://127.0.0.1").get(f"/kernels/{entry.kernel_id}").json()["cuda"]
    db.close()
    assert_names_only_in_comments(served, tmp_path)


HOSTILE_TEXT = "\x1b]0;PWNED\x07\x1b[2J[bold]EVIL[/bold]\u202e"


def test_text_edited_into_the_database_reaches_no_terminal_as_control_codes_or_markup(tmp_path, monkeypatch):
    """A program name or a job's error edited in the database reached the terminal raw: `status`
    cleared the screen and set its title, and Rich read `[bold]` as markup. Shown now as escapes,
    literally, by status, cache ls (its warning: the edited name fails the row's MAC) and verify."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    url = f"sqlite:///{tmp_path / 'superopt.db'}"
    optimize(workloads.resolve("ntrans:ci"), target="h100", budget_s=60, db=url)
    db = open_database(url)
    with db.write() as s:
        job = s.get_one(Job, 1)
        job.error, job.workload.name = HOSTILE_TEXT, HOSTILE_TEXT
    db.close()
    shown = r"\x1b]0;PWNED\x07\x1b[2J[bold]EVIL[/bold]\u202e"
    for command in (["status", "1"], ["cache", "verify"]):
        res = CliRunner().invoke(app, [*command, "--db", url])
        assert not any(c in res.output for c in "\x1b\x07\u202e"), (command, res.output)
        assert shown in "".join(line.strip(" │") for line in res.output.splitlines()), (command, res.output)
    with pytest.warns(CacheIntegrityWarning) as warned:
        res = CliRunner().invoke(app, ["cache", "ls", "--db", url])
    assert res.output == "the cache holds no winner\n"
    assert [f"kernel cache entry 1 ({shown}," in str(w.message) for w in warned] == [True]
