"""What a cold replica's import order binds in torch that a fork from the zygote would not.

`torch.distributed.nn.functional` binds `group=group.WORLD` as the default of ten of its
functions when it is imported. A cold DDP rank imports it inside DDP's constructor (through
`torch._dynamo`), after `init_process_group`, so those defaults hold the default process
group for the rest of the process. The zygote imports it before any group exists, so there
they are None, and the DDP reducer holds the group's last reference. When the reducer is
freed, its pybind11 dealloc runs ProcessGroupGloo's destructor with the GIL held; the
destructor joins gloo's worker threads, and a worker freeing the last allreduce (whose
thread-local state holds a Python object, the context autograd stashes there) waits for
the GIL: a deadlock (pytorch/pytorch#56297). Measured with 8 forked gloo ranks of the
example on 2 cores, `torch._dynamo` preloaded: 8 of 12 runs hung at exit; with the defaults
bound as below, 0 of 8. A cold script that imports `torch._dynamo` or FSDP before
`init_process_group` hangs the same way under torchrun (1 of 4 runs with 8 ranks).

So in a forked replica whose zygote imported that module, the first `init_process_group`
binds those defaults to the new default group, as the cold import order would have.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

_LATE = "torch.distributed.nn.functional"
_C10D = "torch.distributed.distributed_c10d"


def bind_group_defaults_late() -> None:
    """In a forked replica, before its program runs: make the first `init_process_group`
    bind the defaults a cold import after it would have (nothing when the zygote did not
    import `torch.distributed.nn.functional`)."""
    c10d, dist = sys.modules.get(_C10D), sys.modules.get("torch.distributed")
    if c10d is None or dist is None or _LATE not in sys.modules:
        return
    original: Callable[..., Any] = c10d.init_process_group
    bound = False

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        nonlocal bound
        out = original(*args, **kwargs)
        if not bound:
            bound = True
            _bind(sys.modules[_LATE], c10d.GroupMember.WORLD)
        return out

    setattr(c10d, "init_process_group", init_process_group)  # noqa: B010 - a module
    if getattr(dist, "init_process_group", None) is original:
        setattr(dist, "init_process_group", init_process_group)  # noqa: B010


def _bind(module: Any, world: object) -> None:
    """Set each function's `group` default that is None (what `group.WORLD` read before any
    group existed) to `world`."""
    for fn in vars(module).values():
        if not inspect.isfunction(fn) or fn.__module__ != module.__name__ or not fn.__defaults__:
            continue
        code = fn.__code__
        names = code.co_varnames[: code.co_argcount][-len(fn.__defaults__) :]
        fn.__defaults__ = tuple(
            world if name == "group" and value is None else value
            for name, value in zip(names, fn.__defaults__, strict=True)
        )
