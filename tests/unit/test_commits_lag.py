"""A commit that hangs shows as commit lag (readiness), and none in flight is no lag."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any, cast

from app.node.commits import Commits
from app.node.kept import KeptType


class HangingTransaction:
    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def send(self) -> list[int]:
        await self.release.wait()
        return []


class Changelog:
    def __init__(self, taken: HangingTransaction) -> None:
        self.taken: HangingTransaction | None = taken

    def take(self, p: int) -> HangingTransaction | None:
        taken, self.taken = self.taken, None
        return taken


class Kept:
    name = "shop.order"

    def __init__(self, changelog: Changelog) -> None:
        self.changelog = changelog


async def test_a_hanging_commit_is_lag_until_it_ends() -> None:
    failures: list[Any] = []
    commits = Commits(10, defaultdict(asyncio.Lock), lambda p: True, lambda *a: failures.append(a))
    assert commits.lag() == 0.0
    hanging = HangingTransaction()
    kept = cast(KeptType, Kept(Changelog(hanging)))
    task = commits.start(kept, 0)
    assert task is not None
    await asyncio.sleep(0.05)
    assert commits.lag() >= 0.04
    hanging.release.set()
    assert await task
    await asyncio.sleep(0)
    assert commits.lag() == 0.0 and failures == []
