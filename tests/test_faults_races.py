"""Races between processes (issue 17, cases 3, 5 and 6): two launchers, two hosts, two readers, a
fire and its late host; whoever loses, nothing runs twice and nothing runs unseen.

Two activations relaunching one dead worker start one agent (the claim comes first; the loser
names the winner). Readers racing for one mailbox take each message once, and a superseded host
takes no mail at all. A fire that a stalled tmux server made give up leaves nothing running unseen
(a host that comes late starts nothing; one that took its ticket in time is adopted, tagged and
watched), and ``stop JOB`` reaches the host the matrix knows for the key, and fails, naming it,
when that host survives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from helpers import end_popens as _end
from helpers import job_on_host, make_entry, read_events, spawn_registered_parent
from labs import Lab
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.matrix.mailbox import Inbox
from pi_tmux_matrix.matrix.model import Entry, ExitKind
from pi_tmux_matrix.matrix.store import MatrixStore


# --- case 3: two relaunches of one worker ------------------------------------------------------
def test_3_two_activations_relaunching_one_dead_worker_start_one_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim before start: two masters that read the same resumable entry both try to relaunch it;
    the first claim (CAS on the generation both saw) wins and starts one agent, the second is
    refused before it starts anything (the detached relauncher used to start first and swallow
    the conflict: two pi on one session file)."""
    from argparse import Namespace

    from helpers import dead_identity, make_entry, make_identity
    from labs import STANDIN

    from pi_tmux_matrix.cli.master import _relauncher
    from pi_tmux_matrix.errors import ResumeRefused
    from pi_tmux_matrix.matrix.model import ResumablePayload, Status
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

    monkeypatch.setenv("PI_MATRIX_PI_COMMAND", json.dumps(STANDIN))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "agent"))
    store = MatrixStore(tmp_path / "state")
    session = tmp_path / "sessions" / "w3.jsonl"
    session.parent.mkdir()
    session.write_text(json.dumps({"type": "session", "version": 3, "id": "w3", "cwd": str(tmp_path)}) + "\n")
    identity = make_identity("w3", session_file=str(session), cwd=str(tmp_path), provider="pi")
    payload = ResumablePayload(identity=identity, reason="parent_lost", at=now_ms(), task_ref="goal-1")
    dead = make_entry(
        "w3", status=Status.RESUMABLE, identity=identity, process=dead_identity(), reason="parent_lost",
        resumable=payload, task_ref="goal-1",
    )  # fmt: skip
    store.register(dead)
    seen = store.get("worker-w3")  # what both activations read
    relaunch = _relauncher(Namespace(relaunch="detached", socket=None), store)
    me = procs.current()
    first = relaunch(seen, me, "boss")
    host = procs.identify(first)
    try:
        with pytest.raises(ResumeRefused, match="changed since it was read") as refused:
            relaunch(seen, me, "boss")
        # The loser says who won: the entry as the winner left it, with the winner's host.
        assert "another launcher won (it is " in str(refused.value), refused.value
        assert f"host pid {first}" in str(refused.value), refused.value
        assert "nothing was started here" in str(refused.value)
        assert store.get("worker-w3").status is not Status.RESUMABLE  # claimed once, by the first
    finally:
        if host is not None and not procs.wait_for_exit(host, 30):
            procs.send_signal(host, 9)


# --- case 5: two hosts, one mailbox -------------------------------------------------------------
def test_5_readers_racing_for_one_mailbox_take_each_message_once_and_never_fail(tmp_path: Path) -> None:
    """A superseded host and its successor both draining the key's mailbox: a message that
    vanishes under a reader (the other took it) is skipped, never an error, never handled twice."""
    import threading

    from pi_tmux_matrix.matrix.mailbox import Inbox
    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    inbox = Inbox(store, "worker-w5")
    taken: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set() or any(p.suffix == ".json" for p in inbox.path.iterdir()):
                taken.extend(m.text for m in inbox.take())
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    for i in range(20):
        inbox.post("steer", f"warm-{i}", sender="test")
    readers = [threading.Thread(target=reader) for _ in range(4)]
    for thread in readers:
        thread.start()
    for i in range(400):
        inbox.post("steer", str(i), sender="test")
    done.set()
    for thread in readers:
        thread.join(30)
    assert not failures, failures
    assert sorted(taken) == sorted([f"warm-{i}" for i in range(20)] + [str(i) for i in range(400)])


