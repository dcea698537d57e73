"""The service the jobs integration tests run in worker processes.

Three jobs of the test's context (`TW_TEST_CONTEXT`), all on one default rule, every
`TW_JOB_EVERY_MS` milliseconds (1000 by default; a test restarts the workers with another
value to change the default). Each run of a slot sends `Ran` to a `runs` aggregate of its
own instance, in the transaction of the slot's `wow.Ticked`: the `runs` log then holds one
`Ran` per slot that ran, recording which instance, tenant, partition and worker ran it.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from app.jobs import Job, JobRun, JobScope
from app.model.aggregate import (
    AggregateType,
    Command,
    Decision,
    Event,
)
from app.service import Service
from tables import AggregateRef, IntervalRule

CONTEXT = os.environ.get("TW_TEST_CONTEXT", "jtest")
EVERY_MS = int(os.environ.get("TW_JOB_EVERY_MS", "1000"))
WORKER = os.environ.get("TW_WORKER", "")
RUNS = "runs"


class Runs(BaseModel):
    n: int = 0


runs = AggregateType(CONTEXT, RUNS, Runs)


@runs.command("Ran")
def _ran(state: Runs, cmd: Command, d: Decision) -> None:
    d.emit("Ran", {**cmd.body, "n": state.n + 1})


@runs.applies("Ran")
def _counted(state: Runs, e: Event) -> Runs:
    return state.model_copy(update={"n": e.body["n"]})


def runs_ref(tenant: str, instance: str) -> AggregateRef:
    """The `runs` aggregate of one job instance (the tenant is part of its id)."""
    return AggregateRef(context=CONTEXT, aggregate=RUNS, id=f"{instance}@{tenant}")


def record(run: JobRun) -> None:
    run.send(
        runs_ref(run.tenant, run.instance),
        "Ran",
        {
            "job": run.job,
            "instance": run.instance,
            "tenant": run.tenant,
            "partition": run.partition,
            "slot": run.slot,
            "due_at": run.due_at,
            "tick": run.request_id,
            "worker": WORKER,
            "pid": os.getpid(),
        },
    )


RULE = IntervalRule(start=0, every=EVERY_MS)

heartbeat = Job("heartbeat", JobScope.SYSTEM, RULE, record)
per_tenant = Job("per-tenant", JobScope.TENANT, RULE, record)
sweep = Job("sweep", JobScope.SHARDED, RULE, record)

service = Service(aggregates=(runs,), jobs={CONTEXT: (heartbeat, per_tenant, sweep)})
