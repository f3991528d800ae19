"""The web dashboard of `superopt serve`: jobs, a submit form, the kernel cache, kernels, a chart.

Pages are Jinja2 templates rendered on the server (autoescaped: program names are user text)
with one small script that polls /ui/jobs.json every 2 s; CSS and JS are served from the
package, so the dashboard works offline and behind any firewall.

It is the API's own app (same Host allow-list, body limits and token). With SUPEROPT_TOKEN set,
a browser cannot send a bearer header, so the dashboard also accepts a cookie: open
`/?token=TOKEN` once (or type the token into the login form) and the answer sets an HttpOnly,
SameSite=Strict cookie holding an HMAC of the token (never the token), then redirects to the page
without the token in its address. SameSite=Strict keeps other sites from submitting the forms.

    GET  /                      jobs (live state and progress)
    GET  /ui/jobs.json          what the jobs page polls
    GET  /ui/submit, POST       the submit form
    GET  /ui/cache              the kernel cache (?program=&target=&hash=)
    GET  /ui/kernels/{id}       sGraph picture, CUDA source, parameters, verdict
    GET  /ui/kernels/{id}/kernel.cu
    GET  /ui/chart              speedups over unfused per program and target
    POST /ui/login, /ui/logout  the token cookie
    GET  /ui/static/{name}      CSS and JS
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures.
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jinja2
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from markupsafe import escape

import superopt
from superopt.charts import bar_chart, speedup_bars
from superopt.config import DEFAULT_TARGET
from superopt.dashboard_data import JOBS_MAX, JOBS_SHOWN, CacheListing, cache_groups, recent_jobs, speedup_rows
from superopt.db.cache import KernelCache
from superopt.db.errors import NotFound, RequestError
from superopt.db.jobs import JobQueue
from superopt.jobspec import parse_request
from superopt.jsontext import JSONTextError, parse_json
from superopt.sgraph import SGraph, SGraphError
from superopt.svg import render_svg
from superopt.targets import TARGETS

COOKIE = "superopt_session"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
Authorize = Callable[[HTTPAuthorizationCredentials | None], None]


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("superopt", "templates"), autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,  # a typo in a template fails its test instead of showing nothing
    )
    env.filters["us"] = lambda x: "–" if x is None else f"{x:,.2f} µs"
    env.filters["x"] = lambda x: "–" if x is None else f"{x:.2f}×"
    env.globals["version"] = superopt.__version__
    return env


def _static(name: str) -> str | None:
    """The text of a packaged static file, or None: only plain names with a known suffix."""
    if "/" in name or "\\" in name or name.startswith(".") or not any(name.endswith(s) for s in STATIC_TYPES):
        return None
    f = resources.files("superopt").joinpath("static", name)
    return f.read_text(encoding="utf-8") if f.is_file() else None


def session_value(token: str) -> str:
    """The cookie for `token`: an HMAC, so a stolen cookie (or a log of one) does not give the token
    for the API's bearer header."""
    return hmac.new(token.encode(), b"superopt-dashboard-session", hashlib.sha256).hexdigest()


