"""Whether the commands a decision sends can be written, asked before they join it: a job's
slot (`app.jobs`, which may not import the command path) is given this check by the node,
so that a handler's command the processor would refuse fails that slot alone, not its tick."""

from __future__ import annotations

from collections.abc import Sequence

from app.commands.records import check_sizes, command_record
from app.errors import RecordTooLarge
from app.kafka.catalog import TopicCatalog
from app.protocol.limits import InputLimits
from app.protocol.wire import CommandEnvelope

__all__ = ["sent_too_large"]


def sent_too_large(
    commands: Sequence[CommandEnvelope],
    limits: InputLimits,
    catalog: TopicCatalog | None = None,
) -> RecordTooLarge | None:
    """Why one of `commands` is a record the processor would refuse to write (`check_sizes`,
    under the node's `limits`: its `max_record_bytes` and what its own topics take; and
    what `catalog` last read of the topics written, as the processor's check), or
    None. The same check, called here alone: a job's slot passed by it is not then refused
    whole by the processor."""
    try:
        check_sizes([command_record(c) for c in commands], limits, catalog)
    except RecordTooLarge as exc:
        return exc
    return None
