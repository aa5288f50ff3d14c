"""The server's settings: a validated value, from a YAML file and flags (flags win)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainguard.errors import SpecError
from trainguard.service.quota import DEFAULT_MAX_REPLICAS, Quota
from trainguard.spec.models import load_spec_file
from trainguard.spec.notify_rules import NotifyRule
from trainguard.spec.problems import validation_problems
from trainguard.spec.sizes import parse_memory
from trainguard.storage.ids import new_token


class QuotaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(default=None, gt=0)
    # A count, or the GPU ids to hand out (`0,1,2,3`): then each job gets its own ids.
    gpus: int | list[int] | None = None
    memory: str | None = None
    # Running replicas of all jobs together (each is a process).
    replicas: int = Field(default=DEFAULT_MAX_REPLICAS, ge=1, le=10**6)

    @model_validator(mode="after")
    def _check(self) -> QuotaConfig:
        if self.memory is not None:
            parse_memory(self.memory)  # ValueError names the bad size
        if isinstance(self.gpus, int) and self.gpus < 0:
            raise ValueError(f"gpus: must be >= 0, got {self.gpus}")
        return self

    def quota(self) -> Quota:
        ids = tuple(self.gpus) if isinstance(self.gpus, list) else None
        count = len(ids) if ids is not None else self.gpus if isinstance(self.gpus, int) else None
        mem = parse_memory(self.memory) if self.memory else None
        return Quota(cpus=self.cpus, gpus=count, memory_b=mem, gpu_ids=ids, replicas=self.replicas)


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=0, le=65535)
    db: str | None = None
    token: str | None = None
    # Without a token of its own the server makes one at first start (TOKEN_FILE in its
    # home, 0600) that the CLI of the same user reads: a default server is never open to
    # other local users. False (`--no-token`) serves loopback without one.
    require_token: bool = True
    # Host names (besides the address it listens on) that requests may use, e.g. a DNS
    # name in front of it; any other Host header is refused (DNS rebinding).
    allowed_hosts: list[str] = Field(default_factory=list)
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    # Rules for every job of this server, on top of each job's own.
    notifications: list[NotifyRule] = Field(default_factory=list)
    # A job whose master died is put back in the queue (as a resume) this many times.
    auto_resume: int = Field(default=3, ge=0)
    tick_s: float = Field(default=1.0, gt=0, le=60)

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ServerConfig:
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"host: listening on {self.host} needs a token (--token or "
                "TRAINGUARD_TOKEN): every request must then carry it"
            )
        return self


TOKEN_FILE = "server.token"


def home_token(home: Path, create: bool = False) -> str | None:
    """The token of the server of `home`: read from its 0600 file, made there if `create`.

    A file that other users can read is refused, as ssh refuses a readable key.
    """
    path = home / TOKEN_FILE
    if create and not path.exists():
        with contextlib.suppress(FileExistsError):  # another server made it first
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(new_token() + "\n")
    try:
        if path.stat().st_mode & 0o077:
            raise SpecError([f"{path}: readable by other users; chmod 600 it (or delete it)"])
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"{path}: cannot read the server token ({exc})"]) from None
    return token or None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_server_config(path: Path | None, overrides: dict[str, Any]) -> ServerConfig:
    """The file (if any), then the flags that were given; SpecError names each problem."""
    data: dict[str, Any] = load_spec_file(path) if path else {}
    quota = dict(data.get("quota") or {})
    for key in ("cpus", "gpus", "memory"):
        if overrides.get(key) is not None:
            quota[key] = overrides[key]
    if isinstance(quota.get("gpus"), str):
        text = quota["gpus"]
        try:
            quota["gpus"] = (
                [int(g) for g in text.split(",") if g.strip()] if "," in text else int(text)
            )
        except ValueError:
            raise SpecError([f"quota.gpus: a count or ids such as 0,1,2, got {text!r}"]) from None
    data["quota"] = quota
    for key in ("host", "port", "db", "token", "require_token"):
        if overrides.get(key) is not None:
            data[key] = overrides[key]
    data.setdefault("token", os.environ.get("TRAINGUARD_TOKEN") or None)
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_problems(exc)) from None
