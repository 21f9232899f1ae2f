"""A full disk and failed writes (issue 17, case 11): a write the disk refuses costs what it was
writing, never the process that wrote it nor what the owner asked for.

The event log is best effort: a host whose appends all fail still supervises, stops and records
its agent. A message that cannot be queued is one error naming its key, with no half message left
behind; one whose folder fsync fails is queued and says it may not survive a crash. ``send``,
``stop KEY`` and ``stop JOB`` on a full disk end in one error line and exit 1, and ``stop JOB`` and
a passed deadline still stop the agents (signals need no disk).

A full disk is forced at our own write seams only: in the test's process by monkeypatching
(``fsio._write_all``, ``fsio._fsync``, ``JobStore.put_result``), and in a process under test
through a ``sitecustomize`` on its ``PYTHONPATH`` (``seams.full_disk``: ``fsio._write_all``:
entries and records, the results among them; ``mailbox._write_all``: the mailbox;
``mailbox._append``: the event log and the agent's notices): every other process (the host a stop
reaches, the test) writes as usual.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
from helpers import cli_at as _cli
from helpers import end_popens as _end
from helpers import in_host, make_entry, make_identity, plant_job, read_events
from labs import Lab
from seams import ENOSPC_LINE, full_disk
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.watch import Watcher
from pi_tmux_matrix.identity import Mode
from pi_tmux_matrix.matrix.model import ExitKind, Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms


def _one_error_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("pi-matrix: error: "), done.stderr
    assert ENOSPC_LINE in lines[-1] and all(word in lines[-1] for word in words), done.stderr


def _sleeper() -> tuple[subprocess.Popen[bytes], procs.ProcessIdentity]:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    ident = procs.identify(proc.pid)
    assert ident is not None
    return proc, ident


# --- in the test's process: the seams monkeypatched ---------------------------------------------
def test_11_a_failed_event_append_costs_the_line_not_the_host_and_a_failed_post_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refuses: the event log is best effort (a folder where its file goes), and a
    message that cannot be queued (ENOSPC forced at fsio's write seam) is a
    StoreError naming the key, with no half message left behind."""
    import errno

    from pi_tmux_matrix.errors import StoreError
    from pi_tmux_matrix.matrix import fsio
    from pi_tmux_matrix.matrix.mailbox import EventLog, Inbox
    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    (store.side_dir("events") / "worker-w1.jsonl").mkdir()
    EventLog(store, "worker-w1").write("child_exited", code=0)  # no exception: the host lives on

    def full(_fd: int, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsio, "_write_all", full)
    refused = r"worker-w1: the message could not be queued \(No space left on device\)"
    with pytest.raises(StoreError, match=refused):
        Inbox(store, "worker-w1").post("stop", sender="test")
    assert list((store.root / "mailbox" / "worker-w1").iterdir()) == []


