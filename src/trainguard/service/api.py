"""The HTTP API and web page of `trainguard server` (R-RUN-2): FastAPI over the Service.

Handlers are plain `def`s: FastAPI runs them in its thread pool, so the store's short
blocking transactions never stall the event loop that schedules jobs.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from trainguard.errors import JobNotFound, ResumeError, SpecError, StoreError, TrainguardError
from trainguard.records import nodes
from trainguard.records.queries import StoreReader
from trainguard.service.challenge import challenge_proof
from trainguard.service.metrics import render_metrics
from trainguard.service.scheduler import Service
from trainguard.spec.limits import MAX_LIMIT

JOB_REF = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
REPLICA = r"^[a-z][a-z0-9_-]{0,31}-[0-9]{1,5}$"
JobRef = Annotated[str, Path(pattern=JOB_REF)]
EVENTS_PAGE, MAX_EVENTS_PAGE = 200, 1000
"""Events in one answer of /history, by default and at most."""


def _error(status: int, exc: Exception) -> JSONResponse:
    body: dict[str, Any] = {"detail": str(exc)}
    if isinstance(exc, SpecError):
        body["problems"] = exc.problems
    return JSONResponse(body, status_code=status)


def _handler(status: int) -> Callable[[Request, Exception], JSONResponse]:
    def handle(_: Request, exc: Exception) -> JSONResponse:
        return _error(status, exc)

    return handle


def _invalid(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own validation errors, as ours: one line a problem, never the input echoed
    (a body of `1e999` or `NaN` is a float JSON cannot carry back: it answered 500)."""
    assert isinstance(exc, RequestValidationError)
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ())) or "request"
        what = error.get("msg", "invalid")
        if error.get("type") == "dict_type" and tuple(error.get("loc", ())) == ("body",):
            what = 'must be a JSON object: {"spec": {...job spec...}, "cwd": "/path"}'
        problems.append(f"{where}: {what}")
    return JSONResponse({"detail": "; ".join(problems), "problems": problems}, status_code=422)


def _web_file(name: str) -> str:
    return (resources.files("trainguard.service") / "web" / name).read_text(encoding="utf-8")


