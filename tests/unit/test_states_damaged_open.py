"""An aggregate-states copy RocksDB cannot open for what its files hold (a damaged or
missing CURRENT or MANIFEST: "Corruption: ...", "IO error: ... No such file or
directory") is marked bad, as the timer store drops such a copy: its partition's next
restore drops it and folds the log whole. Before, it was never dropped: every restore of
the partition failed at its first read, on every take and every start, and the node
stopped. A LOCK held (another worker, or this process) is no damage: that copy stays."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rocksdict import Options, Rdict
from test_states_drop_race import ORDERS, SP, log_of, states_on

from app.commands.records import state_key
from tables import StoreError
from tables.aggregate_store import RocksAggregateStore


def _written(directory: Path) -> None:
    store = RocksAggregateStore(directory)
    store.write(SP, {"a": b"{}"}, [("a", "r1")], 5, 1)
    store.close()


def _damage(db: Path, how: str) -> None:
    if how == "missing manifest":
        (db / "CURRENT").write_text("MANIFEST-999999\n")
    elif how == "garbled current":
        (db / "CURRENT").write_bytes(b"\x00\x01junk")
    else:
        (manifest,) = db.glob("MANIFEST-*")
        manifest.write_bytes(bytes(b ^ 0x5A for b in manifest.read_bytes()))


DAMAGE = ["missing manifest", "garbled current", "garbled manifest"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_copy_that_cannot_open_is_marked_bad_and_dropped(tmp_path: Path, how: str) -> None:
    _written(tmp_path / "states")
    _damage(tmp_path / "states" / f"p{SP}.db", how)
    store = RocksAggregateStore(tmp_path / "states")
    try:
        with pytest.raises(StoreError) as raised:
            store.offset(SP)
        assert raised.value.partition == SP
        assert store.is_bad(SP)
        assert store.get(SP, "a") is None and store.offset(SP) is None  # read as empty
        with pytest.raises(StoreError):
            store.write(SP, {"b": b"{}"}, [], 9)
        store.drop(SP)
        assert not store.is_bad(SP) and store.offset(SP) is None
        store.write(SP, {"b": b"{}"}, [], 9)
        assert store.offset(SP) == 9
    finally:
        store.close()


@pytest.mark.parametrize("how", DAMAGE)
async def test_the_next_restore_folds_a_copy_that_cannot_open_whole(
    tmp_path: Path, how: str
) -> None:
    """The take that meets it fails (its restore's first read); the next one's restore
    drops it before anything opens it, and folds the log whole."""
    store = RocksAggregateStore(tmp_path / "states")
    try:
        assert await states_on(store).restore(log_of(ORDERS)) == 3
        store.release(SP)
        _damage(tmp_path / "states" / f"p{SP}.db", how)
        with pytest.raises(StoreError):
            await states_on(store).restore(log_of(ORDERS))
        retake = states_on(store)
        assert await retake.restore(log_of(ORDERS)) == 3
        assert store.offset(SP) == 2 and not store.is_bad(SP)
        assert all(retake.stored(state_key(ref)) is not None for ref in ORDERS)
    finally:
        store.close()


def test_a_copy_locked_by_this_process_is_no_damage(tmp_path: Path) -> None:
    _written(tmp_path / "states")
    holder = Rdict(str(tmp_path / "states" / f"p{SP}.db"), Options(raw_mode=True))
    store = RocksAggregateStore(tmp_path / "states")
    try:
        with pytest.raises(StoreError, match="lock hold by current process"):
            store.offset(SP)
        assert not store.is_bad(SP)
    finally:
        holder.close()
    try:
        assert store.offset(SP) == 5 and store.get(SP, "a") == b"{}"
    finally:
        store.close()


_HOLDER = """
import sys
from rocksdict import Options, Rdict
db = Rdict(sys.argv[1], Options(raw_mode=True))
print("held", flush=True)
sys.stdin.readline()
db.close()
"""


def test_a_copy_locked_by_another_process_is_no_damage(tmp_path: Path) -> None:
    _written(tmp_path / "states")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "states" / f"p{SP}.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    store = RocksAggregateStore(tmp_path / "states")
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StoreError, match="LOCK"):
            store.offset(SP)
        assert not store.is_bad(SP)
        holder.communicate("\n", timeout=30)
        assert store.offset(SP) == 5 and store.get(SP, "a") == b"{}"
    finally:
        if holder.returncode is None:
            holder.kill()
            holder.wait()
        store.close()
