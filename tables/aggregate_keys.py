"""The keys of the aggregate state store's RocksDB copies (`tables.aggregate_store`): a
state, a request id applied, its sweep entry, the events offset folded in."""

from __future__ import annotations

__all__ = ["APPLIED", "OFFSET", "PASSED", "REQUEST", "STATE", "id_key"]

STATE = b"a"
REQUEST = b"q"
"""`q` + the aggregate's `id_key` + the request id: its value, when it was applied (8
bytes, big-endian), then `PASSED` when only passed over."""
PASSED = b"p"
"""After a request's applied time: its events are in the log, and none was folded (an
applier raised on each). A command sent again is a duplicate; the log's event is not
taken for one already folded (see `AggregateStateStore.folded`)."""
APPLIED = b"w"
"""`w` + applied at (8 bytes, big-endian) + the request's `q` key minus its `q`: the
request ids in the order they were applied, for the sweep."""
OFFSET = b"\x00events-offset"


def id_key(aggregate_id: str) -> bytes:
    """An aggregate id in a key: its UTF-8 length (2 bytes) first, so that no id's keys
    run into those of another it is a prefix of."""
    raw = aggregate_id.encode()
    return len(raw).to_bytes(2, "big") + raw
