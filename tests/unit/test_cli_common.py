"""A command run inside another program leaves its logging as it found it: the client
library is quiet during the command only (a test suite caught a command that muted aiokafka
for every test after it)."""

from __future__ import annotations

import logging

import pytest
import typer

from app.cli.common import quiet_client_library, run
from app.errors import KafkaUnavailable


def test_the_client_library_is_quiet_during_a_command_only() -> None:
    client_log = logging.getLogger("aiokafka")
    before = client_log.level

    async def fails() -> None:
        assert client_log.level == logging.CRITICAL
        raise KafkaUnavailable("no broker")

    with pytest.raises(typer.Exit):
        run(fails())
    assert client_log.level == before
    with quiet_client_library():
        assert client_log.level == logging.CRITICAL
    assert client_log.level == before
