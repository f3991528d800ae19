"""The OpenAPI schema says what each route does and which errors it answers, with their body:
every error a route is made to answer here is one it declares."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from superopt.db.engine import open_database
from superopt.service import WHY, create_app

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def service(tmp_path):
    db = open_database(str(tmp_path / "superopt.db"))
    app = create_app(db, token=TOKEN, max_body_bytes=4096)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield app.openapi(), client
    db.close()


def operations(api: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(method.upper(), path): op for path, methods in api["paths"].items() for method, op in methods.items()}


def declared(api: dict[str, Any], method: str, url: str) -> set[int]:
    """The statuses the route serving `method url` declares."""
    for (m, path), op in operations(api).items():
        if m == method and re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", path), url.split("?")[0]):
            return {int(code) for code in op["responses"]}
    raise AssertionError(f"no route serves {method} {url}")


def test_every_route_says_what_it_does_and_declares_its_errors_with_a_body(service):
    api, _ = service
    ops = operations(api)
    assert len(ops) == 8
    for (method, path), op in ops.items():
        assert op.get("summary") and len(op.get("description", "")) > 40, (method, path)
        codes = {int(c) for c in op["responses"]}
        assert 421 in codes, (method, path)  # the Host allow-list answers before any route
        guarded = bool(op.get("security"))
        assert (401 in codes) == guarded, (method, path)
        if guarded or path == "/health/ready":
            assert 503 in codes, (method, path)
        if op.get("parameters") or op.get("requestBody"):
            assert 422 in codes, (method, path)
        for code, response in op["responses"].items():
            if int(code) >= 400:
                schema = response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
                assert schema == ("Health" if (path, code) == ("/health", "503") else "ErrorBody"), (path, code)
                if schema == "ErrorBody":
                    assert response["description"] == WHY[int(code)], (method, path, code)
    assert set(api["components"]["schemas"]["ErrorBody"]["required"]) == {"detail", "field"}
    assert "HTTPValidationError" not in api["components"]["schemas"]  # 422 answers ErrorBody, not FastAPI's


def test_every_error_a_route_answers_is_declared(service):
    api, client = service
    job = client.post("/jobs", json={"program": "gqa:ci", "target": "h100"}, headers=AUTH).json()
    assert client.delete(f"/jobs/{job['id']}", headers=AUTH).status_code == 200
    requests: list[tuple[int, str, str, dict[str, Any]]] = [
        (401, "GET", "/jobs/1", {}),
        (401, "POST", "/jobs", {"json": {"program": "gqa:ci"}}),
        (401, "GET", "/cache", {}),
        (421, "GET", "/health", {"headers": {"host": "evil.example"}}),
        (421, "GET", "/health/live", {"headers": {"host": "evil.example"}}),
        (421, "GET", "/kernels/1", {"headers": {**AUTH, "host": "evil.example"}}),
        (404, "GET", "/jobs/999999", {"headers": AUTH}),
        (404, "DELETE", "/jobs/999999", {"headers": AUTH}),
        (404, "GET", "/kernels/999999", {"headers": AUTH}),
        (409, "DELETE", f"/jobs/{job['id']}", {"headers": AUTH}),
        (413, "POST", "/jobs", {"json": {"program": "x" * 5000}, "headers": AUTH}),
        (415, "POST", "/jobs", {"content": b"program=gqa", "headers": {**AUTH, "content-type": "text/plain"}}),
        (422, "POST", "/jobs", {"json": {"program": "gqa:ci", "budget_s": 0}, "headers": AUTH}),
        (422, "GET", "/jobs/abc", {"headers": AUTH}),
        (422, "DELETE", "/jobs/abc", {"headers": AUTH}),
        (422, "GET", "/kernels/abc", {"headers": AUTH}),
        (422, "GET", "/cache?hash=zz", {"headers": AUTH}),
    ]
    for status, method, url, kwargs in requests:
        res = client.request(method, url, **kwargs)
        assert res.status_code == status, (method, url, res.text)
        assert set(res.json()) == {"detail", "field"}, (method, url, res.text)
        assert status in declared(api, method, url), (method, url, status)