def test_11b_a_post_whose_folder_fsync_fails_is_queued_and_says_it_may_not_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32.6: the mailbox writes through fsio's one durable write, so its two outcomes are
    fsio's: the message file's fsync passes and its folder's fails (EIO forced at fsio's seam):
    the message is there, whole, and the error says it may not survive a crash."""
    import errno

    from pi_tmux_matrix.errors import StoreError
    from pi_tmux_matrix.matrix import fsio
    from pi_tmux_matrix.matrix.mailbox import Inbox
    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    folder = store.side_dir("mailbox", "worker-w1")
    synced: list[int] = []

    def folder_fails(fd: int) -> None:
        if os.path.samefile(f"/proc/self/fd/{fd}", folder):
            raise OSError(errno.EIO, "Input/output error")
        synced.append(fd)
        os.fsync(fd)

    monkeypatch.setattr(fsio, "_fsync", folder_fails)
    unsure = r"worker-w1: the message is queued but may not survive a crash \(Input"
    with pytest.raises(StoreError, match=unsure):
        Inbox(store, "worker-w1").post("stop", sender="test")
    assert synced, "the message file itself was fsynced through the seam"
    (queued,) = Inbox(store, "worker-w1").take()
    assert queued.kind == "stop" and queued.sender == "test"


# --- the CLI, the host and the watcher on a full disk ---------------------------------------------
def test_11_send_and_stop_key_on_a_full_disk_are_one_error_line_and_exit_1(tmp_path: Path) -> None:
    """``send`` and ``stop KEY`` queue a message for a live host: when the disk refuses it, one
    line naming the key, exit 1, no traceback, and no half message left for the host to read."""
    store = MatrixStore(tmp_path / "state")
    host, host_id = _sleeper()
    agent, agent_id = _sleeper()
    try:
        store.register(
            make_entry(
                "d11", identity=make_identity("d11", mode=Mode.RPC), process=host_id,
                child_pid=agent_id.pid, child_proc_start=agent_id.start_ticks,
            )
        )  # fmt: skip
        full = full_disk(tmp_path)
        sent = _cli(store.root, "send", "worker-d11", "--prompt", "x", env=full)
        _one_error_line(sent, "worker-d11", "nothing was sent")
        stopped = _cli(store.root, "stop", "worker-d11", "--confirm", "yes-tmux-stop", env=full)
        _one_error_line(stopped, "worker-d11", "nothing was sent")
        mailbox = store.root / "mailbox" / "worker-d11"
        assert not mailbox.exists() or list(mailbox.iterdir()) == []
        # The same send with room on the disk: the failure was the disk's, nothing else's.
        assert _cli(store.root, "send", "worker-d11", "--prompt", "x", env=dict(os.environ)).returncode == 0
    finally:
        _end(host, agent)


def test_11_stop_job_on_a_full_disk_still_stops_its_agents_and_says_what_was_not_written(
    sublab: Lab,
) -> None:
    """``stop JOB`` on a full disk: neither the ``stopped`` result nor the stop message can be
    written, yet the owner asked for the agents to stop, and signals need no disk: each host is
    stopped (SIGTERM, which it forwards to its agent), then one line says what was not written,
    exit 1."""
    sublab.start_master()
    fired = sublab.fire("HANG long work", backend="subprocess")
    (agent,) = fired.job.agents
    entry = sublab.worker(agent.key)
    assert entry.process is not None and entry.child_process is not None
    started = time.monotonic()
    done = _cli(sublab.state, "stop", fired.job.id, "--confirm", "yes-tmux-stop", env=full_disk(sublab.tmp))
    _one_error_line(done, "results", fired.job.id)
    assert procs.wait_for_exit(entry.process, 10), "the job's host was left running"
    assert not procs.is_alive(entry.child_process), "the job's agent was left running"
    # No stop message was queued, so nothing waited the host's own stop sequence out (15 s).
    assert time.monotonic() - started < 12


def test_11_a_deadline_whose_timeout_result_cannot_be_written_still_stops_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's result write (here the deadline's ``timeout``) hits a full disk: the agent is
    stopped all the same (the deadline is the owner's limit; it used to end the watcher with the
    agent left running), and the failure is raised for the round thread to report."""
    store = MatrixStore(tmp_path / "state")
    job = plant_job(store, "job-20261206-010000-a1b2c3", tmp_path)
    (agent,) = job.agents
    passed = attrs.evolve(agent, deadline_at=now_ms() - 1)  # the round's deadline passed
    job = JobStore(store).update(job.id, lambda j: attrs.evolve(j, agents=(passed,)))

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, ENOSPC_LINE)

    monkeypatch.setattr(JobStore, "put_result", full)  # our seam: the one result write
    stopped: list[str] = []
    with in_host(lambda: stopped.append("deadline")) as host:
        watcher = Watcher(store, job, job.agents[0], 1, host)
        with pytest.raises(OSError, match="No space left"):
            watcher.run()
    assert stopped == ["deadline"], "the agent outlived its deadline"


def test_11_a_host_whose_event_appends_fail_supervises_stops_and_records_its_agent(tmp_path: Path) -> None:
    """A host with room for its entry and none for its event lines (ENOSPC on every append): the
    event log is best effort, the entry is the truth. The host registers, runs its agent, takes
    a ``stop`` and records the agent killed (it used to die on the first event line, leaving
    its entry ``running`` with a dead pid)."""
    state = tmp_path / "state"
    store = MatrixStore(state)
    err = tmp_path / "host.err"
    with open(err, "wb") as sink:
        host = subprocess.Popen(
            [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), "host",
             "--session-id", "e11", "--mode", "print", "--", "sleep", "60"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True,
            env=full_disk(tmp_path, "events"),
        )  # fmt: skip
    try:
        running = wait_for(
            "the host's agent", lambda: e if (e := store.find("master-e11")) and e.child_pid else None
        )
        assert running.status is Status.RUNNING and host.poll() is None
        stop = _cli(state, "stop", "master-e11", "--confirm", "yes-tmux-stop", env=dict(os.environ))
        assert stop.returncode == 0, stop.stderr
        host.wait(30)
        ended = store.get("master-e11")
        assert ended.exit is not None and ended.exit.kind is ExitKind.KILLED, ended
        assert not procs.is_alive(running.child_process)
        assert read_events(state, "master-e11") == []  # not one line was written
        text = err.read_text()
        assert "not recorded" in text and ENOSPC_LINE in text and "Traceback" not in text, text
    finally:
        _end(host)
        for entry in store.list().entries:
            if entry.child_process is not None:
                procs.send_signal(entry.child_process, signal.SIGKILL)
