"""kill -9 torture, and a crash at every step of the write path.

Real processes only. The torture writer is a forked child (it starts in milliseconds, so
hundreds of kills fit in the normal suite) that is SIGKILLed at random moments; the crash-step
children are fresh ``python`` interpreters that patch the store's seams to ``os._exit(9)`` at one
chosen step. After every death the parent checks what a later reader and writer would find.

The counter is ``Entry.heartbeat_at``, a plain integer the store never stamps or validates.
``PI_MATRIX_LONG=1`` runs 10,000 kills instead of 300 (about 4.5 minutes on 2 cores);
``PI_MATRIX_SEED=<n>`` replays one kill schedule (the seed is printed, shown on failure).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import attrs
import pytest
from helpers import make_entry

from pi_tmux_matrix.errors import LockUnavailable
from pi_tmux_matrix.matrix.codec import encode_entry
from pi_tmux_matrix.matrix.model import Entry, Status
from pi_tmux_matrix.matrix.store import MatrixStore

CTX = multiprocessing.get_context("fork")
LONG = os.environ.get("PI_MATRIX_LONG") == "1"
KILLS = 10_000 if LONG else 300
LOCK_FREE_WITHIN = 2.0  # seconds after a kill
SESSIONS = ("t0", "t1", "t2")


def _tmp_name(key: str) -> str:
    return f".{key}.json.tmp"


# --- the writer --------------------------------------------------------------------------------
def _writer(root: str, keys: list[str], ack_log: str, error_log: str, seed: int) -> None:
    """CAS transitions forever; after each acknowledged one, a durable "key counter token" line."""
    try:
        store = MatrixStore(root, lock_timeout=30)
        rng = random.Random(seed)
        log = os.open(ack_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        while True:
            key = rng.choice(keys)
            current = store.get(key)
            count = current.heartbeat_at
            assert count is not None
            # RUNNING <-> WINDING_DOWN are legal both ways: a real lifecycle move each time.
            target = Status.WINDING_DOWN if current.status is Status.RUNNING else Status.RUNNING
            if rng.random() < 0.5:
                written = store.replace(
                    key, current.generation, current.moved(target, heartbeat_at=count + 1)
                )
            else:
                written = store.update(
                    key,
                    lambda e, t=target, c=count: e.moved(t, heartbeat_at=c + 1),
                    expected=current.generation,
                )
            # One write(2) per line (a kill can still cut one at a page boundary: see AckLog).
            os.write(log, f"{key} {written.heartbeat_at} {written.generation}\n".encode())
            os.fsync(log)
    except Exception:  # noqa: BLE001 - whatever killed the writer, the parent must see it
        Path(error_log).write_text(traceback.format_exc())
        os._exit(2)


class AckLog:
    """The parent's view of the ack log, read incrementally after each kill."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.tokens: set[str] = set()
        self.lines = 0
        self.torn = 0  # ack lines a kill cut short (never acknowledged)

    def read_new(self) -> list[tuple[str, int, str]]:
        """The lines appended since the last call; no token may repeat across the whole log."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            # SIGKILL inside write(2) can cut a line that crosses a page boundary (the kernel
            # copies page by page and stops for a fatal signal; seen once in ~10,000 kills).
            # That write never returned, so the ack was never given: drop the fragment before
            # the next writer appends to it. Only the parent touches the log between writers.
            os.truncate(self.path, self.offset + complete)
            self.torn += 1
        self.offset += complete
        acks = []
        for line in data[:complete].decode().splitlines():
            key, counter, token = line.split(" ")
            assert token not in self.tokens, f"token {token} acknowledged twice (line {line!r})"
            self.tokens.add(token)
            acks.append((key, int(counter), token))
        self.lines += len(acks)
        return acks


@pytest.mark.timeout(6 * 3600 if LONG else 300)
def test_kill_nine_torture(tmp_path: Path, state_dir: Path) -> None:
    store = MatrixStore(state_dir, lock_timeout=LOCK_FREE_WITHIN)
    created = [store.create(make_entry(s, heartbeat_at=0)) for s in SESSIONS]
    keys = [e.key for e in created]
    state = {e.key: (0, e.generation) for e in created}  # verified (counter, token) per key
    ack = AckLog(tmp_path / "acks.log")
    error_log = tmp_path / "writer-error.txt"
    seed = int(os.environ.get("PI_MATRIX_SEED") or random.randrange(1 << 32))
    print(f"torture seed: PI_MATRIX_SEED={seed}")
    rng = random.Random(seed)
    stats = {"temp_left": 0, "committed_unacked": 0, "lock_wait_max": 0.0}

    started = time.monotonic()
    for kill in range(KILLS):
        writer = CTX.Process(
            target=_writer,
            args=(str(state_dir), keys, str(ack.path), str(error_log), rng.getrandbits(32)),
        )
        writer.start()
        try:
            time.sleep(rng.uniform(0, 0.030))
            os.kill(writer.pid, signal.SIGKILL)  # type: ignore[arg-type]
        finally:
            writer.kill()  # no-op if already dead; never leave a writer behind
            writer.join(10)
        killed_at = time.monotonic()
        assert writer.exitcode == -signal.SIGKILL, (
            f"kill {kill}: the writer died by itself (exit {writer.exitcode}):\n"
            f"{error_log.read_text() if error_log.exists() else ''}"
        )

        # 1. Every entry parses and nothing else is reported; a left temp is never an entry.
        listing = store.list()
        assert listing.problems == (), f"kill {kill}: {[p.line() for p in listing.problems]}"
        assert sorted(e.key for e in listing.entries) == sorted(keys)
        before = {key: store.get(key) for key in keys}
        temps = [k for k in keys if (state_dir / _tmp_name(k)).exists()]
        stats["temp_left"] += len(temps)

        # 2. No acknowledged transition lost; no token acknowledged twice. ``state`` is what
        # the previous check verified on disk; this writer's acks must continue it one by one,
        # and the disk holds the last of them (or, with none, the verified one), or exactly one
        # more: a write committed whose ack the kill cut off.
        for key, counter, token in ack.read_new():
            assert key in state, f"kill {kill}: ack for unknown key {key}"
            assert counter == state[key][0] + 1, (
                f"kill {kill}: {key} acked {counter} after {state[key][0]}"
            )
            state[key] = (counter, token)
        for key in keys:
            on_disk = before[key]
            counter = on_disk.heartbeat_at
            last, last_token = state[key]
            assert counter in (last, last + 1), (
                f"kill {kill}: {key} holds {counter} but the last acknowledged state is {last}"
            )
            if counter == last:
                assert on_disk.generation == last_token, (
                    f"kill {kill}: {key} holds {counter} under another token than acknowledged"
                )
            else:
                stats["committed_unacked"] += 1
                assert on_disk.generation not in ack.tokens
            state[key] = (counter, on_disk.generation)

        # 3. The lock is free within 2 s of the kill, and taking it sweeps the dead writer's temp.
        for key in keys:
            try:
                with store.locked(key):
                    assert not (state_dir / _tmp_name(key)).exists(), f"{key}: temp not swept"
            except LockUnavailable as exc:
                pytest.fail(f"kill {kill}: {key} lock not free {LOCK_FREE_WITHIN}s after kill: {exc}")
        waited = time.monotonic() - killed_at
        stats["lock_wait_max"] = max(stats["lock_wait_max"], waited)
        assert waited < LOCK_FREE_WITHIN, f"kill {kill}: locks took {waited:.2f}s"

        # 4. Sweeping changed no entry (the temp was never the entry's content).
        for key in keys:
            assert store.get(key) == before[key], f"kill {kill}: taking the lock changed {key}"

    elapsed = time.monotonic() - started
    final = {key: store.get(key).heartbeat_at for key in keys}
    print(
        f"torture: {KILLS} kills in {elapsed:.1f}s, {ack.lines} acked writes, "
        f"{ack.torn} torn ack lines, final {final}, {stats}"
    )
    assert ack.lines > KILLS // 10, "the writer barely ever got to write before being killed"
    assert stats["temp_left"] > 0, "no kill ever landed mid-write: the torture did not bite"


# --- crash at every step of the write path ---------------------------------------------------------
CRASH_CHILD = r"""
import os, stat, sys
import attrs
from pi_tmux_matrix.matrix import fsio
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.matrix.model import Entry

