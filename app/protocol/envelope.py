"""The base of every envelope on Tickwheel's topics (`Envelope`): frozen, unknown fields
kept and written back, and held to the bounds of a body. May import `tables` only."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

from tables.bounds import check_json, check_stored, stored_bodies

__all__ = ["Envelope"]


class Envelope(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _extras_within_bounds(self, info: ValidationInfo) -> Self:
        # Unknown fields are kept and written back: they too must be JSON any encoder writes,
        # within a body's bounds as new input (`tables.bounds`), read back as stored within
        # `check_stored`'s. (The slot itself, not the `model_extra` property: this runs for
        # every record.)
        if extra := self.__pydantic_extra__:
            if stored_bodies(info):
                check_stored(extra, "record")
            else:
                check_json(extra, "record")
        return self
