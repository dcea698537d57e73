"""The base of every envelope on Tickwheel's topics (`Envelope`): frozen, unknown fields
kept and written back, and held to the bounds of a body. May import `tables` only."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic.config import JsonDict

from tables.bounds import JSON_BOUNDS, check_json, check_stored, stored_bodies

__all__ = ["Envelope"]


def _unknown_fields_bounded(schema: JsonDict) -> None:
    # `true` said as the schema that takes anything, with the bounds JSON Schema cannot say.
    if schema.get("additionalProperties") is True:
        schema["additionalProperties"] = {
            "description": "an unknown field, kept and written back; the readers refuse a "
            f"new record whose unknown fields hold {JSON_BOUNDS} (this object the first level)"
        }


class Envelope(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, json_schema_extra=_unknown_fields_bounded)

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
