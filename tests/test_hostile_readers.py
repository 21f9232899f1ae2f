"""Issue 28 case 4: a FIFO, a symlink or a device where a state-dir file should be never hangs a
reader, never hands it another file's bytes, and is never deleted.

docs/on-disk-format.md promises ``O_NOFOLLOW|O_NONBLOCK``, regular files only and a size cap for
every file the product reads from the state dir. Entries and records always kept it; every other
reader now goes through ``fsio.read_state_file`` (or its opener, for a followed log), and the pi
bridge through ``readStateFile`` in ``common.ts``. Each reader is run here against a planted FIFO
and a planted symlink (to a file outside holding what the reader would act on), under a hang
guard: it must answer at once, not act on the outside file, and leave both in place.

``events/<key>.jsonl`` (``EventLog``, ``pi-matrix show``) is covered by its own change and test;
this file covers every other reader.
"""

from __future__ import annotations

import ast
import json
import os
import selectors
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import in_host, plant_job
from pi_support import bridge_harness, pi_jiti, pi_temp, read_line

from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.dispatch.usage import read_claim
from pi_tmux_matrix.dispatch.watch import Watcher
from pi_tmux_matrix.errors import CorruptEntry
from pi_tmux_matrix.fork import RunStore
from pi_tmux_matrix.fork.model import ForkRun, RunMode
from pi_tmux_matrix.matrix.mailbox import Inbox
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.supervise.bridge_reports import BridgeReports
from pi_tmux_matrix.testing import standin

KINDS = ("fifo", "symlink")
HANG_S = 10  # a reader answers in milliseconds; a blocked open never would


class Hung(BaseException):
    """Raised into a blocked reader: a BaseException, so that no reader's ``except OSError`` (or
    ``except Exception``) can take it for an unreadable file and pass."""


