"""`generic`: no framework environment beyond rank and world size."""

from __future__ import annotations

from trainguard.frameworks.base import Preset


class Generic(Preset):
    name = "generic"
