"""The HTTP service (`superopt serve`): submit jobs, follow them, read the kernel cache.

It only reads and writes rows: searches run in workers (`superopt worker`), never in this
process. Every request a client gets wrong is answered 4xx with `{"detail": "FIELD: problem",
"field": "FIELD"}` and writes nothing. With a token (SUPEROPT_TOKEN) every route but the health
checks needs `Authorization: Bearer TOKEN`, the API docs too (/docs, /redoc, /openapi.json).

What the network may send is bounded: a Host header outside the allow-list (the loopback names by
default: a DNS-rebinding page reaches a loopback service under its own name) is answered 421;
request bodies are capped in size (413) and must arrive within a deadline (408), so a client that
announces more than it sends does not hold a connection. While the database is unreachable every
route that needs it answers 503 with Retry-After, and the health checks say so.

    POST   /jobs            {"program": <program JSON or built-in name>, "target", "budget_s", ...}
                            Idempotency-Key header: a retried submission answers the same job;
                            answers the job as GET /jobs/{id} shows it: succeeded, with its
                            result, at once when the cache has the answer
    GET    /jobs/{id}       {"id", "state", "progress", "error", "result", ...}
    DELETE /jobs/{id}       cancel
    GET    /cache?hash=&target=&program=&limit=&offset=
                            cached winners, newest first (those `superopt cache ls` lists), paged
    GET    /kernels/{id}    sGraph, parameters, CUDA source, verdict, times
    GET    /health          version and database status (503 while the database is unreachable)
    GET    /health/live     the process answers
    GET    /health/ready    the database answers (503 while it does not)
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures, whose annotations
# name objects local to create_app.
import asyncio
import logging
import re
import secrets
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from sqlalchemy.exc import InterfaceError, InternalError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import superopt
from superopt import dashboard
from superopt.config import BODY_TIMEOUT_S, HOSTS_ENV, MAX_BODY_BYTES, MAX_ROWS
from superopt.db.cache import KernelCache
from superopt.db.engine import Database, read_only, reason, unavailable
from superopt.db.errors import Conflict, NotFound, RequestError
from superopt.db.jobs import JobQueue
from superopt.jobspec import JobRequest, request_error
from superopt.jsontext import json_problem
from superopt.jsontext import loads as strict_loads
from superopt.limits import shown

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
RETRY_AFTER_S = 5  # what a client told 503 should wait: a worker's longest backoff step
IDEMPOTENCY_KEY = r"^[!-~]{1,200}$"  # visible ASCII: a UUID, a hash, a client's request id
DEFAULT_PAGE, MAX_PAGE = 50, 200  # cached winners per page of GET /cache: by default, and at most
PRINTABLE = r"^[ -~]+$"  # ASCII text: what target names and fingerprints are made of (no NUL: PostgreSQL refuses it)
log = logging.getLogger("superopt.service")
TOKEN_IN_QUERY = re.compile(r"([?&]token=)[^&#]*")


class HiddenTokens(logging.Filter):
    """The access log without the token a dashboard sign-in carries in its address (`/?token=`):
    uvicorn logs each request's path with its query."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(TOKEN_IN_QUERY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        return True


class ErrorBody(BaseModel):
    """What every error answers, so that a client can show one line and point at the field."""

    detail: str = Field(description="the problem, after the field it is in", examples=["budget_s: Input should be "
                                                                                          "greater than 0"])
    field: str = Field(description="the field, header or part of the request at fault", examples=["budget_s"])


class Health(BaseModel):
    """What GET /health answers: 200 with "ok" while the database answers, else 503."""

    status: str = Field(description='"ok" or "unavailable"')
    version: str = Field(description="superopt's version")
    database: str = Field(description='"ok" or "unreachable"')


