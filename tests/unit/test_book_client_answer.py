"""A timer book client's answer to a command its timers fired (`BookClient.answer`), without
faust: the result it sends is one the node that fired the command reads as meant (its
reader: `decode(CommandResult, record.value)`, app/timers/sender.py)."""

from __future__ import annotations

from typing import Any

import pytest

from app.clients.book_client import BookClient
from app.clients.book_commands import BookCommands
from app.clients.client_topics import ClientTopics
from app.clients.timer_book import timer_book
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode, decode
from tables import AggregateRef
from tables.timer import CUT_MARKER, MAX_ERROR_TEXT

P = 6
NOW = 1_700_000_000_000


class Client(BookClient):
    """Records what it sends; never touches a cluster (an answer makes no topic)."""

    def __init__(self) -> None:
        book, target = AggregateTopics("rem", "order-timers"), AggregateTopics("rem", "order")
        super().__init__(
            partitions=P,
            topology=ClientTopics(None, book, target, P),  # type: ignore[arg-type]
            commands_of=BookCommands(timer_book("rem", "order-timers"), target, lambda: NOW),
            now=lambda: NOW,
        )
        self.sent: list[tuple[str, bytes, bytes, int]] = []

    async def _send(self, topic: str, key: bytes, value: bytes, partition: int) -> None:
        self.sent.append((topic, key, value, partition))

    def _request_id(self, op: str, timer: str, given: str | None) -> str:
        raise AssertionError("an answer names no request id of its own")


def fired() -> CommandEnvelope:
    return CommandEnvelope(
        request_id="tid#0",
        type="rem.Remind",
        aggregate=AggregateRef(context="rem", aggregate="order", id="o-1"),
        issued_at=NOW,
        reply_to="rem.results",
        reply_partition=3,
    )


async def test_a_long_message_is_cut_as_a_node_cuts_one_and_the_node_reads_it() -> None:
    """Uncut, a 300k-character reason made a result past the node's record bound: skipped
    as unreadable, the command sent again after its timeout and parked TIMEOUT."""
    client = Client()
    assert await client.answer(fired(), ResultCode.REJECTED, "no: " + "x" * 300_000)
    ((topic, key, value, partition),) = client.sent
    assert (topic, key, partition) == ("rem.results", b"tid#0", 3)
    result = decode(CommandResult, value)  # as the node's reader reads it
    assert (result.code, len(result.message)) == (ResultCode.REJECTED, MAX_ERROR_TEXT)
    assert result.message.startswith("no: xxx") and result.message.endswith(CUT_MARKER)


@pytest.mark.parametrize("code", [ResultCode.DUPLICATE, "DUPLICATE"])
async def test_a_result_code_or_its_name_is_sent_as_that_code(code: Any) -> None:
    client = Client()
    assert await client.answer(fired(), code)
    (sent,) = client.sent
    assert decode(CommandResult, sent[2]).code is ResultCode.DUPLICATE


@pytest.mark.parametrize("code", ["COMMITED", "committed", "", 0, None, ResultCode])
async def test_a_code_that_is_no_result_code_is_refused_and_nothing_sent(code: Any) -> None:
    """A misspelt COMMITTED was sent, read by the node as ERROR (a newer writer's code):
    the slot the app meant to settle failed, retried and parked, with no word why."""
    client = Client()
    with pytest.raises(ValueError, match=r"is not a result code: one of COMMITTED, DUPLICATE"):
        await client.answer(fired(), code)
    assert client.sent == []
