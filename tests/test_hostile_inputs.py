"""Bytes a worker, its model or another local process can write, read back by the product
(docs/threat-model.md): each reader is bounded and never hangs. The cases here are those the
threat model found beyond issue 28's numbered ones."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pi_tmux_matrix import pisession

HEADER = {"type": "session", "version": 3, "id": "s-1", "timestamp": "2026-12-06T00:00:00.000Z"}


def _read_in_child(call: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``call`` (a pisession function) on ``path`` in a child process: a hang is a timeout there,
    never a hung test run."""
    code = (
        "import sys\nfrom pi_tmux_matrix import pisession\ntry:\n"
        f"    pisession.{call}(sys.argv[1])\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        preexec_fn=_one_gib,  # a reader that reads without bound fails there, not the machine
    )


def _one_gib() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_a_session_file_that_is_a_fifo_with_a_live_writer_never_hangs_the_fork_snapshot(
    tmp_path: Path,
) -> None:
    # A header sits in the pipe and a writer holds it open: the header reads, then a plain open and
    # read of the whole file (the fork's snapshot) waits for an end that never comes.
    fifo = tmp_path / "session.jsonl"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(writer, (json.dumps({**HEADER, "cwd": str(tmp_path)}) + "\n").encode())
        try:
            done = _read_in_child("whole_lines", fifo)
        except subprocess.TimeoutExpired:
            pytest.fail("reading a FIFO as a session file hung")
        assert "ContractError" in done.stdout and "--session" in done.stdout, done.stdout + done.stderr
        assert "not a regular file" in done.stdout
    finally:
        os.close(writer)


@pytest.mark.parametrize("call", ["read_header", "has_transcript", "whole_lines"])
def test_every_session_file_read_refuses_what_is_not_a_regular_file(tmp_path: Path, call: str) -> None:
    folder = tmp_path / "dir.jsonl"
    folder.mkdir()
    for path in (folder, Path("/dev/zero")):
        try:
            done = _read_in_child(call, path)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{call} of {path} did not return")
        assert done.returncode == 0, done.stderr[-500:]
        if call != "has_transcript":  # that one answers False for anything unreadable
            assert done.stdout.startswith("ContractError") and "--session" in done.stdout, done.stdout


def test_a_run_read_back_from_a_session_keeps_whole_lines_when_it_is_longer_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run longer than MAX_RUN_BYTES is read from its end, from the start of a whole line.
    monkeypatch.setattr(pisession, "MAX_RUN_BYTES", 400)
    session = tmp_path / "s.jsonl"
    header = (json.dumps({**HEADER, "cwd": str(tmp_path)}) + "\n").encode()
    lines = [
        json.dumps(
            {
                "type": "message",
                "message": {"role": "assistant", "content": [{"type": "text", "text": f"t{i}"}]},
            }
        )
        for i in range(20)
    ]
    session.write_bytes(header + ("\n".join(lines) + "\n").encode())
    outcome = pisession.run_outcome(session, len(header))
    assert outcome is not None and outcome["text"] == "t19"


# -- pane output ------------------------------------------------------------------------------------


def test_pane_output_counts_a_marker_only_on_a_line_of_its_own_and_keeps_bounded_memory() -> None:
    from pi_tmux_matrix.dispatch.markers import MAX_LINE, MarkerScanner
    from pi_tmux_matrix.dispatch.model import ResultKind

    scanner = MarkerScanner("abc123")
    # The instruction echoed back, a marker hidden in escape sequences mid-line, another round's
    # nonce, and a line that only starts with the marker: none of them ends the round.
    for decoy in (
        b"print DONE:abc123 when finished\n",
        b"x\x1b[31mDONE:abc123\x1b[0m y\n",
        b"DONE:ffffff\n",
        b"DONE:abc123x\n",
        b"\x1b]0;DONE:abc123\x07\n",
    ):
        assert scanner.feed(decoy) is None, decoy
    # A flood with no newline: the partial line the scanner keeps stays bounded.
    for _ in range(64):
        assert scanner.feed(b"A" * 65536) is None
    assert len(scanner._partial) <= MAX_LINE
    # Its own line, under a TUI's colour and bullet decoration, does.
    assert scanner.feed(b"\n\x1b[32m\xe2\x94\x82 DONE:abc123\x1b[0m\r\n") == (ResultKind.DONE, "")


