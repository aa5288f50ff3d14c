"""The CLI's side of `--server URL`: the same questions, asked over HTTP (stdlib only)."""

from __future__ import annotations

import hmac
import http.client
import json
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from trainguard.errors import JobNotFound, ResumeError, SpecError, TrainguardError
from trainguard.service.challenge import challenge_proof


class ServerError(TrainguardError):
    """The server could not be reached, or answered with an error of its own."""


class Client:
    """`token`: given by the user, sent as is. `home_token`: the one this home's server made,
    sent only once the server at `url` proves it holds it (`challenge_proof`): any local
    user can listen on a loopback port, and the token runs commands as its owner."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        *,
        home_token: str | None = None,
    ) -> None:
        self.url = _checked_url(url)
        self.token = token if token is not None else os.environ.get("TRAINGUARD_TOKEN")
        self.timeout_s = timeout_s
        self._home_token = None if self.token else home_token
        self._withheld = False  # the home's token, not sent: the server did not prove itself

    def _prove(self) -> None:
        """Send the home's token from now on if the server proves it issued it."""
        token, self._home_token = self._home_token, None
        if token is None:
            return
        parts = urllib.parse.urlsplit(self.url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        nonce = secrets.token_hex(16)
        conn = kind(parts.hostname or "", parts.port, timeout=self.timeout_s)
        try:
            conn.request("GET", f"{parts.path}/api/challenge?nonce={nonce}")
            peer = conn.sock.getpeername() if conn.sock is not None else ("", 0)
            resp = conn.getresponse()
            answer = json.loads(resp.read() or b"{}") if resp.status == 200 else {}
        except (OSError, ValueError, http.client.HTTPException):
            answer = {}
        finally:
            conn.close()
        proof = answer.get("proof") if isinstance(answer, dict) else None
        expected = challenge_proof(token, nonce, str(peer[0]), int(peer[1])) if proof else ""
        if isinstance(proof, str) and hmac.compare_digest(proof, expected):
            self.token = token
        else:
            self._withheld = True

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        self._prove()
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
            withheld = (
                "; this home's token was not sent: the server did not prove it issued it"
                if self._withheld
                else ""
            )
            return ServerError(
                f"the server refused the request: {detail} (--token / TRAINGUARD_TOKEN){withheld}"
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


def _checked_url(url: str) -> str:
    """`--server`'s URL, or SpecError in one line (a malformed URL is the user's to fix)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a port that is no number, or out of range, raises here)
    except ValueError as exc:
        raise SpecError([f"--server: not a valid URL ({exc}): {url!r}"]) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError([f"--server: must be an http:// or https:// URL, got {url!r}"])
    return url.rstrip("/")


def _ref(ref: str) -> str:
    return urllib.parse.quote(ref, safe="")
