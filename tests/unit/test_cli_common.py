"""A command run inside another program leaves its logging as it found it: the client
library is quiet during the command only (a test suite caught a command that muted aiokafka
for every test after it). An instant past what a date holds is printed in words."""

from __future__ import annotations

import logging

import pytest
import typer

from app.cli.common import quiet_client_library, run, time_iso
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


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000+00:00"),
        (253_402_300_799_999, "9999-12-31T23:59:59.999+00:00"),
        # A timer due at the last instant plus a day's jitter, and a forged letter's time:
        # a listing had ended at them with "year 10000 is out of range".
        (253_402_348_734_150, "after 9999-12-31"),
        (2**62, "after 9999-12-31"),
        (-(2**62), f"before 0001-01-01 ({-(2**62)} ms)"),
    ],
)
def test_an_instant_past_what_a_date_holds_is_said_in_words(ms: int, text: str) -> None:
    assert time_iso(ms) == text