def test_a_window_title_a_program_sets_never_breaks_or_shifts_the_pane_listing(tmux_socket: str) -> None:
    from pi_tmux_matrix.dispatch.tmux import TmuxServer

    subprocess.run(["tmux", "-L", tmux_socket, "new-session", "-d", "-s", "main", "sleep 60"], check=True)
    subprocess.run(["tmux", "-L", tmux_socket, "set", "-g", "allow-rename", "on"], check=True)
    # The program names its window with newlines, tabs and what looks like another pane's row.
    hostile = r"printf '\033kev\nil\t%99\t1\tx\033\\'; printf '\033]2;ti\ntle\t\033\\'; sleep 60"
    subprocess.run(["tmux", "-L", tmux_socket, "new-window", "-d", "-t", "main", hostile], check=True)
    server = TmuxServer(tmux_socket)
    deadline = time.monotonic() + 20
    while True:
        panes = server.panes()
        names = [p.window_name for p in panes]
        if any(n.startswith("ev") for n in names) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(panes) == 2, panes
    renamed = next(p for p in panes if p.window_name.startswith("ev"))
    assert not any(c in renamed.window_name for c in "\n\t\x1b"), renamed.window_name
    assert all(p.pane_id.startswith("%") and p.pane_id != "%99" for p in panes)


# -- files the product appends to ---------------------------------------------------------------------


def _in_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: {code}")


def test_a_fifo_at_a_repositorys_info_exclude_never_hangs_making_a_lane(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "init"], check=True, timeout=30)
    exclude = repo / ".git" / "info" / "exclude"
    exclude.unlink(missing_ok=True)
    os.mkfifo(exclude)
    code = (
        "import sys\nfrom pi_tmux_matrix.dispatch.lanes import ensure_lane\n"
        "from pi_tmux_matrix.errors import LaneError\n"
        "try:\n    ensure_lane(sys.argv[1], 'lane-1')\n"
        "except LaneError as exc:\n    print('LaneError', exc)\n"
    )
    done = _in_child(code, str(repo))
    assert done.stdout.startswith("LaneError") and "info/exclude" in done.stdout, done.stdout + done.stderr
    assert "not a regular file" in done.stdout
    assert exclude.is_fifo()  # left as it was


def test_a_fifo_at_a_detached_agents_log_never_hangs_its_start(tmp_path: Path) -> None:
    log = tmp_path / "job.agent.log"
    os.mkfifo(log)
    code = (
        "import sys\nfrom pathlib import Path\nfrom pi_tmux_matrix.programs import spawn_detached\n"
        "try:\n    spawn_detached(['true'], Path(sys.argv[1]))\nexcept OSError as exc:\n"
        "    print('OSError', exc)\n"
    )
    done = _in_child(code, str(log))
    assert done.stdout.startswith("OSError") and "regular file" in done.stdout, done.stdout + done.stderr
    assert log.is_fifo()


# -- reports a bridge posts ---------------------------------------------------------------------------


def test_a_result_report_naming_a_file_outside_the_artifacts_is_recorded_never_read(tmp_path: Path) -> None:
    from pi_tmux_matrix.matrix.mailbox import EventLog
    from pi_tmux_matrix.matrix.store import MatrixStore
    from pi_tmux_matrix.supervise.bridge_reports import BridgeReports

    store = MatrixStore(tmp_path / "state")
    events = EventLog(store, "worker-w1")
    events.write("registered")  # the state dir made as the store makes it (0700)
    artifacts = store.root / "artifacts"
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"text": "SECRET-OUTSIDE"}))
    own = artifacts / "worker-w1" / "run-0001.json"
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"text": "the worker's answer"}))
    reports = BridgeReports(artifacts=str(artifacts))
    for pointer in (
        str(outside),
        str(artifacts / "worker-w1" / ".." / ".." / "outside.json"),
        "run-0001.json",
    ):
        reports.receive("result", json.dumps({"path": pointer, "run": 1}), events)
        assert reports.last_text() == "", pointer
    refused = [e for e in events.tail(50) if e.get("event") == "bridge_pointer_refused"]
    assert len(refused) == 3
    reports.receive("result", json.dumps({"path": str(own), "run": 1}), events)
    assert reports.last_text() == "the worker's answer"


def test_what_a_search_left_out_or_withheld_is_recorded_with_its_count_and_reason(tmp_path: Path) -> None:
    from pi_tmux_matrix.matrix.mailbox import EventLog
    from pi_tmux_matrix.matrix.store import MatrixStore
    from pi_tmux_matrix.supervise.bridge_reports import BridgeReports

    events = EventLog(MatrixStore(tmp_path / "state"), "worker-w1")
    reports = BridgeReports()
    reports.receive("bridge", json.dumps({"event": "search_filtered", "tool": "grep", "removed": 3}), events)
    withheld = {"event": "search_withheld", "tool": "find", "reason": "x" * 5000}
    reports.receive("bridge", json.dumps(withheld), events)
    reports.receive(
        "bridge", json.dumps({"event": "search_filtered", "tool": "grep", "removed": "many"}), events
    )
    got = [(e["event"], e.get("tool"), e.get("removed"), len(e.get("reason") or "")) for e in events.tail(10)]
    assert got == [
        ("search_filtered", "grep", 3, 0),
        ("search_withheld", "find", None, 1000),
        ("search_filtered", "grep", None, 0),
    ]
