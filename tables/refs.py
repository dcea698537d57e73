"""AggregateRef: which aggregate a timer belongs to or is sent to."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_TENANT", "AggregateRef"]

DEFAULT_TENANT = "(0)"

_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"


class AggregateRef(BaseModel):
    """An aggregate: `(context, aggregate, tenant, id)`, compared field by field.

    `aggregate` is the aggregate type's name inside its context (`order` in `shop`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    context: str = Field(min_length=1, max_length=100, pattern=_NAME)
    aggregate: str = Field(min_length=1, max_length=100, pattern=_NAME)
    tenant: str = Field(default=DEFAULT_TENANT, min_length=1, max_length=200)
    id: str = Field(min_length=1, max_length=500)

    @property
    def type_name(self) -> str:
        """`context.aggregate`, the name of the aggregate type and the prefix of its topics."""
        return f"{self.context}.{self.aggregate}"

    def __str__(self) -> str:
        return f"{self.context}.{self.aggregate}/{self.tenant}/{self.id}"
