"""One validation, before storage: names outside the grammar (control characters, NUL, lone
surrogates, too long), ranks, tensors and programs above the size limits, and search budgets above
their maximum are refused by program loading, the CLI (exit 2) and HTTP (422, nothing written, on
either database backend), each with one message naming the node or field and the limit."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from db_fixtures import BACKENDS, database_url
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from typer.testing import CliRunner

from superopt import limits, workloads
from superopt.api import optimize
from superopt.cli import app
from superopt.db.engine import open_database
from superopt.db.errors import RequestError
from superopt.db.models import Candidate, Job, Target, Winner, Workload
from superopt.jobspec import parse_request
from superopt.loading import load_program
from superopt.program import Program, ProgramError
from superopt.service import create_app

REPO = Path(__file__).resolve().parent.parent
BASE: dict[str, Any] = {"schema": "superopt.program/1", "name": "limits", "nodes": [
    {"id": "X", "op": "input", "shape": [4, 8], "dtype": "f16"},
    {"id": "E", "op": "exp", "inputs": ["X"]},
], "outputs": ["E"]}
runner = CliRunner()


def changed(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    change(data)
    return data


def renamed_input(nid: str) -> Callable[[dict[str, Any]], Any]:
    def change(d: dict[str, Any]) -> None:
        d["nodes"][0]["id"], d["nodes"][1]["inputs"] = nid, [nid]

    return change


def input_shape(shape: list[int], dtype: str = "f16") -> Callable[[dict[str, Any]], Any]:
    return lambda d: d["nodes"][0].update(shape=shape, dtype=dtype)


def appended(*nodes: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda d: (d["nodes"].extend(nodes), d.update(outputs=[nodes[-1]["id"]]))


NOT_A_NAME = "is not a valid name: a name is 1 to 64 characters from A-Z a-z 0-9 _ . : - and starts with a letter or _"
# (case, change to BASE, text of the one error)
PROGRAMS = [
    ("NUL in a node id", renamed_input("X\x00"), f"nodes[0]: 'id' 'X\\x00' {NOT_A_NAME}"),
    ("escape sequence in a node id", renamed_input("X\x1b[2J"), f"nodes[0]: 'id' 'X\\x1b[2J' {NOT_A_NAME}"),
    ("DEL in a node id", renamed_input("X\x7f"), f"nodes[0]: 'id' 'X\\x7f' {NOT_A_NAME}"),
    ("tab in a node id", renamed_input("X\tY"), f"nodes[0]: 'id' 'X\\tY' {NOT_A_NAME}"),
    ("lone surrogate in a node id", renamed_input("X\ud800"), f"nodes[0]: 'id' 'X\\ud800' {NOT_A_NAME}"),
    ("space in a node id", renamed_input("X Y"), f"nodes[0]: 'id' 'X Y' {NOT_A_NAME}"),
    ("node id starting with a digit", renamed_input("0X"), f"nodes[0]: 'id' '0X' {NOT_A_NAME}"),
    ("over-long node id", renamed_input("X" * 65),
     f"nodes[0]: 'id' '{'X' * 64}'... (65 characters) is not a valid name: 65 characters; at most 64"),
    ("control character in the program name", lambda d: d.update(name="p\r"), f"'name' 'p\\r' {NOT_A_NAME}"),
    ("lone surrogate in the program name", lambda d: d.update(name="\udfff"), f"'name' '\\udfff' {NOT_A_NAME}"),
    ("over-long program name", lambda d: d.update(name="p" * 100),
     "(100 characters) is not a valid name: 100 characters; at most 64"),
    ("rank above the maximum", input_shape([1] * 9), "node 'X' (input): rank 9; at most 8 dimensions"),
    ("a reshape above the maximum rank", appended({"id": "R", "op": "reshape", "inputs": ["E"],
                                                   "attrs": {"shape": [1] * 7 + [4, 8]}}),
     "node 'R' (reshape): rank 9; at most 8 dimensions"),
    ("an input above the element limit", input_shape([32768, 32768]),
     "node 'X' (input): shape [32768, 32768] has 1,073,741,824 elements; at most 268,435,456 "
     "(SUPEROPT_MAX_TENSOR_ELEMENTS)"),
    ("a product above the element limit",
     lambda d: (input_shape([16384, 1])(d), appended({"id": "W", "op": "input", "shape": [1, 32768], "dtype": "f16"},
                                                      {"id": "Y", "op": "matmul", "inputs": ["E", "W"]})(d)),
     "node 'Y' (matmul): shape [16384, 32768] has 536,870,912 elements; at most 268,435,456"),
    ("a program above the byte limit",
     lambda d: (input_shape([16384, 16384], "f32")(d),
                appended(*({"id": f"E{i}", "op": "exp", "inputs": [f"E{i - 1}" if i else "E"]} for i in range(3)))(d)),
     "program 'limits': its tensors take 5,368,709,120 bytes in their dtypes; at most 4,294,967,296 "
     "(SUPEROPT_MAX_PROGRAM_BYTES); the largest is node 'X' with 1,073,741,824 bytes"),
]
IDS = [case[0] for case in PROGRAMS]


# -- program loading ----------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [case[1:] for case in PROGRAMS], ids=IDS)
def test_program_json_beyond_a_limit_is_refused_naming_it(change, message):
    with pytest.raises(ProgramError) as e:
        Program.from_json(changed(change))
    assert message in str(e.value) and str(e.value).isprintable(), str(e.value)


@pytest.mark.parametrize(("change", "message"), [case[1:] for case in PROGRAMS], ids=IDS)
def test_program_files_are_loaded_through_the_same_checks(tmp_path, change, message):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(changed(change)))  # JSON escapes: NUL and lone surrogates travel as \\u0000, \\ud800
    with pytest.raises(ProgramError) as e:
        load_program(str(f))
    assert str(e.value).startswith(f"{f}: ") and message in str(e.value)


def test_the_builder_checks_names_and_ranks_as_it_builds():
    p = Program("p")
    with pytest.raises(ProgramError, match="node id 'X\\\\n' is not a valid name"):
        p.input("X\n", (4, 8))
    with pytest.raises(ProgramError, match="node 'X' \\(input\\): rank 9; at most 8 dimensions"):
        p.input("X", (1,) * 9)
    with pytest.raises(ProgramError, match="program name 'a/b' is not a valid name"):
        Program("a/b").validate()


def test_values_at_the_limits_are_accepted():
    name = "N" * limits.MAX_NAME_LENGTH
    p = Program(name)
    x = p.input(name.lower(), (1,) * (limits.MAX_RANK - 2) + (16384, 16384), "f16")  # 2^28 elements
    p.output(p.exp(x))
    assert Program.from_json(p.validate().to_json()).name == name


def test_every_built_in_and_shipped_program_is_within_the_limits():
    for w in workloads.WORKLOADS.values():
        for label in w.shapes:
            w.program(label).validate()
    for f in sorted((REPO / "scripts" / "programs").glob("*.json")):
        load_program(str(f))


def test_the_size_limits_are_configurable(monkeypatch):
    monkeypatch.setenv(limits.TENSOR_ELEMENTS_ENV, "16")
    with pytest.raises(ProgramError, match="has 32 elements; at most 16 \\(SUPEROPT_MAX_TENSOR_ELEMENTS\\)"):
        Program.from_json(BASE)
    monkeypatch.delenv(limits.TENSOR_ELEMENTS_ENV)
    monkeypatch.setenv(limits.PROGRAM_BYTES_ENV, "100")
    with pytest.raises(ProgramError, match="take 128 bytes in their dtypes; at most 100 \\(SUPEROPT_MAX_PROGRAM_BYTES\\)"):
        Program.from_json(BASE)
    for value in ("lots", "0", str(2**31), "\uff15", "1_000", "-5"):  # a full-width 5, a grouped 1000
        monkeypatch.setenv(limits.TENSOR_ELEMENTS_ENV, value)
        with pytest.raises(ValueError, match="SUPEROPT_MAX_TENSOR_ELEMENTS: expected a positive integer"):
            Program.from_json(BASE)


# -- search budgets -----------------------------------------------------------------------------

BUDGETS = [
    ({"budget_s": limits.MAX_BUDGET_S + 1}, "budget_s", "less than or equal to 604800"),
    ({"max_states": limits.MAX_STATES + 1}, "max_states", "less than or equal to 1000000000000"),
]


@pytest.mark.parametrize(("options", "field", "message"), BUDGETS)
def test_budgets_above_the_maximum_are_refused(options, field, message):
    with pytest.raises(RequestError) as e:
        parse_request({"program": "gqa:ci", **options})
    assert e.value.field == field and message in str(e.value)
    with pytest.raises(ValueError, match=f"{field}: must be .* at most"):
        optimize(workloads.resolve("gqa:ci"), target="h100", cache=False, reuse=False, **options)


# -- the CLI: exit 2, nothing queued ------------------------------------------------------------


def row_counts(url: str) -> dict[str, int]:
    db = open_database(url)
    try:
        with db.read() as s:
            return {m.__tablename__: int(s.scalar(select(func.count()).select_from(m)))
                    for m in (Workload, Target, Job, Candidate, Winner)}
    finally:
        db.close()


EMPTY = {"workload": 0, "target": 0, "job": 0, "candidate": 0, "winner": 0}


@pytest.mark.parametrize(("change", "message"), [case[1:] for case in PROGRAMS], ids=IDS)
def test_cli_refuses_with_exit_2_and_queues_nothing(tmp_path, change, message):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(changed(change)))
    url = f"sqlite:///{tmp_path / 'superopt.db'}"
    for args in (["check", str(f)], ["submit", str(f), "--db", url]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and message in res.stderr, (args, res.output)
        assert res.stderr.count("\n") == 1  # one line: the name is quoted escaped
    assert row_counts(url) == EMPTY


@pytest.mark.parametrize(("options", "field", "message"), BUDGETS)
def test_cli_refuses_budgets_above_the_maximum(tmp_path, options, field, message):
    url = f"sqlite:///{tmp_path / 'superopt.db'}"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    for args in (["optimize", "gqa:ci", "--no-cache", *flags], ["submit", "gqa:ci", "--db", url, *flags]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and f"{field}: Input should be {message}" in res.stderr, (args, res.output)
    assert row_counts(url) == EMPTY


# -- HTTP: 422 naming the field, no row written, on both backends -------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, tmp_path_factory):
    with database_url(request.param, tmp_path_factory.mktemp("limits")) as url:
        db = open_database(url)
        yield url, TestClient(create_app(db), base_url="http://127.0.0.1")
        db.close()


def post(client: TestClient, body: dict[str, Any]) -> Any:
    """POST /jobs with `body` as JSON text escaped to ASCII (a lone surrogate travels as \\ud800)."""
    return client.post("/jobs", content=json.dumps(body).encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize(("change", "message"), [case[1:] for case in PROGRAMS], ids=IDS)
def test_http_refuses_programs_beyond_a_limit_and_writes_nothing(service, change, message):
    url, client = service
    res = post(client, {"program": changed(change), "target": "h100"})
    body = res.json()
    assert res.status_code == 422 and body["field"] == "program", res.text
    assert body["detail"].startswith("program: ") and message in body["detail"], body
    assert row_counts(url) == EMPTY


@pytest.mark.parametrize(("options", "field", "message"), BUDGETS)
def test_http_refuses_budgets_above_the_maximum_and_writes_nothing(service, options, field, message):
    url, client = service
    res = post(client, {"program": "gqa:ci", **options})
    assert res.status_code == 422 and res.json()["field"] == field and message in res.json()["detail"], res.text
    assert row_counts(url) == EMPTY