def router(queue: JobQueue, cache: KernelCache, token: str | None, authorized: Authorize) -> APIRouter:
    """The dashboard's routes over the service's queue and cache; `authorized` is the service's
    bearer check, which a request without the dashboard cookie goes through."""
    routes = APIRouter(include_in_schema=False)
    env = _templates()
    listing = CacheListing(cache)

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        body = env.get_template(name).render({"token_set": token is not None, "signing_in": False, **context})
        return HTMLResponse(body, status, headers={"Cache-Control": "no-store"})

    def signed_in(request: Request) -> bool:
        if token is None:
            return True
        cookie = request.cookies.get(COOKIE, "")
        if cookie and secrets.compare_digest(cookie.encode(), session_value(token).encode()):
            return True
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        try:
            authorized(HTTPAuthorizationCredentials(scheme=scheme, credentials=credentials.strip())
                       if scheme.lower() == "bearer" and credentials.strip() else None)
        except HTTPException:
            return False
        return True

    def login(request: Request, error: str = "") -> HTMLResponse:
        return page("login.html", 401, next=request.url.path, error=error, signing_in=True)

    def with_cookie(response: Response) -> Response:
        assert token is not None
        response.set_cookie(COOKIE, session_value(token), httponly=True, samesite="strict", path="/")
        return response

    def gate(request: Request) -> Response | None:
        """None when the request may see the page; else the answer: the login form, or a redirect
        that sets the cookie when the address carries the right ?token=."""
        given = request.query_params.get("token")
        if token is not None and given is not None:
            if not secrets.compare_digest(given.encode(), token.encode()):
                return login(request, "wrong token")
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            return with_cookie(RedirectResponse(target, 303))
        return None if signed_in(request) else login(request)

    def same_origin(request: Request) -> bool:
        """A form post comes from a page of this service (SameSite=Strict already keeps the cookie
        off other sites' posts; this also covers a service without a token)."""
        origin = request.headers.get("origin")
        if origin is None:
            return True
        return origin != "null" and urlsplit(origin).netloc == request.headers.get("host")

    async def form(request: Request) -> dict[str, str]:
        fields = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[-1] for k, v in fields.items()}

    @routes.get("/ui/static/{name}")
    def static(name: str) -> Response:
        text = _static(name)
        if text is None:
            return JSONResponse({"detail": f"name: no static file {name[:80]!r}", "field": "name"}, 404)
        suffix = name[name.rindex("."):]
        return Response(text, media_type=STATIC_TYPES[suffix], headers={"Cache-Control": "max-age=300"})

    @routes.post("/ui/login")
    async def login_post(request: Request) -> Response:
        fields = await form(request)
        nxt = fields.get("next", "/")
        nxt = nxt if nxt.startswith("/") and not nxt.startswith("//") else "/"
        if token is None:
            return RedirectResponse(nxt, 303)
        if not secrets.compare_digest(fields.get("token", "").encode(), token.encode()):
            return page("login.html", 401, next=nxt, error="wrong token", signing_in=True)
        return with_cookie(RedirectResponse(nxt, 303))

    @routes.post("/ui/logout")
    def logout() -> Response:
        response = RedirectResponse("/", 303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @routes.get("/")
    def jobs_page(request: Request, limit: Annotated[int, Query(ge=1, le=JOBS_MAX)] = JOBS_SHOWN) -> Response:
        if (stop := gate(request)) is not None:
            return stop
        rows = recent_jobs(cache.db, limit)
        return page("jobs.html", rows=rows, limit=limit, submitted=request.query_params.get("submitted", ""))

    @routes.get("/ui/jobs.json")
    def jobs_json(request: Request, limit: Annotated[int, Query(ge=1, le=JOBS_MAX)] = JOBS_SHOWN) -> dict[str, Any]:
        if not signed_in(request):
            authorized(None)  # raises the API's 401
        return {"jobs": recent_jobs(cache.db, limit)}

    @routes.get("/ui/submit")
    def submit_page(request: Request) -> Response:
        if (stop := gate(request)) is not None:
            return stop
        values = {"target": DEFAULT_TARGET, "budget_s": "", "program": ""}
        return page("submit.html", targets=sorted(TARGETS), values=values, error="")

    @routes.post("/ui/submit")
    async def submit_post(request: Request) -> Response:
        if not signed_in(request):
            return login(request)
        if not same_origin(request):
            return JSONResponse({"detail": "origin: a form from another site", "field": "origin"}, 403)
        values = await form(request)
        try:
            job_id = _submit(queue, values)
        except RequestError as e:
            return page("submit.html", 422, targets=sorted(TARGETS), values=values, error=str(e))
        return RedirectResponse(f"/?submitted={job_id}", 303)

    @routes.get("/ui/cache")
    def cache_page(request: Request, program: str = "", target: str = "", hash: str = "") -> Response:
        if (stop := gate(request)) is not None:
            return stop
        error, groups = "", []
        try:
            groups = cache_groups(listing, program=program.strip(), target=target.strip(), hash_prefix=hash.strip())
        except RequestError as e:
            error = str(e)
        filters = {"program": program, "target": target, "hash": hash}
        return page("cache.html", groups=groups, filters=filters, error=error, status=422 if error else 200)

    @routes.get("/ui/kernels/{kernel_id}")
    def kernel_page(request: Request, kernel_id: int) -> Response:
        if (stop := gate(request)) is not None:
            return stop
        try:
            k = cache.kernel(kernel_id)
        except NotFound as e:
            return page("error.html", 404, message=str(e))
        return page("kernel.html", k=k, svg=_picture(k), cuda_lines=(k.get("cuda") or "").splitlines(),
                    layers=_layers(k.get("verdict") or {}))

    @routes.get("/ui/kernels/{kernel_id}/kernel.cu")
    def kernel_source(request: Request, kernel_id: int) -> Response:
        if (stop := gate(request)) is not None:
            return stop
        try:
            cuda = cache.kernel(kernel_id).get("cuda")
        except NotFound as e:
            return page("error.html", 404, message=str(e))
        if not cuda:
            return page("error.html", 404, message=f"kernel {kernel_id} has no CUDA source")
        return Response(cuda, media_type="text/plain; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="kernel_{kernel_id}.cu"'})

    @routes.get("/ui/chart")
    def chart_page(request: Request, target: str = "") -> Response:
        if (stop := gate(request)) is not None:
            return stop
        groups = cache_groups(listing, target=target.strip())
        svg = bar_chart(speedup_bars(speedup_rows(groups)), title="speedup over unfused (best cached kernel)",
                        reference=1.0, unit="×")
        return page("chart.html", svg=svg, target=target, count=len(groups))

    return routes


def _submit(queue: JobQueue, values: dict[str, str]) -> int:
    """Queue the form's job; a RequestError names the field that is wrong."""
    text = values.get("program", "").strip()
    if not text:
        raise RequestError("program", "give a built-in workload name or paste a program JSON")
    try:
        program: Any = parse_json(text) if text.startswith("{") else text
    except JSONTextError as e:
        raise RequestError("program", str(e)) from None
    data: dict[str, Any] = {"program": program}
    if values.get("target", "").strip():
        data["target"] = values["target"].strip()
    budget = values.get("budget_s", "").strip()
    if budget:
        try:
            data["budget_s"] = float(budget)
        except ValueError:
            raise RequestError("budget_s", f"expected a number of seconds, got {budget[:40]!r}") from None
    req = parse_request(data)
    return req.submit_to(queue, req.build_program()).id


def _picture(k: dict[str, Any]) -> str:
    """The sGraph as SVG (render_svg escapes every name it draws), or a note why there is none."""
    try:
        sg = SGraph.from_json(k["sgraph"])
        return render_svg(sg, {str(a): int(b) for a, b in (k.get("params") or {}).items()},
                          caption=f"kernel {k['id']} of {k['program']['name']}")
    except (SGraphError, KeyError, TypeError, ValueError) as e:
        return f'<p class="note">no picture: {escape(str(e))}</p>'


def _layers(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict's layers as table rows: layer, result, time, shapes checked, other details."""
    rows = []
    for layer in verdict.get("layers") or []:
        detail = dict(layer.get("detail") or {})
        shapes = detail.pop("shapes", None)  # {tensor: shape}: the sizes this layer checked at
        params = detail.pop("params", None)
        rows.append({
            "layer": layer.get("layer", "?"), "passed": layer.get("passed"), "ms": layer.get("ms"),
            "shapes": "; ".join(f"{n} {list(v)}" for n, v in sorted(_items(shapes))),
            "params": ", ".join(f"{a}={b}" for a, b in sorted(_items(params))),
            "detail": json.dumps(_brief(detail), sort_keys=True) if detail else "",
        })
    return rows


def _items(d: Any) -> list[tuple[str, Any]]:
    return [(str(k), v) for k, v in d.items()] if isinstance(d, dict) else []


def _brief(detail: dict[str, Any]) -> dict[str, Any]:
    """The detail without its long parts (e.g. the e-graph's per-rule counts)."""
    return {k: v for k, v in detail.items() if not isinstance(v, dict | list) or len(json.dumps(v)) < 120}