def test_5_a_superseded_host_takes_no_mail_and_its_successor_takes_only_its_own(tmp_path: Path) -> None:
    """Two hosts of one worker session: the second registration supersedes the first, which
    lives on with its agent. From then on the first host takes nothing from the key's mailbox,
    not even a message addressed to its own generation (a stale one: the new host drops it),
    and a message addressed to the new generation is the new host's alone."""
    state = tmp_path / "state"
    store = MatrixStore(state)
    parent = spawn_registered_parent(state, "boss5")
    parent_id = procs.identify(parent.pid)
    assert parent_id is not None
    env = {
        **os.environ, "PI_MATRIX_STATE_DIR": str(state), "PI_PARENT_PID": str(parent.pid),
        "PI_PARENT_START": str(parent_id.start_ticks), "PI_PARENT_SESSION": "boss5",
    }  # fmt: skip

    def host() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "pi_tmux_matrix", "host", "--session-id", "w5", "--mode", "print",
             "--", "sleep", "60"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

    def registered(proc: subprocess.Popen[bytes]) -> Callable[[], Entry | None]:
        return lambda: e if (e := store.find("worker-w5")) and e.pid == proc.pid and e.child_pid else None

    first = host()
    second: subprocess.Popen[bytes] | None = None
    agents: list[procs.ProcessIdentity] = []
    try:
        old = wait_for("the first host's agent", registered(first))
        assert old.child_process is not None
        agents.append(old.child_process)
        second = host()
        new = wait_for("the second host's agent", registered(second))
        assert new.child_process is not None
        agents.append(new.child_process)
        assert old.registration != new.registration
        inbox = Inbox(store, "worker-w5")
        held = procs.identify(second.pid)
        assert held is not None

        def unread_while_the_new_host_is_held(to: str) -> None:
            """Post with the new host stopped (SIGSTOP): the old host alone could take it, and
            leaves it where it is; then the new host runs on."""
            procs.send_signal(held, signal.SIGSTOP)
            try:
                inbox.post("stop", sender="test", to=to)
                time.sleep(1.0)  # the old host's inotify wake-up and a watcher tick
                assert len(list(inbox.path.glob("*.json"))) == 1, "the superseded host took mail"
            finally:
                procs.send_signal(held, signal.SIGCONT)

        # Addressed to the old generation: the old host would act on it if it still read mail;
        # the new host drops it.
        unread_while_the_new_host_is_held(old.registration)
        dropped = wait_for(
            "the stale stop dropped", lambda: read_events(state, "worker-w5", "message_dropped")
        )
        assert [d["to"] for d in dropped] == [old.registration]
        assert first.poll() is None and procs.is_alive(old.child_process)
        assert second.poll() is None and procs.is_alive(new.child_process)

        # Addressed to the new generation: the new host's alone, and it stops its agent.
        unread_while_the_new_host_is_held(new.registration)
        second.wait(30)
        ended = store.get("worker-w5")
        assert ended.registration == new.registration and ended.exit is not None
        assert ended.exit.kind is ExitKind.KILLED
        assert not procs.is_alive(new.child_process)
        assert first.poll() is None and procs.is_alive(old.child_process), "the stop reached the old host"
        assert list(inbox.path.iterdir()) == []
    finally:
        _end(first, second, parent)
        for agent in agents:
            procs.send_signal(agent, signal.SIGKILL)


# --- case 6: a stalled tmux server --------------------------------------------------------------
def _tmux(socket: str, *words: str) -> str:
    argv = ["tmux", "-L", socket, *words]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def _workers(at: Lab) -> list[object]:
    return [e for e in at.store.list().entries if e.key.startswith("worker-")]


