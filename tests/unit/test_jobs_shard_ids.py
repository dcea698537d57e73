"""A SHARDED job's instance ids: the same ids as ever (they are persisted, the aggregate
ids of its instances), each found once per process however many jobs and partitions."""

from __future__ import annotations

import pytest

from app.jobs import Job, JobRun, JobScope, declaration, instance_ids, is_instance_id, shard_ref
from tables import IntervalRule
from tables.partitioner import partition_of

CONTEXT = "ops"


def handler(run: JobRun) -> None:
    pass


def sharded(name: str) -> Job:
    return Job(name, JobScope.SHARDED, IntervalRule(start=0, every=60_000), handler)


def reference_shard_id(job: str, partition: int, partitions: int) -> str:
    """The algorithm the ids were first made by (declaration.py before its ids were kept),
    copied here as it was: the first `<job>~<partition>~<n>` in its partition."""
    n = 0
    while partition_of(f"{job}~{partition}~{n}", partitions) != partition:
        n += 1
    return f"{job}~{partition}~{n}"


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 16, 31, 64, 100, 128])
@pytest.mark.parametrize("name", ["sweep", "a-longer_job-name-0123456789"])
def test_shard_ids_are_those_of_the_first_algorithm(name: str, partitions: int) -> None:
    want = {p: reference_shard_id(name, p, partitions) for p in range(partitions)}
    assert instance_ids(CONTEXT, sharded(name), partitions) == set(want.values())
    for p, id_ in want.items():
        assert shard_ref(CONTEXT, name, p, partitions).id == id_
        assert is_instance_id(sharded(name), id_, partitions)


def test_5_jobs_on_1024_partitions_find_each_id_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """5 SHARDED jobs on 1,024 partitions: a listing of their ids found each of them again
    (a 4,096-entry cache of single ids, scanned in order by 5,120 of them, kept none), and so
    did each tick's check of its instance (~1M hash calls a job, ~30 s a listing). The real
    hash is swapped for one that puts `<job>~<p>~2` first in partition p (so 3 calls find
    an id) and counted: every id must cost its 3 calls once, however often it is asked."""
    partitions, jobs = 1_024, [sharded(f"shard-count-{i}") for i in range(5)]
    calls = 0

    def fake_partition_of(key: str, n: int) -> int:
        nonlocal calls
        calls += 1
        _, p, tries = key.split("~")
        return int(p) if tries == "2" else (int(p) + 1) % n

    monkeypatch.setattr(declaration, "partition_of", fake_partition_of)
    # Fresh kept ids: these fake ones must not outlive the test.
    monkeypatch.setattr(declaration, "_shard_maps", {}, raising=False)
    listed = {job.name: instance_ids(CONTEXT, job, partitions) for job in jobs}
    assert listed["shard-count-0"] == {f"shard-count-0~{p}~2" for p in range(partitions)}
    once = len(jobs) * partitions * 3
    assert calls == once
    for job in jobs:  # the listing again (GET /jobs, the operator page), and each tick's check
        assert instance_ids(CONTEXT, job, partitions) == listed[job.name]
        assert all(is_instance_id(job, id_, partitions) for id_ in listed[job.name])
        assert not is_instance_id(job, f"{job.name}~7~3", partitions)
    assert calls == once, "an id was found again"
