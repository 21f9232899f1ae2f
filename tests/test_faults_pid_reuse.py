"""Pid reuse and identity (issue 17, cases 1, 2 and 4): a process is known by its pid and its start
ticks, a host by its registration, never by a pid alone.

Nothing pi-matrix signals reaches the process that reused a dead one's pid: not a dead group
leader's stop, the host's stop sequence for its agent, ``stop KEY``, ``stop JOB``, a fork run's
stale reap or abort, nor ``fork --wait``'s final stop. A worker never takes the new owner of its
parent's pid for its parent, and a stop posted to a host that died is never taken by the next host
of its key. The reuse is forced (``seams.spawn_on_pid``, through ns_last_pid): those tests need
root and skip without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cli_at
from helpers import end_popens as _end
from seams import spawn_on_pid
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms


# --- case 1: a dead process's pid, reused, is never signalled ----------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="forcing a pid's reuse needs root (ns_last_pid)")
def test_1_a_dead_leaders_reused_pid_is_never_signalled() -> None:
    leader_proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    leader = procs.identify(leader_proc.pid)
    assert leader is not None
    leader_proc.kill()
    leader_proc.wait()
    # A later clock tick: identity is pid + start ticks, and two starts within one tick on one pid
    # cannot be told apart by anyone (the kernel's wrap of the pid space takes far longer).
    time.sleep(0.05)
    stranger = spawn_on_pid(leader.pid)
    if stranger is None:
        pytest.skip("the pid was taken by another process each time")
    try:
        assert procs.group_members(leader) == []
        assert procs.stop_group(leader, grace_s=0.5) is True
        assert stranger.poll() is None, "the process that reused the dead leader's pid was signalled"
    finally:
        stranger.kill()
        stranger.wait()


# --- pid reuse on every signalling path (issue 17: "a test forces pid reuse for each") ----------
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="forcing a pid's reuse needs root (ns_last_pid)")


def _take_pid_of(dead: procs.ProcessIdentity) -> subprocess.Popen[bytes]:
    """A sleeper of the test's own on ``dead``'s pid (``dead`` ended and was reaped). It leads its
    own group and session, so a group signal to the pid would reach it too. Skips when another
    process keeps taking the pid."""
    assert not procs.is_alive(dead)
    # A later clock tick: identity is pid + start ticks (see test_1).
    time.sleep(0.05)
    stranger = spawn_on_pid(dead.pid)
    if stranger is None:
        pytest.skip("the pid was taken by another process each time")
    return stranger


def _dead_process() -> procs.ProcessIdentity:
    """The identity of a real process (its own group and session, like a pane's or a host's) that
    has ended and been reaped: its pid is free for the next process."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    ident = procs.identify(proc.pid)
    assert ident is not None
    proc.kill()
    proc.wait()
    return ident


@ROOT_ONLY
@pytest.mark.parametrize("mode", ["print", "interactive"])
def test_1_the_hosts_stop_sequence_never_signals_what_reused_its_agents_pid(
    tmp_path: Path, mode: str
) -> None:
    """The host stops its agent by identity (a print agent with its group): once the agent ended and
    was reaped, a forwarded signal and every step of the stop sequence miss the pid's new owner.
    (In the host the child is reaped only as its end is recorded; this drives the same steps.)"""
    import io

    from helpers import read_events

    from pi_tmux_matrix.identity import Mode
    from pi_tmux_matrix.matrix.model import ExitKind
    from pi_tmux_matrix.matrix.store import MatrixStore
    from pi_tmux_matrix.supervise.child import AgentChild
    from pi_tmux_matrix.supervise.record import OwnRecord

    store = MatrixStore(tmp_path / "state")
    agent = AgentChild(
        OwnRecord(store, "worker-h1"), mode=Mode(mode), is_pi=False, stop_grace_s=0.0, out=io.StringIO()
    )
    child = agent.start(("sleep", "60"), cwd=None, env=dict(os.environ))
    dead = agent.identity
    assert dead is not None
    child.kill()
    child.wait()
    stranger = _take_pid_of(dead)
    try:
        agent.forward(signal.SIGTERM)
        agent.request_stop(ExitKind.KILLED, "stop")
        agent.run_stop_steps()  # no grace: SIGTERM and SIGKILL are both due
        assert [e["signal"] for e in read_events(store.root, "worker-h1", "stop_signal")] == [
            signal.SIGTERM, signal.SIGKILL,
        ]  # fmt: skip
        time.sleep(0.1)
        assert stranger.poll() is None, "the process that reused the agent's pid was signalled"
    finally:
        _end(stranger)


