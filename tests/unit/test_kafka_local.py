"""The local broker script's pure parts."""

from __future__ import annotations

import kafka_broker  # registered by tests/conftest.py


def test_cluster_ids_never_look_like_an_option() -> None:
    script = kafka_broker.load_kafka_local()
    ids = [script._cluster_id() for _ in range(5_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 22 for i in ids)
