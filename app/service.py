"""A service: the aggregate types a node runs and the jobs of their contexts (each context
with jobs gets its `<context>.schedule` aggregate).

May import: `app.model`, `app.jobs`, `app.protocol.topics` (its types' names checked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.jobs import (
    DEFAULT_EXPIRES_AFTER_MS,
    DEFAULT_REQUEST_ID_WINDOW_MS,
    Job,
    SentCheck,
    schedule_aggregate,
)
from app.model.aggregate import AggregateType
from app.protocol.topics import aggregate_topics

__all__ = ["Service"]


@dataclass(frozen=True)
class Service:
    """What a node runs: aggregate types (and, with jobs, the contexts' schedules).

    `jobs` maps a context to the jobs declared in it; each such context gets its
    `<context>.schedule` aggregate from `all_aggregates`. A type or context whose name no
    topic can have (`app.protocol.topics.aggregate_topics`) is a `ConfigError`; a type
    declared twice, or two jobs of one name in a context, a `ValueError`.
    """

    aggregates: tuple[AggregateType[Any], ...]
    jobs: Mapping[str, Sequence[Job]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Checked where the service is declared (`ConfigError`), not when a worker starts.
        self._shapes()
        for a in self.aggregates:
            aggregate_topics(a.context, a.name)
        for context, jobs in self.jobs.items():
            aggregate_topics(context, "schedule")
            # Refused here, not by the worker's `schedule_aggregate`: the service would
            # import fine and every worker fail to start.
            declared = [job.name for job in jobs]
            twice = sorted({name for name in declared if declared.count(name) > 1})
            if twice:
                raise ValueError(f"jobs declared twice in {context}: {twice}")
        names = [a.type_name for a in self.aggregates]
        if len(set(names)) != len(names):
            raise ValueError(f"aggregate types declared twice: {names}")
        clash = sorted(f"{c}.schedule" for c in self.jobs if f"{c}.schedule" in names)
        if clash:
            raise ValueError(f"{clash} are kept by the jobs of their context: declare no such type")

    def _shapes(self) -> None:
        """`TypeError` naming the field for a declaration no worker could run (a single
        type for `aggregates`, a job that is none); a list of types is taken as a tuple
        (every worker failed at its start on one: `all_aggregates` adds a tuple to it)."""
        given: object = self.aggregates
        if isinstance(given, AggregateType | str | bytes | Mapping) or not isinstance(
            given, Sequence
        ):
            raise TypeError(f"aggregates: a tuple of AggregateType, not {given!r}")
        object.__setattr__(self, "aggregates", tuple(given))
        for a in self.aggregates:
            if not isinstance(a, AggregateType):
                raise TypeError(f"aggregates: {a!r} is not an AggregateType")
        if not isinstance(self.jobs, Mapping):
            raise TypeError(f"jobs: a mapping of context to its jobs, not {self.jobs!r}")
        for context, jobs in self.jobs.items():
            if not isinstance(jobs, Sequence):  # a context's name: `aggregate_topics`
                raise TypeError(f"jobs: {context!r}: a context's name to a list of Job")
            for job in jobs:
                if not isinstance(job, Job):
                    raise TypeError(f"jobs[{context!r}]: {job!r} is not a Job")

    def all_aggregates(
        self,
        partitions: int,
        *,
        request_id_window_ms: int = DEFAULT_REQUEST_ID_WINDOW_MS,
        expires_after_ms: int = DEFAULT_EXPIRES_AFTER_MS,
        sent_check: SentCheck | None = None,
    ) -> tuple[AggregateType[Any], ...]:
        """The declared aggregate types and one schedule per context with jobs (on a node
        keeping applied request ids for `request_id_window_ms`, whose timers expire a slot
        due longer ago than `expires_after_ms`, and whose processor refuses the commands
        `sent_check` names: a job's slot sending one fails alone, `schedule_aggregate`)."""
        schedules = tuple(
            schedule_aggregate(
                context,
                jobs,
                partitions,
                request_id_window_ms=request_id_window_ms,
                expires_after_ms=expires_after_ms,
                sent_check=sent_check,
            )
            for context, jobs in sorted(self.jobs.items())
            if jobs
        )
        return self.aggregates + schedules

    def find(self, type_name: str) -> AggregateType[Any] | None:
        for a in self.aggregates:
            if a.type_name == type_name:
                return a
        return None
