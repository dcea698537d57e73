"""JSON a person gives (an HTTP body, a command line's), read as `wire.decode` reads
records, its keys given twice refused (`load_json`); and the keys a JSON text gives more
than once (`repeated_keys`), which the timer options' setting is checked for too."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

__all__ = ["load_json", "repeated_keys"]


def load_json(data: bytes | str) -> Any:
    """JSON given by a person (an HTTP body, a command line's), read by the parser `decode`
    reads records with: orjson reads an integer past 64 bits as a float, silently rounded,
    where the same number in a record is refused (`check_json`); this keeps it whole for
    the same check. `ValueError` with the parser's reason for text that is not JSON (NaN
    and Infinity included), or naming a key an object gives twice (a JSON reader keeps the
    last silently: a person's mistake, or a body made to slip one value past a check)."""
    read = from_json(data, allow_inf_nan=False)
    if twice := repeated_keys(data):
        named = ", ".join(map(repr, twice[:5]))
        raise ValueError(f"{named} given more than once (the last would silently win)")
    return read


def repeated_keys(data: bytes | str) -> list[str]:
    """The keys an object of the JSON text `data` gives more than once, at any depth, in
    the order met (none for text the standard library does not read as JSON)."""
    twice: dict[str, None] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                twice[key] = None
            seen.add(key)
        return dict(items)

    try:
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return []
    return list(twice)
