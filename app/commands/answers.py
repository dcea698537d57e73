"""How the command path answers the commands of one partition: each command's result
record, on its reply address or with `own` on its context's results topic; and a command
it does not decide, answered ERROR with why and dead-lettered for an operator."""

from __future__ import annotations

from app.commands.batch import CommandBatch
from app.commands.intake import bad_reply, reply_address
from app.commands.records import Reply, dead_letter_record, result_record
from app.errors import BadRecord
from app.kafka import OutRecord, Record
from app.model.decide import cut_message
from app.protocol.dead_letters import Stage, error_message
from app.protocol.limits import InputLimits
from app.protocol.wire import CommandResult, Refusal, ResultCode

__all__ = ["CommandAnswers"]


class CommandAnswers:
    """The answers of the commands of one partition, whose context's results topic is
    `results_topic` (of `partitions` partitions), their dead letters bounded by `limits`."""

    def __init__(self, results_topic: str, partitions: int, limits: InputLimits) -> None:
        self.results_topic = results_topic
        self.partitions = partitions
        self.limits = limits

    def unreadable(self, batch: CommandBatch, record: Record, error: BadRecord) -> None:
        """A command record refused as it is read: dead-lettered, and answered ERROR with
        why where its reply address reads (`reply_address`), so that its sender (a timer)
        fails at once instead of waiting out its timeout. ERROR, not REJECTED: a newer node
        may read it (a rolling upgrade), and a REJECTED slot is done for good."""
        address = reply_address(record, self.limits)
        if address is None:
            self.dead_letter(batch, record, error, Stage.READ)
            return
        # A reply address elsewhere is answered on its context's own, as a command's is.
        own = bad_reply(address, self.results_topic, self.partitions) is not None
        self.refuse(batch, record, address, error, Stage.READ, own=own)

    def refuse(
        self,
        batch: CommandBatch,
        record: Record,
        cmd: Reply,
        error: BaseException,
        stage: Stage,
        *,
        own: bool = False,
    ) -> None:
        """`cmd` not decided: answered ERROR (with `own`, on its context's results topic)
        and dead-lettered with why."""
        text = error_message(error)  # a service's exception's text may fail when read
        message = text if isinstance(error, BadRecord) else f"{type(error).__name__}: {text}"
        batch.out.append(self.result(cmd, ResultCode.ERROR, message, None, batch.now, own=own))
        batch.stats.codes[ResultCode.ERROR] += 1
        self.dead_letter(batch, record, error, stage)

    def dead_letter(
        self, batch: CommandBatch, record: Record, error: BaseException, stage: Stage
    ) -> None:
        batch.out.append(dead_letter_record(record, error, stage, batch.now, self.limits))
        batch.stats.dead_letters += 1

    def result(
        self,
        cmd: Reply,
        code: ResultCode,
        message: str,
        version: int | None,
        now: int,
        *,
        own: bool = False,
        refusal: Refusal | None = None,
    ) -> OutRecord:
        """The command's result record: on its reply address (checked by `bad_reply`), or
        with `own` on the context's results topic, in the request id's partition."""
        result = CommandResult(
            request_id=cmd.request_id,
            code=code,
            aggregate=cmd.aggregate,
            message=cut_message(message),
            refusal=refusal,
            version=version,
            decided_at=now,
        )
        return result_record(cmd, result, self.results_topic, self.partitions, own=own)
