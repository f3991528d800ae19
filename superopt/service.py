"""The HTTP service (`superopt serve`): submit jobs, follow them, read the kernel cache.

It only reads and writes rows: searches run in workers (`superopt worker`), never in this
process. Every request a client gets wrong is answered 4xx with `{"detail": "FIELD: problem",
"field": "FIELD"}` and writes nothing. With a token (SUPEROPT_TOKEN) every route but /health
needs `Authorization: Bearer TOKEN`. Request bodies are capped in size before they are parsed.

    POST   /jobs            {"program": <program JSON or built-in name>, "target", "budget_s", ...}
    GET    /jobs/{id}       {"id", "state", "progress", "error", "result", ...}
    DELETE /jobs/{id}       cancel
    GET    /cache?hash=&target=
    GET    /kernels/{id}    sGraph, parameters, CUDA source, verdict, times
    GET    /health
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures, whose annotations
# name objects local to create_app.
import secrets
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import superopt
from superopt.db.cache import KernelCache
from superopt.db.engine import Database
from superopt.db.errors import Conflict, NotFound, RequestError
from superopt.db.jobs import JobQueue
from superopt.jobspec import JobRequest, request_error
from superopt.jsontext import json_problem

DEFAULT_MAX_BODY = 1 << 20  # 1 MiB: the largest built-in program JSON is a few KB


class ApiError(HTTPException):
    """A client error that names the field it is about."""

    def __init__(self, status: int, field: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, f"{field}: {message}", headers)
        self.field = field


def _answer(status: int, field: str, detail: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "field": field}, status_code=status, headers=headers)


class BodyLimit:
    """Refuse request bodies over `max_bytes` (413), by Content-Length or as they stream in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _answer(413, "body", f"body: {self._too_large()}")(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise ApiError(413, "body", self._too_large())
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> str:
        return f"request body is larger than {self.max_bytes} bytes"


def create_app(db: Database, *, token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY) -> FastAPI:
    app = FastAPI(title="superopt", version=superopt.__version__, summary=__doc__.splitlines()[0])
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    queue, cache = JobQueue(db), KernelCache(db)
    bearer = HTTPBearer(auto_error=False)

    def authorized(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if token is None:
            return
        if creds is None or not secrets.compare_digest(creds.credentials.encode(), token.encode()):
            raise ApiError(401, "authorization", "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, e: ApiError) -> JSONResponse:
        return _answer(e.status_code, e.field, str(e.detail), e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if request.method == "POST" and not kind.startswith("application/json"):
            return _answer(415, "content-type", f"content-type: expected application/json, got {kind or 'none'}")
        err = request_error(e.errors())
        return _answer(422, err.field, str(err))

    @app.exception_handler(StarletteHTTPException)
    async def _unparsed(request: Request, e: StarletteHTTPException) -> Any:
        """FastAPI answers a body its JSON decoder fails on other than by a decode error (not
        UTF-8, nested too deeply, an integer too long) with a bare 400; say what is wrong."""
        problem = json_problem(e.__cause__) if e.__cause__ is not None else None
        if e.status_code == 400 and problem is not None:
            return _answer(422, "body", f"body: {problem}")
        return await http_exception_handler(request, e)

    @app.exception_handler(RequestError)
    async def _bad_request(_request: Request, e: RequestError) -> JSONResponse:
        return _answer(422, e.field, str(e))

    @app.exception_handler(NotFound)
    async def _not_found(_request: Request, e: NotFound) -> JSONResponse:
        return _answer(404, "id", f"id: {e}")

    @app.exception_handler(Conflict)
    async def _conflict(_request: Request, e: Conflict) -> JSONResponse:
        return _answer(409, "state", f"state: {e}")

    guarded = [Depends(authorized)]

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": superopt.__version__}

    @app.post("/jobs", status_code=201, dependencies=guarded)
    def submit(req: JobRequest) -> dict[str, Any]:
        job = req.submit_to(queue, req.build_program())
        return {"id": job.id, "state": job.state.value, "cache_hit": job.cache_hit}

    @app.get("/jobs/{job_id}", dependencies=guarded)
    def job(job_id: int) -> dict[str, Any]:
        return queue.get(job_id).to_json()

    @app.delete("/jobs/{job_id}", dependencies=guarded)
    def cancel(job_id: int) -> dict[str, Any]:
        view = queue.cancel(job_id)
        return {"id": view.id, "state": view.state.value}

    @app.get("/cache", dependencies=guarded)
    def lookup(
        hash: Annotated[str, Query(pattern="^[0-9a-fA-F]{6,64}$", description="canonical program hash or a prefix")],
        target: Annotated[str | None, Query(max_length=500, description="target name or fingerprint")] = None,
    ) -> dict[str, Any]:
        return {"entries": [e.to_json() for e in cache.entries(hash, target)]}

    @app.get("/kernels/{kernel_id}", dependencies=guarded)
    def kernel(kernel_id: int) -> dict[str, Any]:
        return cache.kernel(kernel_id)

    return app