def create_app(service: Service) -> FastAPI:  # noqa: C901 (the routes: closures over the service, each simple)
    store = service.store
    reader = StoreReader(store)
    token = service.config.token

    def check_token(
        authorization: Annotated[str | None, Header()] = None,
        x_trainguard_token: Annotated[str | None, Header()] = None,
    ) -> None:
        if token is None:
            return
        given = x_trainguard_token or (authorization or "").removeprefix("Bearer ").strip()
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "missing or wrong token (Authorization: Bearer TOKEN)")

    app = FastAPI(title="trainguard", dependencies=[Depends(check_token)])
    open_app = FastAPI()  # the page itself carries no data: it asks the API with the token

    # Our errors as HTTP statuses; the most specific class wins (Starlette looks up the MRO).
    for kind, code in (
        (JobNotFound, 404),
        (nodes.NodeNotFound, 404),
        (SpecError, 422),
        (ResumeError, 409),
        (StoreError, 503),
        (TrainguardError, 400),
    ):
        app.add_exception_handler(kind, _handler(code))
    app.add_exception_handler(RequestValidationError, _invalid)
    open_app.add_exception_handler(RequestValidationError, _invalid)

    @app.get("/api/jobs")
    def list_jobs(limit: Annotated[int, Query(ge=1, le=10000)] = 50) -> list[dict[str, Any]]:
        return reader.jobs(limit)

    @app.post("/api/jobs", status_code=201)
    def submit(body: dict[str, Any]) -> dict[str, Any]:
        if "spec" not in body:
            raise SpecError(['body: must be {"spec": {...job spec...}, "cwd": "/path"}'])
        extra = sorted(set(body) - {"spec", "cwd"})
        if extra:
            raise SpecError([f"body.{extra[0]}: unknown field"])
        cwd = body.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise SpecError([f"cwd: must be a path, got {cwd!r}"])
        job = service.submit(body["spec"], cwd)
        return {"id": job.id, "name": job.name, "state": job.state}

    @app.get("/api/queue")
    def queue() -> dict[str, Any]:
        return service.queue_view()

    @app.get("/api/jobs/{ref}")
    def status(ref: JobRef) -> dict[str, Any]:
        return reader.status(ref)

    @app.get("/api/jobs/{ref}/records")
    def records(ref: JobRef, aggregate: bool = False) -> list[dict[str, Any]]:
        return reader.records(ref, aggregate)

    @app.get("/api/jobs/{ref}/explain")
    def explain(ref: JobRef) -> dict[str, Any]:
        return reader.explain(ref)

    @app.get("/api/jobs/{ref}/stacks")
    def stacks(
        ref: JobRef, attempt: Annotated[int | None, Query(ge=0, le=MAX_LIMIT)] = None
    ) -> list[dict[str, Any]]:
        return reader.stacks(ref, attempt)

    @app.get("/api/jobs/{ref}/goodput")
    def goodput(ref: JobRef) -> dict[str, Any]:
        return reader.goodput(ref)

    @app.get("/api/jobs/{ref}/history")
    def history(
        ref: JobRef,
        limit: Annotated[int, Query(ge=1, le=MAX_EVENTS_PAGE)] = EVENTS_PAGE,
        after: Annotated[int | None, Query(ge=0)] = None,
        before: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        """Transitions, recent progress, and a page of events: the newest `limit` with ids
        in (after, before). `events_more`: older ones in that range were left out (ask again
        with `before` the first id); a poller passes the last id it has as `after`."""
        job = store.resolve_job(ref)
        page, more = store.events_page(job.id, limit, after, before)
        return {
            "transitions": [t.as_dict() for t in store.transitions_of(job.id)],
            "events": [e.as_dict() for e in page],
            "events_more": more,
            "progress": [p.as_dict() for p in store.progress_of(job.id, last=500)],
        }

    @app.get("/api/jobs/{ref}/logs")
    def logs(
        ref: JobRef,
        replica: Annotated[str | None, Query(pattern=REPLICA)] = None,
        attempt: Annotated[int | None, Query(ge=0, le=MAX_LIMIT)] = None,
        tail: Annotated[int | None, Query(ge=0, le=100000)] = None,
    ) -> dict[str, Any]:
        return reader.log(ref, replica, attempt, tail)

    @app.post("/api/jobs/{ref}/cancel")
    def cancel(ref: JobRef) -> dict[str, Any]:
        message = service.cancel(ref)
        job = store.resolve_job(ref)
        return {"id": job.id, "state": job.state, "message": message}

    @app.post("/api/jobs/{ref}/resume")
    def resume(ref: JobRef) -> dict[str, Any]:
        job = service.resume(ref)
        return {"id": job.id, "state": job.state, "message": "queued to resume"}

    @app.get("/api/nodes")
    def list_nodes() -> list[dict[str, Any]]:
        """The node ledger: each node's standing and history (R-EVID-4)."""
        return nodes.nodes_view(store)

    @app.post("/api/nodes/{node}/release")
    def release_node(node: Annotated[str, Path(pattern=nodes.NODE_NAME)]) -> dict[str, Any]:
        return nodes.view(nodes.release(store, node, time.time(), "the server's API"))

    @app.get("/metrics")
    def metrics() -> Response:
        return PlainTextResponse(
            render_metrics(store, service), media_type="text/plain; version=0.0.4"
        )

    @open_app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return _web_file("index.html")

    @open_app.get("/app.js")
    def script() -> Response:
        return Response(_web_file("app.js"), media_type="text/javascript")

    @open_app.get("/style.css")
    def style() -> Response:
        return Response(_web_file("style.css"), media_type="text/css")

    @open_app.get("/api/challenge")
    def challenge(
        request: Request, nonce: Annotated[str, Query(pattern=r"^[0-9a-f]{32,128}$")]
    ) -> dict[str, str | None]:
        """Proof that this server holds its token, for the socket the client reached."""
        here = request.scope.get("server")
        if token is None or not here:
            return {"proof": None}
        return {"proof": challenge_proof(token, nonce, str(here[0]), int(here[1]))}

    @open_app.get("/healthz")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    open_app.mount("/", app)  # everything else goes through the token check
    return open_app
