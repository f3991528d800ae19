"""Hostile requests against the HTTP service, over real HTTP (uvicorn on 127.0.0.1) on SQLite and
on PostgreSQL: malformed and oversized bodies, hostile numbers and strings, programs that break
every limit, wrong content types, ids that try to leave their route, short bodies and foreign Host
headers. Each is answered with the 4xx status listed, the service is ready after it (GET
/health/ready answers 200), and no row is written."""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from db_fixtures import BACKENDS, database_url, running_service
from sqlalchemy import func, select

from superopt.db.engine import open_database
from superopt.db.models import Candidate, Job, Target, Winner, Workload
from superopt.service import create_app

JSON = {"content-type": "application/json"}
BODY_TIMEOUT_S = 1.0
BASE: dict[str, Any] = {"schema": "superopt.program/1", "name": "hostile", "nodes": [
    {"id": "X", "op": "input", "shape": [4, 8], "dtype": "f16"},
    {"id": "E", "op": "exp", "inputs": ["X"]},
], "outputs": ["E"]}


@dataclass(frozen=True)
class Case:
    """One hostile request: through httpx (method, path, keyword arguments) or, for what httpx
    will not send, as `raw` bytes on a socket."""

    name: str
    status: int
    method: str = "POST"
    path: str = "/jobs"
    kwargs: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None


