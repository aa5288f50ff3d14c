"""The CLI's side of `--server URL`: the same questions, asked over HTTP (stdlib only)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from trainguard.errors import JobNotFound, ResumeError, SpecError, TrainguardError


class ServerError(TrainguardError):
    """The server could not be reached, or answered with an error of its own."""


class Client:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ServerError(f"--server: must be an http:// or https:// URL, got {url!r}")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("TRAINGUARD_TOKEN")
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        params = {k: v for k, v in query.items() if v is not None}
        url = self.url + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise self._error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(
                f"cannot reach the trainguard server at {self.url}: {reason}"
            ) from None

    def _error(self, exc: urllib.error.HTTPError) -> TrainguardError:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        detail = body.get("detail")
        if isinstance(detail, list):  # FastAPI's own validation errors
            detail = "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
            )
        detail = detail or exc.reason
        if exc.code == 404:
            return JobNotFound(str(detail))
        if exc.code == 409:
            return ResumeError(str(detail))
        if exc.code == 422:
            return SpecError(body.get("problems") or [str(detail)])
        if exc.code == 401:
            return ServerError(
                f"the server refused the request: {detail} (--token / TRAINGUARD_TOKEN)"
            )
        return ServerError(f"the server answered {exc.code}: {detail}")

    # The Reader protocol (queries.py), so the CLI prints a server's answers as its own.
    def jobs(self, limit: int) -> list[dict[str, Any]]:
        return list(self.call("GET", "/api/jobs", limit=limit))

    def status(self, ref: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/api/jobs/{_ref(ref)}"))

    def records(self, ref: str, aggregate: bool) -> list[dict[str, Any]]:
        return list(
            self.call("GET", f"/api/jobs/{_ref(ref)}/records", aggregate=str(aggregate).lower())
        )

    def explain(self, ref: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/api/jobs/{_ref(ref)}/explain"))

    def stacks(self, ref: str, attempt: int | None) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/api/jobs/{_ref(ref)}/stacks", attempt=attempt))

    def goodput(self, ref: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/api/jobs/{_ref(ref)}/goodput"))

    def log(
        self, ref: str, replica: str | None, attempt: int | None, tail: int | None
    ) -> dict[str, Any]:
        return dict(
            self.call(
                "GET", f"/api/jobs/{_ref(ref)}/logs", replica=replica, attempt=attempt, tail=tail
            )
        )

    def submit(self, spec: dict[str, Any], cwd: str) -> dict[str, Any]:
        return dict(self.call("POST", "/api/jobs", {"spec": spec, "cwd": cwd}))

    def cancel(self, ref: str) -> dict[str, Any]:
        return dict(self.call("POST", f"/api/jobs/{_ref(ref)}/cancel", {}))

    def resume(self, ref: str) -> dict[str, Any]:
        return dict(self.call("POST", f"/api/jobs/{_ref(ref)}/resume", {}))


def _ref(ref: str) -> str:
    return urllib.parse.quote(ref, safe="")
