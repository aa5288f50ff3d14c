"""The exceptions trainguard raises on purpose.

TrainguardError            anything the CLI turns into one clear line, never a traceback
├── SpecError              a job spec or flag is invalid (one problem per line; exit 2)
├── JobNotFound            a job id or name matches no job (or several)
├── ResumeError            the job cannot be resumed (it finished, or still runs)
├── StoreError             the state database cannot be opened or written
└── CallRefused            a replica's well-formed SDK call asks for what cannot be (422)
"""

from __future__ import annotations


class TrainguardError(Exception):
    """Base of every error meant for the user; `exit_code` is what the CLI returns."""

    exit_code = 1


class SpecError(TrainguardError):
    """Invalid spec or flags; carries every problem found, each naming a field and value."""

    exit_code = 2

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class JobNotFound(TrainguardError):
    exit_code = 2


class ResumeError(TrainguardError):
    exit_code = 2


class StoreError(TrainguardError):
    """The store refused a read or a write. `transient`: locked, full, unreachable for now
    (an OperationalError), so the same write may succeed later."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class CallRefused(TrainguardError):
    """A replica's SDK call names what does not exist (a checkpoint that was never
    committed): the replica is told why, the master carries on."""