def _slow_tmux(at: Lab, hook: str, *, slow_python: bool = False) -> Dispatcher:
    """A tmux server on the lab's socket whose every new window runs ``hook`` before tmux answers
    (the window exists, the client waits: a stalled server as the launcher sees it), and a
    dispatcher that gives tmux 1.5 s. With ``slow_python`` every Python in its panes (the host)
    takes 4 s to start (a ``sitecustomize`` on the server's ``PYTHONPATH``); a SIGSTOP would not
    do, tmux continues a stopped pane process."""
    from pi_tmux_matrix.dispatch.backends import TmuxBackend

    env = dict(os.environ)
    slowed: dict[str, str] = {}
    if slow_python:
        slow = at.tmp / "slow-python"
        slow.mkdir()
        (slow / "sitecustomize.py").write_text("import time\ntime.sleep(4)\n")
        # First on the path, for the server and for the dispatcher too: a launch passes the
        # dispatcher's own PYTHONPATH to its pane (contract.PASS_ENV), so a caller's PYTHONPATH
        # would otherwise replace the server's and the host would start at full speed.
        slowed["PYTHONPATH"] = os.pathsep.join(p for p in (str(slow), env.get("PYTHONPATH")) if p)
        env.update(slowed)
    subprocess.run(
        ["tmux", "-L", at.socket, "new-session", "-d", "-s", "pi-matrix", "sleep", "600"],
        env=env, check=True, timeout=10,
    )  # fmt: skip
    _tmux(at.socket, "set-hook", "-g", "after-new-window", f"run-shell '{hook}'")
    dispatcher = at.dispatcher(**slowed)
    dispatcher.backends["tmux"] = TmuxBackend(timeout=1.5)
    return dispatcher


def _request(at: Lab) -> FireRequest:
    assert at.master is not None
    return FireRequest(
        task="HANG long work", profile="stand-in", path=str(at.work), socket=at.socket,
        parent_pid=at.master.pid, parent_session=at.master.identity.session_id,
    )  # fmt: skip


def test_6_a_pane_made_after_the_fire_gave_up_starts_nothing(lab: Lab) -> None:
    """``new-window`` does not answer in time (its host is slow to start and has not taken its ticket);
    the fire fails and takes the launch's ticket. When the host runs on it finds the ticket
    abandoned and starts nothing (it used to run the agent with no tags, watcher or deadline)."""
    from pi_tmux_matrix.errors import DispatchError

    lab.start_master()
    dispatcher = _slow_tmux(lab, "sleep 3", slow_python=True)
    with pytest.raises(DispatchError, match="did not answer") as failed:
        dispatcher.fire(_request(lab))
    assert "nothing runs for it" in str(failed.value)
    rows = _tmux(lab.socket, "list-panes", "-a", "-F", "#{pane_pid} #{pane_start_command}").splitlines()
    (late,) = [int(row.split()[0]) for row in rows if " host " in row]
    held = procs.identify(late)
    assert held is not None
    lab.started.append(held)
    assert procs.wait_for_exit(held, 30), "the late host did not give up"
    tickets = list((lab.state / "launches").iterdir())
    assert len(tickets) == 1 and tickets[0].read_text().startswith("abandoned ")
    assert _workers(lab) == [], "a host started an agent for a launch its fire gave up on"


def test_6_a_host_that_took_its_ticket_before_the_fire_gave_up_is_adopted_tagged_and_watched(
    lab: Lab,
) -> None:
    """The other order: tmux made the pane and its host took the ticket, but tmux answered too late.
    The fire finds the pane by the host's pid, tags it and goes on (a job with its agent)."""
    lab.start_master()
    dispatcher = _slow_tmux(lab, "sleep 4")
    fired = dispatcher.fire(_request(lab))
    (agent,) = fired.job.agents
    assert agent.pane_id is not None and agent.host is not None
    lab.started.append(agent.host)
    entry = lab.worker(agent.key)
    assert entry.pid == agent.host_pid
    tags = _tmux(lab.socket, "show-options", "-p", "-t", agent.pane_id)
    assert agent.key in tags and fired.job.id in tags


