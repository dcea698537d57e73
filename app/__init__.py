"""Tickwheel's public API: what a service, a client or a faust app imports, from here only.

    from app import AggregateType, Command, Decision, Event, Service
    from app import CommandSpec, IntervalRule, OnceRule

Every name in `__all__` is kept from one release to the next, or its removal or change is
named in CHANGELOG.md, with the version that makes it. The modules under `app` (and the
`tables` package) are the implementation: they may be regrouped in any release, as 0.2.0
did, so import nothing from them directly.

What is here:

- declaring a service: `AggregateType`, `Command`, `Decision`, `Event`, `Rejected`,
  `Service`; the jobs (`Job`, `JobRun`, `JobScope`); the timers' rules and commands
  (`OnceRule`, `IntervalRule`, `CronRule`, `ScheduleRule`, `parse_rule`, `CommandSpec`)
  and addresses (`AggregateRef`);
- what user code may meet: `TickwheelError` (the root of `app`'s own errors),
  `DecisionTooLarge` (a decision past 10,000 events and commands) and `UserCodeTimeout`
  (user code interrupted past `TICKWHEEL_HANDLER_TIMEOUT_MS`);
- the wire (docs/schemas): `CommandEnvelope`, `EventEnvelope`, `CommandResult`,
  `ResultCode`, `Refusal`, `encode`, `decode`, the system events' types (`SCHEDULE_SET`,
  `SCHEDULE_CANCELLED`, `AGGREGATE_DELETED`), topic names (`AggregateTopics`) and the
  partition of a key (`partition_of`, Kafka's murmur2); the job commands
  (`enable_command`, `disable_command`, `reschedule_command`), the jobs' aggregate type
  (`SCHEDULE`: `<context>.schedule`) and tick event (`TICKED`: `wow.Ticked`); a timer as
  the table keeps it (`Timer`, `TimerStatus`, `Outcome`); a dead letter read back
  (`DeadLetter`);
- clients without an aggregate of their own: the timer book (`timer_book`, its commands
  `SET_TIMER` and `CANCEL_TIMER`, its state `BookState`, the request id a command sent for
  a consumed record gets, `request_id_for`) and, with the `faust` extra
  (`pip install '.[faust]'` from a clone), the faust-streaming client (`TickwheelTimers`);
- talking to a cluster: how to reach it (`KafkaConnection`: address, TLS, SASL; any of
  these takes a plain bootstrap string too, `Connectable`), `Producer`, `tail` and
  `read_partitions` (which yield `Record`s, one or a list at a time), `ensure_topics`
  and the topics a node needs (`node_topics`: `TopicSpec`s) with their replication
  (`Replication`); or its clients made once (`KafkaClients`, over a connection) and
  handed to what takes the ports' factory, `Clients` (as the demo does).

The faust client, the cluster helpers and `DeadLetter` are loaded on first use (PEP 562):
importing `app` imports neither faust nor aiokafka, and without faust installed everything
else works, `from app import *` included: `TickwheelTimers` is then left out of `__all__`,
`hasattr(app, "TickwheelTimers")` is False, `from app import TickwheelTimers` an ImportError
and `app.TickwheelTimers` an AttributeError saying how to install the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Final

from app.clients.book_commands import request_id_for
from app.clients.book_state import BookState
from app.clients.timer_book import CANCEL_TIMER, SET_TIMER, timer_book
from app.errors import TickwheelError
from app.jobs import (
    SCHEDULE,
    TICKED,
    Job,
    JobRun,
    JobScope,
    disable_command,
    enable_command,
    reschedule_command,
)
from app.model.aggregate import (
    AggregateType,
    Command,
    Decision,
    DecisionTooLarge,
    Event,
    Rejected,
)
from app.model.user_code import UserCodeTimeout
from app.protocol.topics import AggregateTopics
from app.protocol.wire import (
    AGGREGATE_DELETED,
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    Refusal,
    ResultCode,
    decode,
    encode,
)
from app.service import Service
from tables import (
    AggregateRef,
    CommandSpec,
    CronRule,
    IntervalRule,
    OnceRule,
    Outcome,
    ScheduleRule,
    Timer,
    TimerStatus,
    parse_rule,
)
from tables.partitioner import partition_of

if TYPE_CHECKING:
    from app.clients.faust_client import TickwheelTimers
    from app.kafka import Clients, KafkaClients, Producer, ensure_topics, read_partitions, tail
    from app.kafka.connection import Connectable, KafkaConnection
    from app.kafka.records import Record, Replication, TopicSpec
    from app.node import node_topics
    from app.protocol.dead_letters import DeadLetter

__all__ = [
    "AGGREGATE_DELETED",
    "CANCEL_TIMER",
    "SCHEDULE",
    "SCHEDULE_CANCELLED",
    "SCHEDULE_SET",
    "SET_TIMER",
    "TICKED",
    "AggregateRef",
    "AggregateTopics",
    "AggregateType",
    "BookState",
    "Clients",
    "Command",
    "CommandEnvelope",
    "CommandResult",
    "CommandSpec",
    "Connectable",
    "CronRule",
    "DeadLetter",
    "Decision",
    "DecisionTooLarge",
    "Event",
    "EventEnvelope",
    "IntervalRule",
    "Job",
    "JobRun",
    "JobScope",
    "KafkaClients",
    "KafkaConnection",
    "OnceRule",
    "Outcome",
    "Producer",
    "Record",
    "Refusal",
    "Rejected",
    "Replication",
    "ResultCode",
    "ScheduleRule",
    "Service",
    "TickwheelError",
    "Timer",
    "TimerStatus",
    "TopicSpec",
    "UserCodeTimeout",
    "__version__",
    "decode",
    "disable_command",
    "enable_command",
    "encode",
    "ensure_topics",
    "node_topics",
    "parse_rule",
    "partition_of",
    "read_partitions",
    "request_id_for",
    "reschedule_command",
    "tail",
    "timer_book",
]

_FAUST_ONLY: Final = frozenset({"TickwheelTimers"})
"""The names of the `faust` extra: in `__all__` only where faust is installed, so that
`from app import *` works without it."""


def _faust_installed() -> bool:
    """Whether faust can be imported, looked for without importing it."""
    if "faust" in sys.modules:  # imported (faust's module has no __spec__), or blocked: None
        return sys.modules["faust"] is not None
    try:
        return importlib.util.find_spec("faust") is not None
    except (ImportError, ValueError):
        return False


if _faust_installed():
    __all__ += ["TickwheelTimers"]

_LAZY: Final[dict[str, str]] = {
    # The faust extra: only this module imports faust.
    "TickwheelTimers": "app.clients.faust_client",
    # The aiokafka edge and the node: loaded by who talks to a cluster, not by a service
    # module that only declares its aggregates.
    "Producer": "app.kafka",
    "Clients": "app.kafka",
    "KafkaClients": "app.kafka",
    "KafkaConnection": "app.kafka.connection",
    "Connectable": "app.kafka.connection",
    "ensure_topics": "app.kafka",
    "read_partitions": "app.kafka",
    "tail": "app.kafka",
    "node_topics": "app.node",
    "Record": "app.kafka.records",
    "Replication": "app.kafka.records",
    "TopicSpec": "app.kafka.records",
    # Read by who inspects a dead-letter topic, not by a service.
    "DeadLetter": "app.protocol.dead_letters",
}
"""The names of `__all__` loaded on first use, and the module each comes from."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        if name not in _FAUST_ONLY:
            raise
        # An AttributeError, as for any name the module lacks: `hasattr` is False and
        # `from app import *` passes it over, rather than failing on the extra.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: {exc}") from exc
    value = getattr(loaded, name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) - (_FAUST_ONLY - set(__all__)))


def _version() -> str:
    """The installed distribution's version; in a source tree that is not installed, its
    pyproject.toml's."""
    try:
        return metadata.version("tickwheel")
    except metadata.PackageNotFoundError:
        pass
    try:
        with (Path(__file__).resolve().parents[1] / "pyproject.toml").open("rb") as f:
            project = tomllib.load(f)["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"
    if project.get("name") != "tickwheel":
        return "0+unknown"
    return str(project["version"])


__version__: Final[str] = _version()
"""Tickwheel's version (PEP 440), as its package metadata has it."""