@ROOT_ONLY
def test_1_stop_key_names_a_dead_host_and_never_reaches_its_pids_new_owner(tmp_path: Path) -> None:
    """``stop KEY --confirm yes-tmux-stop`` for an entry whose host died and whose pid is someone
    else's now: the host is reported gone (exit 1), nothing is queued, nothing is signalled."""
    from helpers import make_entry

    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    host = _dead_process()
    store.register(make_entry("h2", process=host))
    stranger = _take_pid_of(host)
    try:
        done = cli_at(store.root, "stop", "worker-h2", "--confirm", "yes-tmux-stop")
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"its host (pid {host.pid}) is not alive" in done.stderr and "Traceback" not in done.stderr
        mailbox = store.root / "mailbox" / "worker-h2"
        assert not mailbox.exists() or list(mailbox.iterdir()) == []
        time.sleep(0.1)
        assert stranger.poll() is None, "the process that reused the host's pid was signalled"
    finally:
        _end(stranger)


@ROOT_ONLY
def test_1_stop_job_never_signals_what_reused_a_dead_hosts_pid(tmp_path: Path) -> None:
    """``stop JOB --confirm yes-tmux-stop`` (and the deadline watcher, through the same
    ``stop_agents``) signals each host by identity, the job's record of it or the matrix entry of
    its key: a host that died and whose pid was reused is simply gone; the job is stopped and the
    pid's new owner keeps running."""
    from helpers import job_on_host, make_entry

    from pi_tmux_matrix.dispatch.model import ResultKind
    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    host = _dead_process()
    store.register(make_entry("j1", process=host))  # what the matrix knows of the key: the same host
    job = job_on_host(store, tmp_path, host, "j1")
    jobs = JobStore(store)
    stranger = _take_pid_of(host)
    try:
        done = cli_at(store.root, "stop", job.id, "--confirm", "yes-tmux-stop")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"stopped job {job.id} (1 agent(s) had not finished)" in done.stdout
        result = jobs.result(job.id, "a1", 1)
        assert result is not None and result.kind is ResultKind.STOPPED
        assert jobs.get(job.id).stopped_at is not None
        time.sleep(0.1)
        assert stranger.poll() is None, "the process that reused the host's pid was signalled"
    finally:
        _end(stranger)


@ROOT_ONLY
@pytest.mark.parametrize("path", ["stale_reap", "abort", "gone_before_reap"])
def test_1_a_fork_run_stopped_after_its_process_died_never_signals_the_pids_new_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The fork's stale reap ("no update for 30 minutes") and abort both decide on a run that
    still runs, then stop its process group: the process dying and its pid being reused in
    between (forced right after the real refresh, our own seam) must not make the stop reach the
    pid's new owner. A run whose process is already gone is only recorded ended."""
    from pi_tmux_matrix.fork import wait
    from pi_tmux_matrix.fork.model import ForkRun, RunMode, RunStatus
    from pi_tmux_matrix.fork.store import RunStore
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

    runs = RunStore(MatrixStore(tmp_path / "state"))
    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a pane's process leads both
    alive = procs.identify(leader.pid)
    assert alive is not None
    old = now_ms() - 31 * 60 * 1000
    run = ForkRun(
        id="run-20260101-000000-abcdef", cwd=str(tmp_path), task="t", mode=RunMode.BACKGROUND,
        created_at_ms=old, updated_at_ms=old if path == "stale_reap" else now_ms(), process=alive,
    )  # fmt: skip
    runs.put(run, exclusive=True)
    strangers: list[subprocess.Popen[bytes]] = []
    real_refresh = wait.refresh

    def refresh_then_die(store: RunStore, run_id: str, *, settle: bool = False) -> ForkRun:
        decided = real_refresh(store, run_id, settle=settle)
        if not strangers:
            leader.kill()
            leader.wait()
            strangers.append(_take_pid_of(alive))
        return decided

    if path != "gone_before_reap":
        monkeypatch.setattr(wait, "refresh", refresh_then_die)
    else:
        leader.kill()
        leader.wait()
        strangers.append(_take_pid_of(alive))
    try:
        if path == "gone_before_reap":
            (ended,) = wait.reap(runs)
            assert ended.error is not None and ended.error != wait.STALE_ERROR  # ended, not stale
        elif path == "stale_reap":
            (ended,) = wait.reap(runs)
            assert ended.error == wait.STALE_ERROR
        else:
            ended = wait.abort_run(runs, run.id, "parent_aborted")
            assert ended.error == "parent_aborted"
        assert ended.status is RunStatus.FAILED and runs.get(run.id) == ended
        time.sleep(0.1)
        assert strangers[0].poll() is None, "the process that reused the run's pid was signalled"
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
        for stranger in strangers:
            _end(stranger)