root, key, op, step, counter = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
entry_name, tmp_name = key + ".json", "." + key + ".json.tmp"

def die():
    os._exit(9)

real_write_all, real_fsync = fsio._write_all, fsio._fsync
real_replace, real_link, real_unlink = os.replace, os.link, os.unlink

def is_dir(fd):
    return stat.S_ISDIR(os.fstat(fd).st_mode)

if step == "before-write":
    fsio._write_all = lambda fd, data: die()
elif step == "partial-write":
    def _w(fd, data):
        real_write_all(fd, data[: len(data) // 2])
        die()
    fsio._write_all = _w
elif step == "after-write":
    def _w(fd, data):
        real_write_all(fd, data)
        die()
    fsio._write_all = _w
elif step == "after-temp-fsync":
    def _f(fd):
        real_fsync(fd)
        if not is_dir(fd):
            die()
    fsio._fsync = _f
elif step == "after-replace":
    def _r(*args, **kwargs):
        real_replace(*args, **kwargs)
        die()
    os.replace = _r
elif step == "after-link":
    def _l(*args, **kwargs):
        real_link(*args, **kwargs)
        die()
    os.link = _l
elif step in ("after-temp-unlink", "before-entry-unlink", "after-entry-unlink"):
    def _u(path, *args, **kwargs):
        name = os.fspath(path)
        if step == "before-entry-unlink" and name == entry_name:
            die()
        real_unlink(path, *args, **kwargs)  # the lock-time sweep's miss raises here, as usual
        if (step == "after-temp-unlink" and name == tmp_name) or (
            step == "after-entry-unlink" and name == entry_name
        ):
            die()
    os.unlink = _u
elif step in ("before-dir-fsync", "after-dir-fsync"):
    def _f(fd):
        if is_dir(fd) and step == "before-dir-fsync":
            die()
        real_fsync(fd)
        if is_dir(fd):
            die()
    fsio._fsync = _f
else:
    raise SystemExit(f"unknown step {step}")

store = MatrixStore(root, lock_timeout=30)
if op == "replace":
    current = store.get(key)
    store.replace(key, current.generation, attrs.evolve(current, heartbeat_at=counter))
elif op == "create":
    from helpers import make_entry
    store.create(make_entry(key.split("-", 1)[1], heartbeat_at=counter))
elif op == "delete":
    store.delete(key, store.get(key).generation)
sys.exit(0)  # reaching here means the crash point was never hit
"""

OLD, NEW, ABSENT = "old", "new", "absent"
# (op, step, what the entry must be after the crash, whether a temp file must be left)
CRASH_STEPS = [
    ("replace", "before-write", OLD, True),
    ("replace", "partial-write", OLD, True),
    ("replace", "after-write", OLD, True),
    ("replace", "after-temp-fsync", OLD, True),
    ("replace", "after-replace", NEW, False),
    ("replace", "before-dir-fsync", NEW, False),
    ("replace", "after-dir-fsync", NEW, False),
    ("create", "before-write", ABSENT, True),
    ("create", "partial-write", ABSENT, True),
    ("create", "after-temp-fsync", ABSENT, True),
    ("create", "after-link", NEW, True),  # the temp is a second link to the new entry
    ("create", "after-temp-unlink", NEW, False),
    ("create", "before-dir-fsync", NEW, False),
    ("delete", "before-entry-unlink", OLD, False),
    ("delete", "after-entry-unlink", ABSENT, False),
    ("delete", "after-dir-fsync", ABSENT, False),
]


@pytest.mark.parametrize("case", CRASH_STEPS, ids=[f"{c[0]}-{c[1]}" for c in CRASH_STEPS])
def test_crash_at_every_step_of_the_write_path(
    store: MatrixStore, state_dir: Path, case: tuple[str, str, str, bool]
) -> None:
    op, step, expect, temp_left = case
    template = make_entry("crash", heartbeat_at=0)
    key = template.key
    old: Entry | None = None
    if op == "create":
        store.register(make_entry("other"))  # the state dir and another entry exist already
    else:
        old = store.create(template)
        old = store.replace(key, old.generation, attrs.evolve(old, heartbeat_at=5))
    old_bytes = None if old is None else (state_dir / f"{key}.json").read_bytes()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    child = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, str(state_dir), key, op, step, "6"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 9, (
        f"the crash point {op}/{step} was not reached (exit {child.returncode}): {child.stderr}"
    )

    # Old or new, whole; never partial. The exact one is fixed by where the crash happened.
    path = state_dir / f"{key}.json"
    found = store.find(key)
    if expect == ABSENT:
        assert found is None, f"{op}/{step}: an entry exists: {found}"
    elif expect == OLD:
        assert found == old, (
            f"{op}/{step}: expected the old version (counter 5), found "
            f"{None if found is None else found.heartbeat_at}"
        )
        assert path.read_bytes() == old_bytes
    else:
        assert found is not None, f"{op}/{step}: the new version is missing"
        assert found.heartbeat_at == 6, f"{op}/{step}: expected the new version (counter 6)"
        assert path.read_bytes() == encode_entry(found)
        assert os.stat(path).st_mode & 0o777 == 0o600
    assert (state_dir / _tmp_name(key)).exists() == temp_left, (
        f"{op}/{step}: the crash happened somewhere else than the step names"
    )
    listing = store.list()
    assert listing.problems == (), [p.line() for p in listing.problems]

    # Recovery: the next locked write succeeds and sweeps what the dead writer left.
    if found is None:
        recovered = store.create(attrs.evolve(template, heartbeat_at=7))
    else:
        recovered = store.replace(key, found.generation, attrs.evolve(found, heartbeat_at=7))
    assert not (state_dir / _tmp_name(key)).exists()
    assert store.get(key) == recovered
    assert recovered.heartbeat_at == 7
    assert store.list().problems == ()


def test_torture_writer_errors_are_not_kills(tmp_path: Path, state_dir: Path) -> None:
    """The torture's verdict relies on telling a SIGKILL from a writer that died by itself."""
    error_log = tmp_path / "err.txt"
    writer = CTX.Process(
        target=_writer,
        args=(str(state_dir), ["worker-absent"], str(tmp_path / "a.log"), str(error_log), 1),
    )
    writer.start()
    writer.join(30)
    if writer.is_alive():  # pragma: no cover - only on a broken writer
        writer.kill()
        writer.join()
    assert writer.exitcode == 2
    assert "NotFound" in error_log.read_text()


def test_ack_log_drops_a_torn_last_line(tmp_path: Path) -> None:
    """A kill can cut the last ack line short; it is no ack, and the next line starts clean."""
    log = AckLog(tmp_path / "acks.log")
    log.path.write_bytes(b"worker-t0 1 a-1\nworker-t0 2 a-2\nworker-t0 3 a-")
    assert log.read_new() == [("worker-t0", 1, "a-1"), ("worker-t0", 2, "a-2")]
    assert log.torn == 1
    with open(log.path, "ab") as handle:
        handle.write(b"worker-t0 3 b-1\n")
    assert log.read_new() == [("worker-t0", 3, "b-1")]
    assert log.path.read_bytes().endswith(b"a-2\nworker-t0 3 b-1\n")
