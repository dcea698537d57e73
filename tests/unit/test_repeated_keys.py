"""JSON a person gives (an HTTP body, `--body`, the timer options) naming a key twice in
one object: refused, naming the key. A JSON reader keeps the last silently, so a body
`{"rule": …, …, "rule": …}` set the timer by the second rule, and answered 200."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import WEB_TOKEN
from test_web_fuzz import BOOK, serving

from app.protocol.json_input import load_json, repeated_keys


@pytest.mark.parametrize(
    ("text", "twice"),
    [
        ('{"a": 1, "a": 2}', ["a"]),
        ('{"a": {"b": 1, "b": 2}, "c": [{"d": 1, "d": 1}]}', ["b", "d"]),
        ('{"a": 1, "b": 2}', []),
        ("[1, 2]", []),
    ],
)
def test_repeated_keys_are_named_at_any_depth(text: str, twice: list[str]) -> None:
    assert repeated_keys(text) == twice
    if twice:
        with pytest.raises(ValueError, match="given more than once"):
            load_json(text)
    else:
        assert load_json(text) is not None


async def test_a_timer_put_naming_a_key_twice_is_a_400_and_sets_nothing(tmp_path: Path) -> None:
    body = (
        '{"rule":{"kind":"once","at":1800003600000},'
        '"target":{"type":"shop.order","id":"o-1"},'
        '"command":{"type":"RemindToPay","body":{}},'
        '"rule":{"kind":"once","at":1900000000000}}'
    )
    async with serving(tmp_path, WEB_TOKEN) as e:
        status, answer = await e.call("PUT", f"/timers/{BOOK}/own/k1", body)
        assert status == 400 and "'rule' given more than once" in str(answer)
        status, _ = await e.call("GET", f"/timers/{BOOK}/own/k1")
        assert status == 404