def text(body: str | bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A body sent as given (JSON text httpx would not write: NaN, lone surrogates, bad UTF-8)."""
    return {"content": body.encode() if isinstance(body, str) else body, "headers": headers or JSON}


def request(**fields: Any) -> dict[str, Any]:
    """POST /jobs of a job request, JSON-encoded by the json module (NaN and Infinity as such,
    non-ASCII escaped, so a lone surrogate travels as \\ud800)."""
    return text(json.dumps(fields))


def program(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """A request for BASE with `change` applied to the program JSON."""
    data = copy.deepcopy(BASE)
    change(data)
    return request(program=data, target="h100")


def node(index: int, **values: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda d: d["nodes"][index].update(values)


def shape(dims: Any) -> dict[str, Any]:
    return program(node(0, shape=dims))


def nan_shape(literal: str) -> dict[str, Any]:
    body = json.dumps({"program": BASE, "target": "h100"}).replace("[4, 8]", f"[{literal}, 8]")
    return text(body)


def renamed(nid: str) -> dict[str, Any]:
    return program(lambda d: (d["nodes"][0].update(id=nid), d["nodes"][1].update(inputs=[nid])))


def chain(ops: int) -> dict[str, Any]:
    nodes = [BASE["nodes"][0], *({"id": f"E{i}", "op": "exp", "inputs": [f"E{i - 1}" if i else "X"]}
                                 for i in range(ops))]
    return request(program={**BASE, "nodes": nodes, "outputs": [f"E{ops - 1}"]}, target="h100")


def cycle(d: dict[str, Any]) -> None:
    d["nodes"][1:] = [{"id": "A", "op": "exp", "inputs": ["B"]}, {"id": "B", "op": "exp", "inputs": ["A"]}]
    d["outputs"] = ["B"]


def chunks(total: int) -> Callable[[], Iterator[bytes]]:
    """A body streamed without Content-Length, `total` bytes of a JSON string."""
    def gen() -> Iterator[bytes]:
        yield b'{"program": "'
        for _ in range(total // 65536):
            yield b"x" * 65536
        yield b'"}'

    return gen


def raw(request_line: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """An HTTP/1.1 request as bytes; HOST is replaced by the server's address."""
    head = {"Host": "HOST", **(headers or {})}
    lines = [request_line, *(f"{k}: {v}" for k, v in head.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


CASES = [
    # -- the body is not a JSON object -------------------------------------------------------------
    Case("invalid JSON", 422, kwargs=text("{bad")),
    Case("truncated JSON", 422, kwargs=text('{"program": "gqa:ci"')),
    Case("empty body", 422, kwargs=text("")),
    Case("JSON null", 422, kwargs=text("null")),
    Case("JSON list", 422, kwargs=text("[1, 2]")),
    Case("JSON string", 422, kwargs=text('"gqa:ci"')),
    Case("JSON number", 422, kwargs=text("42")),
    Case("arrays nested 100,000 deep", 422, kwargs=text('{"program":' + "[" * 100_000 + "]" * 100_000 + "}")),
    Case("objects nested 50,000 deep", 422, kwargs=text('{"a":' * 50_000 + "1" + "}" * 50_000)),
    Case("integer of 5,000 digits", 422, kwargs=text('{"program": "gqa:ci", "max_states": ' + "9" * 5000 + "}")),
    Case("not UTF-8", 422, kwargs=text(b'{"program": "\xff\xfe"}')),
    Case("NUL byte between tokens", 422, kwargs=text(b'{"program":\x00 "gqa:ci"}')),
    # -- numbers -----------------------------------------------------------------------------------
    Case("budget 1e400 (infinite)", 422, kwargs=text('{"program": "gqa:ci", "budget_s": 1e400}')),
    Case("budget NaN", 422, kwargs=request(program="gqa:ci", budget_s=float("nan"))),
    Case("budget Infinity", 422, kwargs=request(program="gqa:ci", budget_s=float("inf"))),
    Case("max_states -Infinity", 422, kwargs=request(program="gqa:ci", max_states=float("-inf"))),
    Case("budget negative", 422, kwargs=request(program="gqa:ci", budget_s=-1)),
    Case("budget zero", 422, kwargs=request(program="gqa:ci", budget_s=0)),
    Case("budget 2^40 s", 422, kwargs=request(program="gqa:ci", budget_s=2**40)),
    Case("max_states 2^40", 422, kwargs=request(program="gqa:ci", max_states=2**40)),
    Case("max_states 2^63", 422, kwargs=request(program="gqa:ci", max_states=2**63)),
    Case("max_states a fraction", 422, kwargs=request(program="gqa:ci", max_states=1.5)),
    # -- wrong types -------------------------------------------------------------------------------
    Case("max_states a string", 422, kwargs=request(program="gqa:ci", max_states="5")),
    Case("force a string", 422, kwargs=request(program="gqa:ci", force="true")),
    Case("force a number", 422, kwargs=request(program="gqa:ci", force=1)),
    Case("target a number", 422, kwargs=request(program="gqa:ci", target=5)),
    Case("target null", 422, kwargs=request(program="gqa:ci", target=None)),
    Case("program null", 422, kwargs=request(program=None)),
    Case("program a number", 422, kwargs=request(program=3)),
    Case("program a list", 422, kwargs=request(program=["gqa:ci"])),
    Case("program true", 422, kwargs=request(program=True)),
    Case("config a string", 422, kwargs=request(program="gqa:ci", config="fast")),
    Case("config.max_kernel_ops 2^40", 422, kwargs=request(program="gqa:ci", config={"max_kernel_ops": 2**40})),
    Case("unknown request field", 422, kwargs=request(program="gqa:ci", priority=1)),
    Case("unknown config field", 422, kwargs=request(program="gqa:ci", config={"max_ops": 3})),
    # -- strings -----------------------------------------------------------------------------------
    Case("target unknown", 422, kwargs=request(program="gqa:ci", target="tpu")),
    Case("target with NUL", 422, kwargs=request(program="gqa:ci", target="h100\x00")),
    Case("target of 10,000 characters", 422, kwargs=request(program="gqa:ci", target="h" * 10_000)),
    Case("program name empty", 422, kwargs=request(program="")),
    Case("program name SQL", 422, kwargs=request(program="gqa:ci'; DROP TABLE job; --")),
    Case("program name a path", 422, kwargs=request(program="../../../etc/passwd")),
    Case("program name with NUL", 422, kwargs=request(program="gqa\x00:ci")),
    Case("program name a lone surrogate", 422, kwargs=request(program="\ud800")),
    Case("program name of 10,000 characters", 422, kwargs=request(program="a" * 10_000)),
    Case("program JSON named in SQL", 422, kwargs=program(lambda d: d.update(name="x'; DROP TABLE job; --"))),
    Case("program JSON name of 1,000 characters", 422, kwargs=program(lambda d: d.update(name="p" * 1000))),
    Case("node id with NUL", 422, kwargs=renamed("X\x00")),
    Case("node id a lone surrogate", 422, kwargs=renamed("X\udfff")),
    Case("node id with an escape sequence", 422, kwargs=renamed("X\x1b[2J")),
    Case("node id with a newline", 422, kwargs=renamed("X\nY")),
    Case("node id of 10,000 characters", 422, kwargs=renamed("X" * 10_000)),
    Case("node id in SQL", 422, kwargs=renamed("X); DELETE FROM job; --")),
    Case("node id a number", 422, kwargs=renamed(7)),  # type: ignore[arg-type]
    # -- shapes and sizes --------------------------------------------------------------------------
    Case("a zero dim", 422, kwargs=shape([0, 8])),
    Case("a negative dim", 422, kwargs=shape([-4, 8])),
    Case("a dim of 2^40", 422, kwargs=shape([2**40, 1])),
    Case("a dim of 10^30", 422, kwargs=shape([10**30, 1])),
    Case("a fractional dim", 422, kwargs=shape([4.5, 8])),
    Case("a dim as a string", 422, kwargs=shape(["4", 8])),
    Case("a dim true", 422, kwargs=shape([True, 8])),
    Case("a NaN dim", 422, kwargs=nan_shape("NaN")),
    Case("an infinite dim", 422, kwargs=nan_shape("Infinity")),
    Case("a shape that is a number", 422, kwargs=shape(4)),
    Case("2,000 dims", 422, kwargs=shape([1] * 2000)),
    Case("an oversized tensor", 422, kwargs=shape([65536, 65536])),
    Case("10,000 ops", 422, kwargs=chain(10_000)),
    # -- graphs ------------------------------------------------------------------------------------
    Case("a cycle", 422, kwargs=program(cycle)),
    Case("a node its own input", 422, kwargs=program(node(1, inputs=["E"]))),
    Case("an input that is no node", 422, kwargs=program(node(1, inputs=["nowhere"]))),
    Case("duplicate node ids", 422, kwargs=program(lambda d: d["nodes"].append(dict(d["nodes"][1])))),
    Case("an unknown op", 422, kwargs=program(node(1, op="system"))),
    Case("an unknown dtype", 422, kwargs=program(node(0, dtype="f128"))),
    Case("nodes an object", 422, kwargs=program(lambda d: d.update(nodes={"X": 1}))),
    Case("no outputs", 422, kwargs=program(lambda d: d.update(outputs=[]))),
    Case("an output that is no node", 422, kwargs=program(lambda d: d.update(outputs=["nowhere"]))),
    Case("an unknown schema", 422, kwargs=program(lambda d: d.update(schema="superopt.program/9"))),
    # -- content types, sizes, headers ---------------------------------------------------------------
    Case("content-type text/plain", 415, kwargs=text('{"program": "gqa:ci"}', {"content-type": "text/plain"})),
    Case("content-type form", 415, kwargs={"data": {"program": "gqa:ci"}}),
    Case("no content-type", 415, kwargs={"content": b'{"program": "gqa:ci"}'}),
    Case("oversized body, 2 MiB", 413, kwargs=request(program="x" * (2 << 20))),
    Case("oversized body, streamed", 413, kwargs={"content": chunks(2 << 20), "headers": JSON}),
    Case("Idempotency-Key of 201 characters", 422, kwargs={"json": {"program": "gqa:ci"},
                                                           "headers": {"Idempotency-Key": "k" * 201}}),
    Case("Idempotency-Key not ASCII", 422, kwargs={"json": {"program": "gqa:ci"},
                                                   "headers": {"Idempotency-Key": "clé".encode("latin-1")}}),
    Case("Idempotency-Key with a space", 422, kwargs={"json": {"program": "gqa:ci"},
                                                      "headers": {"Idempotency-Key": "two words"}}),
    Case("short body", 408, raw=raw("POST /jobs HTTP/1.1", {"Content-Type": "application/json",
                                                            "Content-Length": "100"}, b'{"program": ')),
    Case("Content-Length not a number", 400, raw=raw("POST /jobs HTTP/1.1", {"Content-Type": "application/json",
                                                                             "Content-Length": "ten"}, b"{}")),
    Case("Host of another site", 421, kwargs={"json": {"program": "gqa:ci"}, "headers": {"Host": "evil.example"}}),
    Case("Host of another site on a loopback port", 421, kwargs={"json": {"program": "gqa:ci"},
                                                                "headers": {"Host": "localhost.evil.example:80"}}),
    Case("no Host header", 421, raw=b"GET /health/ready HTTP/1.0\r\n\r\n"),
    # -- ids and other endpoints -------------------------------------------------------------------
    Case("job id a word", 422, "GET", "/jobs/abc"),
    Case("job id negative", 404, "GET", "/jobs/-1"),
    Case("job id zero", 404, "GET", "/jobs/0"),
    Case("job id 2^70", 404, "GET", f"/jobs/{2**70}"),
    Case("job id in exponent form", 422, "GET", "/jobs/1e3"),
    Case("job id NUL", 422, "GET", "/jobs/%00"),
    Case("job id in SQL", 422, "GET", "/jobs/1%20OR%201=1"),
    Case("cancel id a word", 422, "DELETE", "/jobs/abc"),
    Case("cancel id negative", 404, "DELETE", "/jobs/-5"),
    Case("cancel with a hostile body", 404, "DELETE", "/jobs/12345", text('{"a":' * 1000 + "1" + "}" * 1000)),
    Case("kernel path traversal", 404, raw=raw("GET /kernels/../etc/passwd HTTP/1.1")),
    Case("kernel path traversal, encoded", 404, "GET", "/kernels/..%2F..%2Fetc%2Fpasswd"),
    Case("kernel id in SQL", 422, "GET", "/kernels/1;DROP%20TABLE%20candidate"),
    Case("cache hash in SQL", 422, "GET", "/cache", {"params": {"hash": "' OR '1'='1"}}),
    Case("cache hash of 10,000 digits", 422, "GET", "/cache", {"params": {"hash": "a" * 10_000}}),
    Case("cache target with NUL", 422, "GET", "/cache", {"params": {"hash": "abcdef", "target": "h100\x00"}}),
    Case("cache target of 501 characters", 422, "GET", "/cache", {"params": {"hash": "abcdef", "target": "t" * 501}}),
    Case("cache target a lone surrogate", 422, "GET", "/cache?hash=abcdef&target=%ED%A0%80"),
    Case("PUT /jobs", 405, "PUT", "/jobs", {"json": {"program": "gqa:ci"}}),
    Case("POST to a job", 405, "POST", "/jobs/1", {"json": {"program": "gqa:ci"}}),
    Case("PATCH a kernel", 405, "PATCH", "/kernels/1", {"json": {}}),
]


def rows(db: Any) -> dict[str, int]:
    with db.read() as s:
        return {m.__tablename__: s.scalar(select(func.count()).select_from(m))
                for m in (Workload, Target, Job, Candidate, Winner)}


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, tmp_path_factory):
    """A service on each backend, with a 1 s body deadline so that a short body is cut off fast."""
    with database_url(request.param, tmp_path_factory.mktemp("hostile")) as url:
        db = open_database(url)
        app = create_app(db, body_timeout_s=BODY_TIMEOUT_S)
        with running_service(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            yield db, client
        db.close()


def send_raw(client: httpx.Client, data: bytes) -> int:
    """The status of the answer to `data`, sent on a socket of its own."""
    host, port = client.base_url.host, client.base_url.port
    assert port is not None
    with socket.create_connection((host, port), timeout=BODY_TIMEOUT_S + 10) as sock:
        sock.sendall(data.replace(b"Host: HOST", f"Host: {host}:{port}".encode()))
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, f"closed without an answer: {answer!r}"
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def answer(client: httpx.Client, case: Case) -> int:
    if case.raw is not None:
        return send_raw(client, case.raw)
    kwargs = {k: v() if callable(v) else v for k, v in case.kwargs.items()}
    return client.request(case.method, case.path, **kwargs).status_code


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_request_is_refused_and_harms_nothing(service, case):
    db, client = service
    before = rows(db)
    assert answer(client, case) == case.status
    assert client.get("/health/ready").status_code == 200
    assert rows(db) == before == {"workload": 0, "target": 0, "job": 0, "candidate": 0, "winner": 0}


def test_there_are_at_least_sixty_kinds():
    assert len({c.name for c in CASES}) == len(CASES) >= 60
