"""The entry store on real files: CAS, durability errors, permissions, hostile files, repair."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from pathlib import Path

import attrs
import pytest
from helpers import dir_digest, make_entry, plant_hostile_files

from pi_tmux_matrix import procs
from pi_tmux_matrix.errors import (
    Conflict,
    CorruptEntry,
    EntryExists,
    IllegalTransition,
    InvalidId,
    NotFound,
    StateDirError,
    StoreError,
)
from pi_tmux_matrix.matrix import fsio
from pi_tmux_matrix.matrix.codec import encode_entry
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_create_get_update_delete(store: MatrixStore) -> None:
    created = store.create(make_entry("s1", process=procs.current()))
    assert created.generation and created.registration == created.generation
    assert store.get("worker-s1") == created

    moved = store.update(
        "worker-s1",
        lambda e: e.moved(Status.WINDING_DOWN, reason="parent_lost"),
        expected=created.generation,
    )
    assert moved.status is Status.WINDING_DOWN
    assert moved.generation != created.generation
    assert moved.registration == created.registration  # same process generation
    assert store.get("worker-s1") == moved

    store.delete("worker-s1", moved.generation)
    with pytest.raises(NotFound):
        store.get("worker-s1")
    # The lock file goes with the entry (issue 30), removed by its holder: a waiter re-checks the
    # inode after its flock, so waiters never split across two inodes (test_retention.py).
    assert not (store.root / "locks" / "worker-s1.lock").exists()


def test_every_write_mints_a_fresh_token(store: MatrixStore) -> None:
    entry = store.create(make_entry("s1"))
    seen = {entry.generation}
    for _ in range(50):
        entry = store.update(entry.key, lambda e: e, expected=entry.generation)
        assert entry.generation not in seen
        seen.add(entry.generation)


def test_stale_token_is_refused_and_changes_nothing(store: MatrixStore) -> None:
    first = store.create(make_entry("s1"))
    second = store.update(first.key, lambda e: e.moved(Status.WINDING_DOWN), expected=first.generation)
    before = (store.root / "worker-s1.json").read_bytes()
    with pytest.raises(Conflict) as info:
        store.replace(first.key, first.generation, first)
    assert info.value.found == second.generation
    with pytest.raises(Conflict):
        store.delete(first.key, first.generation)
    assert (store.root / "worker-s1.json").read_bytes() == before


def test_aba_delete_and_recreate_never_revives_an_old_token(store: MatrixStore) -> None:
    first = store.create(make_entry("s1"))
    store.delete(first.key, first.generation)
    again = store.create(make_entry("s1"))
    assert again.generation != first.generation
    with pytest.raises(Conflict):
        store.replace(first.key, first.generation, first)
    assert store.get(first.key).generation == again.generation


def test_register_takes_ownership_from_an_older_process_generation(store: MatrixStore) -> None:
    old = store.create(make_entry("s1"))
    new = store.register(make_entry("s1"))
    assert new.registration != old.registration
    # The older process's late heartbeat / exit hook is refused, never applied.
    with pytest.raises(Conflict):
        store.update(old.key, lambda e: attrs.evolve(e, heartbeat_at=1), expected=old.generation)
    with pytest.raises(Conflict):
        store.delete(old.key, old.generation)
    assert store.get(old.key) == new


def test_exclusive_create_refuses_an_existing_key(store: MatrixStore) -> None:
    store.create(make_entry("s1"))
    with pytest.raises(EntryExists):
        store.create(make_entry("s1"))


def test_update_without_entry_and_illegal_transition(store: MatrixStore) -> None:
    with pytest.raises(NotFound):
        store.update("worker-nope", lambda e: e)
    with pytest.raises(Conflict):
        store.update("worker-nope", lambda e: e, expected="x-1")
    entry = store.create(make_entry("s1", status=Status.CLOSED))
    with pytest.raises(IllegalTransition):
        store.update(entry.key, lambda e: e.moved(Status.RUNNING))
    assert store.get(entry.key).status is Status.CLOSED


def test_hostile_keys_are_refused_before_any_filesystem_call(store: MatrixStore) -> None:
    for key in ("../worker-x", "worker-../../etc/passwd", "worker-", "boss-x", "worker-a/b", "worker-.x"):
        with pytest.raises(InvalidId):
            store.get(key)
        with pytest.raises(InvalidId):
            store.delete(key, "t-1")
    assert not store.root.exists()


def test_reads_create_nothing(store: MatrixStore) -> None:
    assert store.list().entries == ()
    with pytest.raises(NotFound):
        store.get("worker-s1")
    assert store.repair(dry_run=True) == ()
    assert not store.root.exists()
    assert not store.root.parent.exists()


@pytest.mark.parametrize("umask", [0o000, 0o077, 0o277])
def test_modes_hold_whatever_the_umask(state_dir: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        store = MatrixStore(state_dir)
        entry = store.create(make_entry("s1"))
        store.update(entry.key, lambda e: e, expected=entry.generation)
    finally:
        os.umask(old)
    assert mode(state_dir) == 0o700
    assert mode(state_dir / "locks") == 0o700
    assert mode(state_dir / "worker-s1.json") == 0o600
    assert mode(state_dir / "locks" / "worker-s1.lock") == 0o600


def test_state_dir_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    store = MatrixStore(link)
    with pytest.raises(StateDirError, match="symlink"):
        store.create(make_entry("s1"))
    with pytest.raises(StateDirError):
        store.list()
    assert list(real.iterdir()) == []


def test_state_dir_open_to_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    store = MatrixStore(loose)
    with pytest.raises(StateDirError, match="chmod 700"):
        store.create(make_entry("s1"))
    assert list(loose.iterdir()) == []


def test_state_dir_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a directory to another user")
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 65534, 65534)
    with pytest.raises(StateDirError, match="owned by uid 65534"):
        MatrixStore(other).create(make_entry("s1"))


def _fail_with(code: int):  # type: ignore[no-untyped-def]
    def fail(*_args: object) -> None:
        raise OSError(code, os.strerror(code))

    return fail


@pytest.mark.parametrize(
    ("seam", "code"),
    [("_fsync", errno.EIO), ("_write_all", errno.ENOSPC), ("_write_all", errno.EIO)],
)
def test_write_errors_fail_cleanly(
    store: MatrixStore, monkeypatch: pytest.MonkeyPatch, seam: str, code: int
) -> None:
    entry = store.create(make_entry("s1"))
    before = (store.root / "worker-s1.json").read_bytes()
    monkeypatch.setattr(fsio, seam, _fail_with(code))
    with pytest.raises(StoreError) as info:
        store.update(entry.key, lambda e: e.moved(Status.WINDING_DOWN), expected=entry.generation)
    assert info.value.errno == code
    assert "not acknowledged" in str(info.value)
    monkeypatch.undo()
    # The old version is intact, no temp is left, and the old token still works.
    assert (store.root / "worker-s1.json").read_bytes() == before
    assert sorted(os.listdir(store.root)) == ["locks", "worker-s1.json"]
    assert store.update(entry.key, lambda e: e, expected=entry.generation).status is Status.RUNNING


def test_fsync_failure_on_create_leaves_no_entry(store: MatrixStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsio, "_fsync", _fail_with(errno.EIO))
    with pytest.raises(StoreError):
        store.create(make_entry("s1"))
    monkeypatch.undo()
    assert store.list().entries == ()
    assert [n for n in os.listdir(store.root) if n != "locks"] == []


def test_read_only_state_dir_gives_a_typed_error(store: MatrixStore) -> None:
    entry = store.create(make_entry("s1"))
    before = (store.root / "worker-s1.json").read_bytes()
    if os.geteuid() == 0:
        # root ignores mode bits; the immutable attribute is a real read-only dir for root too.
        if shutil.which("chattr") is None:
            pytest.skip("chattr not available to make a read-only dir as root")
        made = subprocess.run(["chattr", "+i", str(store.root)], capture_output=True, check=False)
        if made.returncode != 0:
            pytest.skip(f"chattr +i unsupported here: {made.stderr.decode().strip()}")
        undo = ["chattr", "-i", str(store.root)]
    else:
        os.chmod(store.root, 0o500)
        undo = []
    try:
        with pytest.raises(StoreError) as info:
            store.update(entry.key, lambda e: e.moved(Status.WINDING_DOWN), expected=entry.generation)
        assert info.value.errno in (errno.EPERM, errno.EACCES, errno.EROFS)
    finally:
        if undo:
            subprocess.run(undo, check=True)
        else:
            os.chmod(store.root, 0o700)
    assert (store.root / "worker-s1.json").read_bytes() == before
    assert store.get(entry.key) == entry


def test_dead_writers_temp_is_never_read_and_is_swept_under_the_lock(store: MatrixStore) -> None:
    entry = store.create(make_entry("s1"))
    temp = store.root / ".worker-s1.json.tmp"
    temp.write_bytes(b'{"half": ')
    assert [e.key for e in store.list().entries] == ["worker-s1"]
    assert store.list().problems == ()
    store.update(entry.key, lambda e: e, expected=entry.generation)
    assert not temp.exists()


def test_list_reports_every_bad_file_and_changes_nothing(store: MatrixStore, tmp_path: Path) -> None:
    store.create(make_entry("good1"))
    store.create(make_entry("good2"))
    outside = tmp_path / "outside"
    outside.mkdir()
    plant_hostile_files(store.root, outside)
    before = dir_digest(str(store.root))

    result = store.list()

    assert [e.key for e in result.entries] == ["worker-good1", "worker-good2"]
    reasons = {Path(p.path).name: p.reason for p in result.problems}
    assert set(reasons) == {
        "worker-trunc.json",
        "worker-junk.json",
        "worker-fifo.json",
        "worker-dir.json",
        "worker-link.json",
        "worker-other.json",
        "worker-big.json",
        "notes.txt",
        "bad name.json",
    }
    assert "FIFO" in reasons["worker-fifo.json"]
    assert "directory" in reasons["worker-dir.json"]
    assert "symlink" in reasons["worker-link.json"]
    assert "differs from the file name" in reasons["worker-other.json"]
    assert "byte cap" in reasons["worker-big.json"]
    assert dir_digest(str(store.root)) == before

    with pytest.raises(CorruptEntry):
        store.get("worker-junk")
    with pytest.raises(CorruptEntry, match="FIFO"):
        store.get("worker-fifo")
    # A corrupt entry is never overwritten by an update either.
    with pytest.raises(CorruptEntry):
        store.update("worker-junk", lambda e: e)
    after = dir_digest(str(store.root))
    after.pop("locks/worker-junk.lock")  # taking the write lock is the only trace
    assert after == before


def test_repair_quarantines_and_reports_never_deletes(store: MatrixStore, tmp_path: Path) -> None:
    store.create(make_entry("good1"))
    outside = tmp_path / "outside"
    outside.mkdir()
    plant_hostile_files(store.root, outside)
    (store.root / ".worker-good1.json.tmp").write_bytes(b"partial")
    newer = store.root / "worker-future.json"
    newer.write_text(
        encode_entry(make_entry("future")).decode().replace('"schemaVersion": 1', '"schemaVersion": 9')
    )

    dry = store.repair(dry_run=True)
    assert {a.action for a in dry} == {"quarantine", "remove-temp", "skip"}
    assert (store.root / ".worker-good1.json.tmp").exists()

    actions = store.repair()
    moved = {Path(a.path).name for a in actions if a.action == "quarantine"}
    assert "worker-fifo.json" in moved and "worker-big.json" in moved
    assert [Path(a.path).name for a in actions if a.action == "skip"] == ["worker-future.json"]
    quarantined = sorted(os.listdir(store.root / "quarantine"))
    assert len(quarantined) == len(moved)
    assert not (store.root / ".worker-good1.json.tmp").exists()
    assert newer.exists()
    # The symlink itself was moved; its target outside is untouched.
    assert (outside / "secret.json").exists()
    result = store.list()
    assert [e.key for e in result.entries] == ["worker-good1"]
    assert [p.kind for p in result.problems] == ["newer"]


# --- issue 21: the CAS keeps its checks with less work under the lock --------------------------------
def test_a_cas_over_bytes_this_store_wrote_that_another_writer_replaced_decodes_the_new_ones(
    store: MatrixStore,
) -> None:
    """The store skips decoding only bytes identical to its own last write: another process's
    version, or a corrupt file in its place, is read as what it is."""
    entry = store.create(make_entry("s1"))
    other = MatrixStore(store.root)  # another process's view: its own memory of writes
    theirs = other.update(entry.key, lambda e: e.moved(e.status, heartbeat_at=41))
    seen: list[int | None] = []
    store.update(entry.key, lambda e: seen.append(e.heartbeat_at) or e.moved(e.status, heartbeat_at=42))
    assert seen == [41] and store.get(entry.key).heartbeat_at == 42
    with pytest.raises(Conflict):
        store.update(entry.key, lambda e: e, expected=theirs.generation)
    (store.root / "worker-s1.json").write_bytes(b'{"half": ')
    with pytest.raises(CorruptEntry):
        store.update(entry.key, lambda e: e)


def test_a_state_dir_made_anew_under_a_live_store_is_locked_through_its_new_locks_dir(
    store: MatrixStore,
) -> None:
    entry = store.create(make_entry("s1"))
    store.update(entry.key, lambda e: e.moved(e.status, heartbeat_at=1))
    shutil.rmtree(store.root)
    again = store.create(make_entry("s1"))
    assert (store.root / "locks" / "worker-s1.lock").exists()
    assert mode(store.root / "locks") == 0o700
    assert store.update(again.key, lambda e: e.moved(e.status, heartbeat_at=2)).heartbeat_at == 2
