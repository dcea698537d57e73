"""A timer book's client, whatever carries its records (`BookClient`): the book's commands
on one key's timers (built by `app.clients.book_commands`) sent to the book's command topic
in murmur2(key)'s partition, and the answers to the commands its timers fired, sent to the
node that fired them (`app.clients.fired.reply_partition`). Its subclass sends the records
(`_send`) and names the request ids its caller does not (`_request_id`):
`app.clients.faust_client.TickwheelTimers`, over faust's producer, from the event an agent
processes. Without faust (only `app.clients.faust_client` imports it). May import
`app.clients`' book_commands, client_topics and fired, `app.model.decide` (results' messages
cut as a node cuts them), `app.protocol` and `tables`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from app.clients.book_commands import BookCommands, Rule
from app.clients.client_topics import ClientTopics
from app.clients.fired import reply_partition
from app.model.decide import CLOCK_SKEW_MS, cut_message
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode, encode, sent_unanswered
from tables import AggregateRef, CommandSpec
from tables.partitioner import partition_of

__all__ = ["BookClient", "result_code"]


class BookClient(ABC):
    """The commands to a timer book and the answers to its timers' commands, sent by the
    subclass (`_send`). `partitions`: the workers' `TICKWHEEL_PARTITIONS`; `topology`: the
    book's topics and the target's; `commands_of`: the book's commands, as this client
    builds them; `now`: epoch ms (the clock `early_by` and results use)."""

    def __init__(
        self,
        *,
        partitions: int,
        topology: ClientTopics,
        commands_of: BookCommands,
        now: Callable[[], int],
    ) -> None:
        self.partitions = partitions
        self.topology = topology
        self._now = now
        self.commands_of = commands_of
        """The book's commands, as this client builds them (`app.clients.book_commands`)."""

    @abstractmethod
    async def _send(self, topic: str, key: bytes, value: bytes, partition: int) -> None:
        """Sends one record, on the broker when this returns (a failed send raises)."""

    @abstractmethod
    def _request_id(self, op: str, timer: str, given: str | None) -> str:
        """`given`, or the request id of `op` on `timer` its caller did not name."""

    def book_ref(self, key: str) -> AggregateRef:
        return self.commands_of.book_ref(key)

    def target_ref(self, key: str) -> AggregateRef:
        return self.commands_of.target_ref(key)

    def set_command(
        self,
        key: str,
        timer: str,
        rule: Rule,
        command: CommandSpec,
        *,
        target: AggregateRef | None = None,
        request_id: str | None = None,
    ) -> CommandEnvelope:
        """The `wow.SetTimer` that `schedule` sends; `ValueError` for what the book would
        refuse (bad key, rule, target), so that nothing is sent."""
        rid = self._request_id("set", timer, request_id)
        return self.commands_of.set_command(key, timer, rule, command, rid, target)

    def cancel_command(
        self, key: str, timer: str, *, request_id: str | None = None
    ) -> CommandEnvelope:
        """The `wow.CancelTimer` that `cancel` sends."""
        return self.commands_of.cancel_command(
            key, timer, self._request_id("cancel", timer, request_id)
        )

    def key_command(
        self, action: str, key: str, timer: str, *, request_id: str | None = None
    ) -> CommandEnvelope:
        """The `wow.PauseTimer`, `wow.ResumeTimer` or `wow.TriggerTimer` (`action`: pause,
        resume, trigger) that `pause`, `resume` and `trigger` send."""
        rid = self._request_id(action, timer, request_id)
        return self.commands_of.key_command(action, key, timer, rid)

    async def schedule(
        self,
        key: str,
        timer: str,
        rule: Rule,
        command: CommandSpec,
        *,
        target: AggregateRef | None = None,
        request_id: str | None = None,
    ) -> CommandEnvelope:
        """Sets `key`'s timer `timer`: `command` goes to `target` (this app's
        `<context>.<target>/<key>` by default) by `rule`; a timer already set under that
        name is replaced. The command is on the broker when this returns (inside an agent
        too); the book decides it then. The request id is derived from the event being
        processed unless given (outside an agent, or in one fed by `app.channel()`, it
        must be).

        A failed send raises (so do `cancel`, `pause`, `resume`, `trigger`): faust acks
        the event of an agent that raised and restarts the agent, so the command is lost
        unless the agent catches the error and calls again, with backoff
        (examples/faust_app.py: `durably`); the same request id makes a command that did
        arrive a DUPLICATE. A `ValueError` is the command's own fault: nothing was sent."""
        cmd = self.set_command(key, timer, rule, command, target=target, request_id=request_id)
        await self._send_to_book(cmd)
        return cmd

    async def cancel(
        self, key: str, timer: str, *, request_id: str | None = None
    ) -> CommandEnvelope:
        """Cancels `key`'s timer `timer` (nothing to cancel is no error)."""
        cmd = self.cancel_command(key, timer, request_id=request_id)
        await self._send_to_book(cmd)
        return cmd

    async def pause(
        self, key: str, timer: str, *, request_id: str | None = None
    ) -> CommandEnvelope:
        """Pauses `key`'s timer `timer`: it keeps its rule and fires nothing until resumed.
        The book answers a paused one UNCHANGED (nothing written), a timer it does not
        keep REJECTED; one whose rule ended is paused in the table if its row is parked
        (a fired one stays as it is); its answers go to `<context>.results`, under
        the command's request id (derived from the event being processed unless given,
        as `schedule`'s; sent again, DUPLICATE)."""
        return await self._act("pause", key, timer, request_id)

    async def resume(
        self, key: str, timer: str, *, request_id: str | None = None
    ) -> CommandEnvelope:
        """Resumes `key`'s paused timer `timer`, caught up by its rule's catch-up policy (a
        running one: UNCHANGED, nothing written)."""
        return await self._act("resume", key, timer, request_id)

    async def trigger(
        self, key: str, timer: str, *, request_id: str | None = None
    ) -> CommandEnvelope:
        """Has the book send `key`'s timer `timer`'s command once now (request id
        `<its request id>>0@<digest>`, a given one scoped to the trigger of `timer`), its
        rule and next slot left as they were; the command sent again with the same request
        id fires nothing more."""
        return await self._act("trigger", key, timer, request_id)

    async def _act(
        self, action: str, key: str, timer: str, request_id: str | None
    ) -> CommandEnvelope:
        cmd = self.key_command(action, key, timer, request_id=request_id)
        await self._send_to_book(cmd)
        return cmd

    async def _send_to_book(self, cmd: CommandEnvelope) -> None:
        await self.topology.ensure()
        key = cmd.aggregate.id
        await self._send(
            self.topology.book.commands,
            key.encode(),
            encode(cmd),
            partition_of(key, self.partitions),
        )

    def early_by(self, cmd: CommandEnvelope, skew_ms: int = CLOCK_SKEW_MS) -> int:
        """How many ms before its `not_before` `cmd` arrived by this app's clock (0: due).
        An early command is answered SCHEDULE_NOT_DUE, as Tickwheel's targets do, and its
        sender sends it again; but a timer's send no sender waits for (`sent_unanswered`:
        from another context) is due when early by at most `skew_ms`, as a node decides
        it, since nothing would send it again (treat it as of its `not_before`)."""
        if cmd.not_before is None:
            return 0
        early = max(0, cmd.not_before - self._now())
        return 0 if sent_unanswered(cmd) and early <= skew_ms else early

    def result_for(
        self,
        cmd: CommandEnvelope,
        code: ResultCode = ResultCode.COMMITTED,
        message: str = "",
        version: int | None = None,
    ) -> tuple[str, int, CommandResult] | None:
        """Where the answer to `cmd` goes and what it says; None: no answer is expected
        (`app.clients.fired.reply_partition`). `code`: a `ResultCode` (or its name),
        `ValueError` otherwise; `message` cut as a node cuts one (`cut_message`)."""
        known = result_code(code)
        own = self.topology.context.results
        partition = reply_partition(cmd, own, self.partitions)
        if partition is None:
            return None
        result = CommandResult(
            request_id=cmd.request_id,
            code=known,
            aggregate=cmd.aggregate,
            # A node's reader skips a result past its record bound as unreadable: the
            # command would be sent again and parked TIMEOUT, its answer never read.
            message=cut_message(message),
            version=version,
            decided_at=self._now(),
        )
        return own, partition, result

    async def answer(
        self,
        cmd: CommandEnvelope,
        code: ResultCode = ResultCode.COMMITTED,
        message: str = "",
        version: int | None = None,
    ) -> bool:
        """Sends `cmd`'s result to the node that fired it; whether one was expected.
        COMMITTED, DUPLICATE, UNCHANGED and REJECTED settle the slot; any other code is a
        failed attempt, sent again with backoff and parked when its attempts are spent.
        `code`: a `ResultCode` or its name (anything else raises `ValueError`, nothing
        sent); `message`: at most 1,000 characters are sent, a longer one cut."""
        where = self.result_for(cmd, code, message, version)
        if where is None:
            return False
        topic, partition, result = where
        await self._send(topic, cmd.request_id.encode(), encode(result), partition)
        return True


def result_code(code: object) -> ResultCode:
    """`code` as a `ResultCode` (one, or its name); `ValueError` for anything else."""
    # A result of a code the node does not know reads as ERROR: a misspelt COMMITTED,
    # sent, would fail the slot it meant to settle, silently.
    if isinstance(code, str):  # a ResultCode is one too (StrEnum)
        try:
            return ResultCode(code)
        except ValueError:
            pass
    known = ", ".join(c.value for c in ResultCode)
    raise ValueError(f"{code!r} is not a result code: one of {known}")