# Why each error status is answered; a route declares those it can answer (`errors`).
WHY = {
    401: "a token is set and the request does not send it as Authorization: Bearer TOKEN",
    404: "no job or kernel with that id",
    408: "the request body did not arrive in time",
    409: "the job has already finished",
    413: "the request body is too large",
    415: "the body is not application/json",
    421: "the Host header names none of the names the service answers to",
    422: "a field is invalid, missing or unknown, or the body is not JSON",
    503: "the database is unreachable; try again after Retry-After seconds",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of these error statuses, each with ErrorBody."""
    return {code: {"model": ErrorBody, "description": WHY[code]} for code in codes}


class ApiError(HTTPException):
    """A client error that names the field it is about."""

    def __init__(self, status: int, field: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, f"{field}: {message}", headers)
        self.field = field


def _answer(status: int, field: str, detail: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "field": field}, status_code=status, headers=headers)


def _unavailable() -> JSONResponse:
    """503: the request may well succeed once the database is back, which Retry-After says."""
    return _answer(503, "database", "database: unreachable; try again later", {"Retry-After": str(RETRY_AFTER_S)})


class StrictJSONRequest(Request):
    """A request whose JSON body refuses a key given twice in one object (`jsontext.loads`), as
    files and batch lines do; FastAPI's decoder keeps the last one."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_loads(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """A route that hands its endpoint a `StrictJSONRequest` (a failure is answered by `_unparsed`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


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


class BodyDeadline:
    """Answer 408 (and close the connection) when a request's body has not fully arrived within
    `seconds` of the first read: uvicorn waits for an announced body as long as the client keeps
    the connection open, so a client that sends less than its Content-Length held a worker
    thread and a connection forever."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        complete = False

        async def timed() -> Message:
            nonlocal deadline, complete
            if complete:  # the body is in: later reads wait for a disconnect, unbounded
                return await receive()
            deadline = deadline or loop.time() + self.seconds
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise ApiError(408, "body", f"the request body did not arrive within {self.seconds:g} s",
                               {"Connection": "close"}) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, timed, send)


def host_name(value: str) -> str:
    """The host of a Host header or an allow-list entry, without port, brackets, case or a final
    dot: "[::1]:8000" -> "::1", "LocalHost.:80" -> "localhost"."""
    v = value.strip().lower()
    if v.startswith("[") and "]" in v:
        address, _, rest = v[1:].partition("]")
        return address if rest == "" or (rest[:1] == ":" and rest[1:].isdigit()) else v  # "[::1]evil" is no host
    name, colon, port = v.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        v = name
    return v.rstrip(".")


class HostAllowList:
    """Answer 421 to a request whose Host header names none of `hosts` ("*": any). A page that
    rebinds its own DNS name to 127.0.0.1 can make a browser send requests to a loopback
    service, but only under that name, which this refuses."""

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app, self.any = app, "*" in hosts
        self.hosts = frozenset(host_name(h) for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.any:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(host) not in self.hosts:
                allowed = ", ".join(sorted(self.hosts))
                await _answer(421, "host", f"host: {shown(host)} is not a name this service answers to "
                                           f"(allowed: {allowed}; see {HOSTS_ENV})")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route takes, its dependencies' included."""
    return {p.alias for p in dependant.query_params}.union(*map(_query_names, dependant.dependencies))


def known_parameters(request: Request) -> None:
    """Refuse a query parameter the route does not take: `GET /cache?hsah=...` would otherwise
    list every winner as if no filter had been asked for."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    taken = _query_names(route.dependant)
    for name in request.query_params:
        if name in taken and len(request.query_params.getlist(name)) > 1:
            raise ApiError(422, name, "given more than once (this route takes one value)")
        if name not in taken:
            expected = f"one of {', '.join(sorted(taken))}" if taken else "none"
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
                raise ApiError(422, name, f"unknown query parameter (this route takes {expected})")
            raise ApiError(422, "query", f"unknown parameter {shown(name)} (this route takes {expected})")


def create_app(
    db: Database, *, token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
    allowed_hosts: Collection[str] = LOOPBACK_HOSTS, body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    app = FastAPI(title="superopt", version=superopt.__version__, summary=__doc__.splitlines()[0],
                  docs_url=None, redoc_url=None, openapi_url=None)  # served below, behind the token
    app.router.route_class = StrictJSONRoute
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(BodyDeadline, seconds=body_timeout_s)
    app.add_middleware(HostAllowList, hosts=allowed_hosts)
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
        if request.method == "POST" and kind.split(";")[0].strip().lower() != "application/json":
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
        if e.status_code in (404, 405):  # no such route, or not this method: the error body every route has
            what = "path" if e.status_code == 404 else "method"
            return _answer(e.status_code, what, f"{what}: {str(e.detail).lower()}", e.headers)
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

    async def _database_down(request: Request, e: Exception) -> JSONResponse:
        if read_only(e):
            log.warning("%s %s: the database refuses writes: %s", request.method, request.url.path, reason(e))
            return _answer(503, "database", f"database: refuses writes ({reason(e)}); nothing was written")
        if not unavailable(e):  # a wrong statement (SQLite says OperationalError to both): a 500, logged
            raise e
        log.warning("%s %s: database unreachable: %s", request.method, request.url.path, reason(e))
        return _unavailable()

    # an unreachable database (engine.unavailable), or one that refuses writes (engine.read_only)
    for kind in (OperationalError, InterfaceError, InternalError, PoolTimeout):
        app.add_exception_handler(kind, _database_down)

    def database_reachable() -> bool:
        try:
            db.ping()
        except SQLAlchemyError as e:
            if not unavailable(e):
                raise
            log.warning("health check: database unreachable: %s", reason(e))
            return False
        return True

    guarded = [Depends(authorized), Depends(known_parameters)]

    @app.get("/health", summary="Version and database status", response_model=Health, responses={
        **errors(421), 503: {"model": Health, "description": "the database is unreachable; Retry-After says when to "
                                                               "ask again"}})
    def health() -> JSONResponse:
        """The service's version and whether its database answers, for people and monitors."""
        up = database_reachable()
        body = {"status": "ok" if up else "unavailable", "version": superopt.__version__,
                "database": "ok" if up else "unreachable"}
        return JSONResponse(body, 200 if up else 503, None if up else {"Retry-After": str(RETRY_AFTER_S)})

    @app.get("/health/live", summary="The process answers", responses=errors(421))
    def live() -> dict[str, str]:
        """Liveness: answers while the process runs, whatever the database does."""
        return {"status": "ok"}

    @app.get("/health/ready", summary="The database answers", responses=errors(421, 503))
    def ready() -> JSONResponse:
        """Readiness, for a load balancer: 200 while the database answers, else 503."""
        if not database_reachable():
            return _unavailable()
        return JSONResponse({"status": "ok", "database": "ok"})

    @app.get("/openapi.json", include_in_schema=False, dependencies=guarded)
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False, dependencies=guarded)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="superopt API")

    @app.get("/redoc", include_in_schema=False, dependencies=guarded)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="superopt API")

    @app.post("/jobs", status_code=201, dependencies=guarded, summary="Submit an optimization job",
              responses=errors(401, 408, 413, 415, 421, 422, 503))
    def submit(
        req: JobRequest,
        idempotency_key: Annotated[str | None, Header(
            pattern=IDEMPOTENCY_KEY, description="a retry with this key and the same body answers the same job; "
                                                 "with another body, 422")] = None,
    ) -> dict[str, Any]:
        """Queue a job for the workers and answer it as GET /jobs/{job_id} shows it. A program the
        kernel cache answers (same program, target and search bounds; not `force`) is answered at
        once: state "succeeded", `cache_hit` true, the result, no worker needed."""
        return req.submit_to(queue, req.build_program(), idempotency_key=idempotency_key).to_json()

    @app.get("/jobs/{job_id}", dependencies=guarded, summary="A job", responses=errors(401, 404, 421, 422, 503))
    def job(job_id: int) -> dict[str, Any]:
        """A job: its state, progress while it runs, then its result (the winner's kernel id, times,
        verdict) or its error."""
        return queue.get(job_id).to_json()

    @app.delete("/jobs/{job_id}", dependencies=guarded, summary="Cancel a job",
                responses=errors(401, 404, 409, 421, 422, 503))
    def cancel(job_id: int) -> dict[str, Any]:
        """Cancel a queued or running job (a running one's worker stops at its next heartbeat); a
        finished job cannot be, 409."""
        view = queue.cancel(job_id)
        return {"id": view.id, "state": view.state.value}

    @app.get("/cache", dependencies=guarded, summary="Cached winners", responses=errors(401, 421, 422, 503))
    def lookup(
        hash: Annotated[str | None, Query(description="canonical program hash or a prefix: 4 to 64 lowercase hex "
                                                      "digits")] = None,
        target: Annotated[str | None, Query(max_length=500, pattern=PRINTABLE,
                                            description="target name or fingerprint")] = None,
        program: Annotated[str | None, Query(max_length=200, pattern=PRINTABLE, description="program name")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="winners per page")] = DEFAULT_PAGE,
        offset: Annotated[int, Query(ge=0, le=MAX_ROWS, description="winners skipped")] = 0,
    ) -> dict[str, Any]:
        """The kernel cache's winners, newest first, a page at a time (what `superopt cache ls`
        lists), optionally of one program hash (or prefix), target or program name."""
        entries = cache.entries(hash, target, program=program, limit=limit, offset=offset)
        return {"entries": [e.to_json() for e in entries], "limit": limit, "offset": offset}

    @app.get("/kernels/{kernel_id}", dependencies=guarded, summary="A stored kernel",
             responses=errors(401, 404, 421, 422, 503))
    def kernel(kernel_id: int) -> dict[str, Any]:
        """A stored kernel: its sGraph, parameters, CUDA source, verdict and times, checked as a
        cache hit's kernel is before it is served; a row that fails the check is answered 404."""
        return cache.kernel(kernel_id)

    app.include_router(dashboard.router(queue, cache, token, authorized))  # the web UI at /
    return app
