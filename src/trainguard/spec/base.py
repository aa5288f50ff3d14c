"""The base of every spec model: unknown fields are errors, values are frozen, and NaN or
infinity is never a meaningful interval, size or rate."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
