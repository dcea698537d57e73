"""The one exception tree of `app` (storage errors are `tables.TablesError`'s):

TickwheelError
├── BadRecord          a record that cannot be read: dead-lettered
├── RecordTooLarge     a record a decision would write is too large: its command ERROR
├── ConfigError        a bad setting
├── KafkaUnavailable   the broker did not answer or refused
│   └── Fenced         another node took the partition over
├── MissingTopic       a read-only command's topic is not there
├── GroupBusy          a rebuild while workers run
├── RebuildIncomplete  a rebuild stopped half-way: run it again
├── NodeFailed         the node cannot go on
├── NoTimers           an operator's command found no timer
├── JobsCliError       a job, context or rule the CLI cannot use
└── BadInput           a query or form the operator page cannot act on
"""

from __future__ import annotations

from tables.exceptions import StoreError

__all__ = [
    "BadInput",
    "BadRecord",
    "ConfigError",
    "Fenced",
    "GroupBusy",
    "JobsCliError",
    "KafkaUnavailable",
    "MissingTopic",
    "NoTimers",
    "NodeFailed",
    "RebuildIncomplete",
    "RecordTooLarge",
    "TickwheelError",
    "node_fault",
]


class TickwheelError(Exception):
    """Root of every error raised by `app`."""


class BadRecord(TickwheelError, ValueError):
    """A record on a topic that cannot be read: it is dead-lettered and skipped."""


class RecordTooLarge(TickwheelError, ValueError):
    """A record a command's decision would write (an event, a command it sends, the stored
    aggregate) is larger than `TICKWHEEL_MAX_RECORD_BYTES`: nothing of the decision is
    written, the command is answered ERROR and dead-lettered. Written, it could fail the
    partition's transaction (Kafka's own limit) at every retake of the partition."""


class ConfigError(TickwheelError, ValueError):
    """A setting with a bad value; the message names the setting."""


class KafkaUnavailable(TickwheelError):
    """The broker did not answer, or refused a request; the message says which."""


class Fenced(KafkaUnavailable):
    """Another node took this partition's transactional id over: this one must let go."""


class MissingTopic(TickwheelError):
    """A topic a read-only command (or a rebuild) needs is not there; nothing was created."""


class NoTarget(TickwheelError):
    """A command's target cannot be sent to: its command topic does not exist, or refused
    this node's writes a moment ago (an ACL). Raised by `Decision.send`, the command's
    failure (answered ERROR, dead-lettered), never the node's."""


class GroupBusy(TickwheelError):
    """Workers of the group are running: a rebuild under them would race their writes."""


class RebuildIncomplete(TickwheelError):
    """A rebuild failed between types or steps; the message says what it left and that
    running it again finishes it."""


class NodeFailed(TickwheelError):
    """The node cannot go on (a partition it was given could not be taken): it stops."""


class NoTimers(TickwheelError):
    """The owner (or its key) has no timer in the changelog."""


class JobsCliError(TickwheelError):
    """A job, context or rule the command cannot use."""


class BadInput(TickwheelError):
    """A query or form the page cannot act on: a 400 page that says why."""


def node_fault(exc: BaseException) -> bool:
    """Whether `exc` is the node's own fault (the broker gone or refusing, fenced, the store
    failing, the node failed), not a record's: only such a fault retakes a partition. Every
    other exception met while reading, deciding, following, applying or restoring one
    record is that record's: it is dead-lettered and the partition goes on."""
    return isinstance(exc, KafkaUnavailable | NodeFailed | StoreError | MemoryError)