@contextmanager
def no_hang(what: str) -> Iterator[None]:
    """Fail (not hang) when ``what`` blocks: an open of a FIFO with no writer blocks forever."""

    def hung(_sig: int, _frame: object) -> None:
        raise Hung(f"{what} hung for {HANG_S}s (a FIFO opened without O_NONBLOCK?)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plant(place: Path, kind: str, outside: bytes = b"") -> Path | None:
    """A FIFO, or a symlink to a file outside holding ``outside``, at ``place``; the symlink's
    target (None for a FIFO)."""
    place.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(place, 0o600)
        return None
    target = place.parent.parent / f"outside-{place.name}"
    target.write_bytes(outside)
    place.symlink_to(target)
    return target


def still_there(place: Path, kind: str, target: Path | None, outside: bytes) -> None:
    """Nothing was deleted or changed: the planted file is as planted, its target untouched."""
    info = os.lstat(place)
    assert stat.S_ISFIFO(info.st_mode) if kind == "fifo" else stat.S_ISLNK(info.st_mode), place
    if target is not None:
        assert target.read_bytes() == outside


# --- the one reader --------------------------------------------------------------------------------
def _device(place: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a device node needs root")
    os.mknod(place, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("fifo", "is not a regular file (a FIFO)"),
        ("symlink", "is a symlink (never followed)"),
        ("device", "is not a regular file (a character device)"),
        ("directory", "is not a regular file (a directory)"),
        ("big", "over the 64 byte cap"),
        ("folder-link", "is a symlink or not a folder (never followed)"),
    ],
)
def test_the_one_reader_takes_only_a_regular_file_and_says_why(tmp_path: Path, kind: str, why: str) -> None:
    folder = tmp_path / "state" / "results"
    folder.mkdir(parents=True)
    place = folder / "x.usage.json"
    if kind == "device":
        _device(place)
    elif kind == "directory":
        place.mkdir()
    elif kind == "big":
        place.write_bytes(b"x" * 65)
    elif kind == "folder-link":
        real = tmp_path / "elsewhere"
        real.mkdir()
        (real / "x.usage.json").write_text("{}")
        place = tmp_path / "state" / "linked" / "x.usage.json"
        (tmp_path / "state" / "linked").symlink_to(real)
    else:
        plant(place, kind, b"{}")
    from pi_tmux_matrix.matrix.fsio import read_state_file  # here: main had none (issue 28 evidence)

    with no_hang("read_state_file"), pytest.raises(CorruptEntry) as caught:
        read_state_file(place, max_bytes=64)
    said = str(caught.value)
    assert said.startswith(f"{place}: ") and why in said and "left untouched" in said, said
    assert os.path.lexists(place)


def test_the_one_reader_reads_a_regular_file_whole_or_its_tail(tmp_path: Path) -> None:
    from pi_tmux_matrix.matrix.fsio import read_state_file

    place = tmp_path / "log"
    place.write_bytes(b"0123456789")
    assert read_state_file(place, max_bytes=10) == b"0123456789"
    assert read_state_file(place, max_bytes=4, tail=True) == b"6789"
    with pytest.raises(FileNotFoundError):
        read_state_file(tmp_path / "absent", max_bytes=10)


# --- each reader of the state dir ------------------------------------------------------------------
MESSAGE = b'{"kind": "stop", "text": "", "at": 1, "sender": "outside"}'


@pytest.mark.parametrize("kind", KINDS)
def test_the_host_never_takes_or_removes_a_message_that_is_not_a_regular_file(
    store: MatrixStore, kind: str
) -> None:
    inbox = Inbox(store, "worker-h1")
    real = inbox.post("steer", "the real one", sender="test")
    place = inbox.path / "000000000000001-aaaaaaaa.json"  # taken first, by name
    target = plant(place, kind, MESSAGE)
    with no_hang("Inbox.take"):
        taken = inbox.take()
    assert [(m.kind, m.text) for m in taken] == [("steer", "the real one")]
    assert not real.exists()  # the real message was taken as ever
    still_there(place, kind, target, MESSAGE)
    with no_hang("Inbox.take, again"):
        assert inbox.take() == []


def test_the_host_never_takes_mail_from_a_symlinked_mailbox_folder(
    store: MatrixStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside-folder"
    outside.mkdir()
    (outside / "000000000000001-aaaaaaaa.json").write_bytes(MESSAGE)
    store.side_dir("mailbox")
    (store.root / "mailbox" / "worker-h1").symlink_to(outside)
    assert Inbox(store, "worker-h1").take() == []
    assert (outside / "000000000000001-aaaaaaaa.json").read_bytes() == MESSAGE  # never taken (deleted)


@pytest.mark.parametrize("kind", KINDS)
def test_the_hosts_result_artifact_is_read_only_from_a_regular_file(store: MatrixStore, kind: str) -> None:
    place = store.root / "artifacts" / "worker-h1" / "run-0001.json"
    outside = json.dumps({"text": "OUTSIDE-ANSWER"}).encode()
    target = plant(place, kind, outside)
    with no_hang("BridgeReports.last_text"):
        assert BridgeReports(result_pointer=str(place)).last_text() == ""
    still_there(place, kind, target, outside)


@pytest.fixture
def watcher(store: MatrixStore, tmp_path: Path) -> Iterator[Watcher]:
    job = plant_job(store, "job-20261206-010000-a1b2c3", tmp_path)
    with in_host() as host:
        yield Watcher(store, job, job.agents[0], 1, host)


@pytest.mark.parametrize("kind", KINDS)
def test_the_watcher_reads_the_bridges_artifact_only_from_a_regular_file(watcher: Watcher, kind: str) -> None:
    folder = watcher.store.root / "artifacts" / watcher.agent.key
    watcher.scanner.marker = f"DONE:{watcher.agent.nonce}"
    outside = json.dumps({"text": f"answer\n{watcher.scanner.marker}"}).encode()
    target = plant(folder / "run-0001.json", kind, outside)
    with no_hang("Watcher._marker_run_ended"):
        assert watcher._marker_run_ended(folder) is False
    still_there(folder / "run-0001.json", kind, target, outside)


@pytest.mark.parametrize("kind", KINDS)
def test_the_watcher_never_follows_a_log_that_is_not_a_regular_file(watcher: Watcher, kind: str) -> None:
    place = watcher.store.root / "logs" / "job.a1.log"
    outside = f"DONE:{watcher.agent.nonce}\n".encode()
    target = plant(place, kind, outside)
    watcher.follow = str(place)
    with selectors.DefaultSelector() as selector, no_hang("Watcher._open_sources"):
        follow_fd = watcher._open_sources(selector)
    assert follow_fd is None  # the round ends by the host's exit or deadline
    still_there(place, kind, target, outside)


@pytest.mark.parametrize("kind", KINDS)
def test_a_usage_claim_that_is_not_a_regular_file_is_invalid_and_says_why(
    store: MatrixStore, kind: str
) -> None:
    place = store.root / "results" / "job.a1.1.usage.json"
    outside = b'{"totalTokens": 999}'
    target = plant(place, kind, outside)
    with no_hang("read_claim"):
        claim = read_claim(str(place))
    assert claim is not None and claim.claimed is None
    assert claim.invalid == (
        "is a symlink (never followed)" if kind == "symlink" else "is not a regular file (a FIFO)"
    )
    still_there(place, kind, target, outside)


@pytest.mark.parametrize("kind", KINDS)
def test_the_stand_in_reads_its_notices_only_from_a_regular_file(store: MatrixStore, kind: str) -> None:
    place = store.root / "mailbox" / "worker-h1.agent.jsonl"
    outside = b'{"type": "shutdown", "message": ""}\n'
    target = plant(place, kind, outside)
    with no_hang("the stand-in's notices"):
        assert standin._notices(str(place), 0) == ([], 0)
    still_there(place, kind, target, outside)


# --- a real verb: pi-matrix runs RUN ---------------------------------------------------------------
OUTSIDE_SESSION = (
    json.dumps(
        {
            "type": "message",
            "message": {"role": "assistant", "content": "OUTSIDE-ANSWER", "stopReason": "stop"},
        }
    )
    + "\n"
).encode()
RUN_FILES = {
    "session.jsonl": OUTSIDE_SESSION,
    "result.json": json.dumps({"text": "OUTSIDE-ANSWER", "stopReason": "stop"}).encode(),
    "exit.code": b"0\n",
    "pane.log": b"__PI_FORK_EXIT_run-20261206-010000-abcdef__:0\n",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(RUN_FILES))
def test_runs_reads_a_forks_files_only_when_they_are_regular(
    store: MatrixStore, tmp_path: Path, name: str, kind: str
) -> None:
    """A fork run whose child ended without its artifact: ``runs RUN`` reads the exit code, the
    pane log, the artifact and (the fallback) the session copy. One of them planted: the answer
    comes at once and never from the file outside."""
    runs = RunStore(store)
    now = now_ms()
    run = ForkRun(
        id="run-20261206-010000-abcdef", cwd=str(tmp_path), task="t", mode=RunMode.BACKGROUND,
        created_at_ms=now, updated_at_ms=now, snapshot_bytes=0,
    )  # fmt: skip
    runs.put(run, exclusive=True)
    if name != "exit.code":
        runs.write_file(run.id, "exit.code", b"0\n")  # the child ended: its end is read now
    target = plant(runs.path(run.id, name), kind, RUN_FILES[name])
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "runs", run.id, "--json"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert time.monotonic() - started < 30
    assert done.returncode == 0, done.stderr
    assert "OUTSIDE-ANSWER" not in done.stdout, done.stdout
    assert "Traceback" not in done.stderr
    still_there(runs.path(run.id, name), kind, target, RUN_FILES[name])


# --- the pi bridge's reader ------------------------------------------------------------------------


def _notice(text: str) -> str:
    return json.dumps({"type": "prompt", "message": text, "at": int(time.time() * 1000), "id": text}) + "\n"


def _sent_within(proc: subprocess.Popen[str], seconds: float) -> tuple[list[str], int]:
    """What pi was sent in ``seconds``, and how many times it said it was alive meanwhile."""
    sent: list[str] = []
    alive = 0
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        line = read_line(proc, left)
        if line is None:
            break
        if "sent" in line:
            sent.append(str(line["sent"]))
        alive += "alive" in line
    return sent, alive


@pytest.mark.real_pi
@pytest.mark.parametrize(
    "kind", ["fifo", pytest.param("symlink", marks=pytest.mark.any_pi)]  # one kind runs on the oldest pi
)
def test_the_bridge_reads_its_notices_only_from_a_regular_file(tmp_path: Path, kind: str) -> None:
    jiti = pi_jiti()
    state = tmp_path / "state"
    notices = state / "mailbox" / "worker-t1.agent.jsonl"
    target = plant(notices, kind)
    script = tmp_path / "harness.mjs"
    script.write_text(bridge_harness(bridge_path(), alive=True))
    env = dict(
        os.environ, NODE_PATH=str(jiti.parent.parent.parent), TMPDIR=pi_temp(tmp_path),
        PI_MATRIX_KEY="worker-t1", PI_MATRIX_STATE_DIR=str(state), PI_MATRIX_MAILBOX=str(notices),
    )  # fmt: skip
    proc = subprocess.Popen(
        ["node", str(script)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert read_line(proc, 60) == {"ready": True}
        held = None
        outside = _notice("outside")
        if target is not None:
            with target.open("a") as handle:  # the outside file grows: it must not be delivered
                handle.write(outside)
        else:
            # Both ends held here (O_RDWR never blocks on Linux): a notice waits in the FIFO.
            held = os.open(notices, os.O_RDWR | os.O_NONBLOCK)
            os.write(held, _notice("fifo").encode())
        try:
            sent, alive = _sent_within(proc, 2.0)
        finally:
            if held is not None:
                os.close(held)
        assert sent == [], f"the bridge delivered what a {kind} handed it: {sent}"
        assert alive >= 2, "pi stopped answering (blocked on the notices file?)"
        still_there(notices, kind, target, outside.encode())
        # The same harness delivers from a regular file: the silence above was the refusal.
        notices.unlink()
        notices.write_text(_notice("regular"))
        sent, _ = _sent_within(proc, 5.0)
        assert sent == ["[pi-matrix prompt] regular"]
    finally:
        proc.kill()
        proc.wait(10)


# --- no reader of the state dir bypasses the one reader --------------------------------------------
PACKAGE = Path(__file__).resolve().parent.parent / "pi_tmux_matrix"
# Every place in the package that opens a file to read it other than through matrix/fsio.py, and
# why it is not a state-dir file (or, for EventLog, who takes it over).
NOT_THE_STATE_DIR: dict[str, set[str]] = {
    "procs.py": {"boot_id", "_read_stat", "_has_live_threads", "_scan", "cmdline", "with_argument"},  # /proc
    "settings.py": {"_read_document"},  # the agent dir's settings.json (O_NONBLOCK, regular only)
    "dispatch/profile.py": {"_read_user_file", "_files"},  # launch profiles (O_NONBLOCK, regular only)
    "dispatch/lanes.py": {"_exclude"},  # git's own info/exclude in the repository
    # pi's session files (agent dir), read by its one session reader; a fork run's copy in the state
    # dir goes through fsio there.
    "pisession.py": {"_read_session"},
    "gitcmd.py": {"_pointer"},  # a lane's .git pointer (in the repository, O_NOFOLLOW|O_NONBLOCK)
    "piversion.py": {"small_text"},  # pi's own files: wrapper, package.json, trust.json (O_NONBLOCK)
    "cli/dispatch.py": {"_adhoc_agents"},  # --agents-file: the user's file (a pipe welcome)
    "cli/demo.py": {"pi_provider", "setup"},  # the package's own example files
    "pytest_plugin.py": {"set"},  # a test's own settings.json
    "testing/standin.py": {"__init__", "_notices"},  # the stand-in agent (it imports nothing of the matrix)
    "testing/fake_model.py": {"_read_json"},  # the fake model's pi agent dir: models.json, settings.json
}


def _reads(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(enclosing function, line) of every open-for-reading call: open(), os.open() with
    O_RDONLY, Path.read_text() / read_bytes()."""

    def walk(node: ast.AST, function: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Name) and func.id == "open":
                    mode = child.args[1] if len(child.args) > 1 else None
                    if not (
                        isinstance(mode, ast.Constant)
                        and isinstance(mode.value, str)
                        and "r" not in mode.value
                    ):
                        yield function, child.lineno
                elif isinstance(func, ast.Attribute) and func.attr in ("read_text", "read_bytes"):
                    if not (isinstance(func.value, ast.Name) and func.value.id == "self"):  # RunStore's own
                        yield function, child.lineno
                elif (
                    isinstance(func, ast.Attribute)
                    and func.attr == "open"
                    and "O_RDONLY" in ast.unparse(child)
                    and "O_DIRECTORY" not in ast.unparse(child)  # a folder, opened to list or fsync
                ):
                    yield function, child.lineno
            yield from walk(child, name)

    yield from walk(tree, "<module>")


def test_every_read_of_a_state_dir_file_goes_through_the_one_reader() -> None:
    stray: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == "matrix/fsio.py":
            continue
        for function, line in _reads(ast.parse(path.read_text())):
            if function not in NOT_THE_STATE_DIR.get(module, set()):
                stray.append(f"{module}:{line} in {function}()")
    assert stray == [], (
        "these read a file without fsio.read_state_file (O_NOFOLLOW|O_NONBLOCK, regular only, "
        f"bounded); use it, or say here why the file is not the state dir's: {stray}"
    )


def test_the_bridge_reads_and_writes_state_files_only_through_common_ts() -> None:
    for ts in sorted(bridge_path().parent.glob("*.ts")):
        text = ts.read_text()
        calls = ("readFileSync", "openSync", "writeFileSync", "appendFileSync", "renameSync")
        for call in (*calls, "createReadStream", "createWriteStream"):
            if ts.name != "common.ts":
                assert f"fs.{call}" not in text, (
                    f"{ts.name} calls fs.{call}: use common.ts readStateFile/durableWrite"
                )


# --- what a host reads inside its mail ---------------------------------------------------------------
def test_a_deep_message_body_is_garbled_mail_never_a_hosts_recursion_error(store: MatrixStore) -> None:
    """A message is at most 64 KiB, room for 60,000 ``[``: the bodies a host parses (the bridge's
    reports, a watcher's ``round``) are read with strictjson's bounds, so such a body is refused
    as any garbled one is, never a RecursionError out of the host's loop."""
    from pi_tmux_matrix.matrix.mailbox import EventLog, parse_round

    deep = "[" * 60_000
    events = EventLog(store, "worker-h1")
    assert BridgeReports().receive("result", deep, events) is None
    (garbled,) = events.tail()
    assert garbled["event"] == "bridge_garbled" and "nested deeper than 32 levels" in garbled["error"]
    assert parse_round(deep) is None