# --- case 6: a stop that leaves a live agent is a failure ----------------------------------------
def test_6_stop_of_a_job_reaches_the_live_host_the_matrix_knows_and_fails_if_it_survives(sublab: Lab) -> None:
    """A job whose record lacks the host the matrix has registered for its key (a launch recorded as
    failed, or an agent resumed after a crash): ``stop JOB`` stops that host; it used to print
    ``stopped job`` while ``ls`` showed the worker running."""
    sublab.start_master()
    fired = sublab.fire("HANG long work", backend="subprocess")
    (agent,) = fired.job.agents
    entry = sublab.worker(agent.key)
    jobs = JobStore(sublab.store)
    jobs.update(
        fired.job.id,
        lambda j: attrs.evolve(j, agents=tuple(attrs.evolve(a, host_pid=None) for a in j.agents)),
    )
    stopped = sublab.cli("stop", fired.job.id, "--confirm", "yes-tmux-stop")
    assert stopped.returncode == 0, stopped.stderr
    assert procs.wait_for_exit(entry.process, 15), "the live host the matrix knows was not stopped"  # type: ignore[arg-type]


NOBODY = 65534


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="a host the stopping process may not signal needs root (another user's process, CAP_KILL dropped)",
)
def test_6_stop_job_reports_a_host_it_could_not_stop_by_name_and_exits_1(tmp_path: Path) -> None:
    """``stop JOB --confirm yes-tmux-stop`` from a process that may not signal the job's host (it
    belongs to another user, and the stop runs without CAP_KILL: every signal is refused with
    EPERM): the stop request, SIGTERM and SIGKILL all leave it running, and the stop says so,
    naming the survivor, exit 1 (a refused signal used to end the stop with a bare
    ``[Errno 1] Operation not permitted``, the job not marked stopped)."""
    from pi_tmux_matrix.dispatch.model import ResultKind

    host = subprocess.Popen(
        ["sleep", "60"], start_new_session=True, user=NOBODY, group=NOBODY, extra_groups=[]
    )  # another user's process: only CAP_KILL could signal it
    try:
        host_id = procs.identify(host.pid)
        assert host_id is not None
        store = MatrixStore(tmp_path / "state")
        store.register(make_entry("s6", process=host_id))
        job = job_on_host(store, tmp_path, host_id, "s6")
        jobs = JobStore(store)
        done = subprocess.run(
            ["setpriv", "--bounding-set=-kill", "--inh-caps=-kill", "--", sys.executable, "-m",
             "pi_tmux_matrix", "--state-dir", str(store.root), "stop", job.id, "--confirm", "yes-tmux-stop"],
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert f"still running after SIGKILL: a1 (host pid {host_id.pid})" in last, done.stderr
        assert host.poll() is None
        # Everything else the stop does was done: the result, the job marked stopped.
        result = jobs.result(job.id, "a1", 1)
        assert result is not None and result.kind is ResultKind.STOPPED
        assert jobs.get(job.id).stopped_at is not None
    finally:
        _end(host)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="a process the stopper may not signal needs root (another user's process, CAP_KILL dropped)",
)
def test_6_a_stop_whose_signals_are_refused_does_not_wait_out_their_grace() -> None:
    """``procs.stop`` waits for a process to leave only once a signal reached it: another user's,
    refused with EPERM, is reported still alive at once, not after the SIGTERM grace and the
    SIGKILL wait (30 s here; ``stop JOB`` waited 5 s more for such a host)."""
    host = subprocess.Popen(
        ["sleep", "300"], start_new_session=True, user=NOBODY, group=NOBODY, extra_groups=[]
    )  # another user's process: only CAP_KILL could signal it; it outlives both waits
    try:
        target = procs.identify(host.pid)
        assert target is not None
        probe = (
            "import json, sys, time; from pi_tmux_matrix import procs; "
            f"t = procs.ProcessIdentity({target.pid}, {target.start_ticks}, {target.boot_id!r}); "
            "began = time.monotonic(); left = procs.stop([t], 30.0, kill_wait_s=30.0); "
            "print(json.dumps([len(left), time.monotonic() - began]))"
        )
        done = subprocess.run(
            ["setpriv", "--bounding-set=-kill", "--inh-caps=-kill", "--", sys.executable, "-c", probe],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        left, took = json.loads(done.stdout)
        assert left == 1 and host.poll() is None
        assert took < 20, f"waited {took:.1f} s for a process no signal reached"  # it took 60 s
    finally:
        _end(host)
