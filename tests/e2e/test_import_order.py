"""What torch binds late (backends/local/import_order.py): a forked DDP rank holds its
default process group as long as a cold one does, so gloo's teardown cannot deadlock."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from conftest import TG
from warm import cold_and_warm

from trainguard.backends.local.import_order import _bind

PROBE = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
preloaded = "torch._dynamo" in sys.modules
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
ddp = DistributedDataParallel(torch.nn.Linear(4, 4))  # a cold rank imports torch._dynamo here
import torch.distributed.nn.functional as F
world = dist.group.WORLD
bound = [n for n, f in sorted(vars(F).items())
         if callable(f) and getattr(f, "__defaults__", None) and world in f.__defaults__]
print("BOUND", len(bound), F.all_reduce.__defaults__[-1] is world, "PRELOADED", preloaded)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_forked_rank_binds_the_group_defaults_a_cold_rank_binds(tg: TG, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = ("--nproc-per-node", "2", "--", sys.executable, str(script))
    cold, warm = cold_and_warm(tg, *argv, prefix="BOUND ")
    assert cold == [["BOUND 10 True PRELOADED False"]] * 2
    assert warm == [["BOUND 10 True PRELOADED True"]] * 2  # the zygote imported torch._dynamo


def test_only_group_defaults_that_read_no_group_are_bound() -> None:
    mod = types.ModuleType("fake_functional")
    exec(
        "def a(t, group=None): pass\n"
        "def b(t, op='sum', group=None, other=None): pass\n"
        "def c(t, group='mine'): pass\n"
        "def d(t): pass\n",
        mod.__dict__,
    )
    world = object()
    _bind(mod, world)
    assert mod.a.__defaults__ == (world,)
    assert mod.b.__defaults__ == ("sum", world, None)
    assert mod.c.__defaults__ == ("mine",)
    assert mod.d.__defaults__ is None