@pytest.mark.skipif(os.geteuid() != 0, reason="forcing a pid's reuse needs root (ns_last_pid)")
def test_1_the_fork_waiters_final_stop_never_signals_what_reused_its_panes_pid(tmp_path: Path) -> None:
    """``fork --wait`` (``wait_run``) sees its run running, then the pane's process dies and its
    pid is reused before the next look: the waiter records the run's end and makes its own final
    stop of the run's processes (``close_pane``), which must find nobody to signal (its
    ``on_poll`` callback, our own, is where the death and the reuse are made to happen)."""
    from seams import spawn_on_pid

    from pi_tmux_matrix.fork import wait
    from pi_tmux_matrix.fork.model import ForkRun, RunMode, RunStatus
    from pi_tmux_matrix.fork.store import RunStore

    store = MatrixStore(tmp_path / "state")
    runs = RunStore(store)
    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a pane's process leads both
    alive = procs.identify(leader.pid)
    assert alive is not None
    run = ForkRun(
        id="run-20260101-000000-fedcba", cwd=str(tmp_path), task="t", mode=RunMode.WAIT,
        created_at_ms=now_ms(), updated_at_ms=now_ms(), process=alive,
    )  # fmt: skip
    runs.put(run, exclusive=True)
    strangers: list[subprocess.Popen[bytes]] = []

    def die_and_be_reused(_run: ForkRun, _waited: float) -> None:
        if strangers or leader.poll() is not None:
            return
        leader.kill()
        leader.wait()
        time.sleep(0.05)  # a later clock tick: identity is pid + start ticks (see test_1)
        stranger = spawn_on_pid(alive.pid)
        if stranger is None:
            pytest.skip("the pid was taken by another process each time")
        strangers.append(stranger)

    try:
        ended = wait.wait_run(store, run.id, close_pane=True, poll_s=0.05, on_poll=die_and_be_reused)
        assert strangers, "the waiter never saw the run running"
        assert ended.status is not RunStatus.RUNNING and runs.get(run.id) == ended
        time.sleep(0.1)
        assert strangers[0].poll() is None, "the process that reused the pane's pid was signalled"
    finally:
        _end(leader, *strangers)


# --- case 2: a parent is its pid and its start ticks -------------------------------------------
def test_2_a_worker_never_takes_the_new_owner_of_its_parents_pid_for_its_parent(tmp_path: Path) -> None:
    """The parent's start ticks travel with its pid (``PI_PARENT_START``): a host whose parent pid
    is held by a process with another start time knows its parent is gone and winds down (it used
    to re-read whatever held the pid and stay ``running``)."""
    from pi_tmux_matrix.matrix.store import MatrixStore

    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    state = tmp_path / "state"
    host: subprocess.Popen[bytes] | None = None
    try:
        ident = procs.identify(stranger.pid)
        assert ident is not None
        env = {
            **os.environ, "PI_MATRIX_STATE_DIR": str(state), "PI_PARENT_PID": str(stranger.pid),
            "PI_PARENT_START": str(ident.start_ticks + 1), "PI_PARENT_SESSION": "gone",
        }  # fmt: skip
        host = subprocess.Popen(
            [sys.executable, "-m", "pi_tmux_matrix", "host", "--session-id", "w2", "--mode", "print",
             "--", "sleep", "30"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        store = MatrixStore(state)
        entry = wait_for(
            "the worker to see its parent gone",
            lambda: e if (e := store.find("worker-w2")) and e.reason == "parent_lost" else None,
        )
        assert entry.parent_pid == stranger.pid and entry.parent_proc_start == ident.start_ticks + 1
    finally:
        for proc in (host, stranger):
            if proc is not None:
                proc.kill()
                proc.wait()
        for entry in MatrixStore(state).list().entries if state.exists() else ():
            for leftover in (entry.process, entry.child_process):
                if leftover is not None:
                    procs.send_signal(leftover, 9)


# --- case 4: a stop is for the host it was posted to --------------------------------------------
def _host(state: Path, session: str, *agent: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), "host",
         "--session-id", session, "--mode", "print", "--", *agent],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def test_4_a_stop_posted_to_a_host_that_died_is_not_taken_by_the_next_host_of_the_key(tmp_path: Path) -> None:
    from helpers import read_events

    from pi_tmux_matrix.matrix.mailbox import Inbox
    from pi_tmux_matrix.matrix.store import MatrixStore

    state = tmp_path / "state"
    store = MatrixStore(state)
    first = _host(state, "k4", "sleep", "60")
    second: subprocess.Popen[bytes] | None = None
    try:
        old = wait_for(
            "the first host", lambda: e if (e := store.find("master-k4")) and e.child_pid else None
        )
        assert old.process is not None and old.child_process is not None
        for ident in (old.process, old.child_process):
            procs.send_signal(ident, 9)
            procs.wait_for_exit(ident, 5)
        first.wait()
        # A stop meant for the dead host, still in the mailbox when the next host of the key starts.
        Inbox(store, "master-k4").post("stop", sender="test", to=old.registration)
        second = _host(state, "k4", "sleep", "60")
        new = wait_for(
            "the second host's agent",
            lambda: e if (e := store.find("master-k4")) and e.pid == second.pid and e.child_pid else None,
        )
        wait_for("the stale stop dropped", lambda: read_events(state, "master-k4", "message_dropped"))
        assert second.poll() is None and procs.is_alive(new.child_process), "the stale stop stopped it"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for entry in store.list().entries:
            if entry.child_process is not None:
                procs.send_signal(entry.child_process, 9)
