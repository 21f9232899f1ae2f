"""Issue 17, continued (tests/test_faults.py holds one test per case): a full disk reaching the CLI,
the host and the watcher; a stop that leaves a survivor; a superseded host and its mail; the
``fork --wait`` waiter's own final stop under pid reuse.

A full disk is forced at our own write seams only (``fsio._write_all``: entries and records, the
results among them; ``mailbox._write_all``: the mailbox; ``mailbox._append``: the event log and
the agent's notices), in the process under test, through a ``sitecustomize`` on its
``PYTHONPATH``: every other process (the host a stop reaches, the test) writes as usual.
"""

from __future__ import annotations

import errno
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
from helpers import (
    in_host,
    job_on_host,
    make_entry,
    make_identity,
    plant_job,
    read_events,
    spawn_registered_parent,
)
from labs import Lab
from seams import ENOSPC_LINE, full_disk
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.watch import Watcher
from pi_tmux_matrix.identity import Mode
from pi_tmux_matrix.matrix.mailbox import Inbox
from pi_tmux_matrix.matrix.model import Entry, ExitKind, Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms


def _cli(state: Path, *words: str, env: dict[str, str], **popen: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), *words],
        capture_output=True, text=True, env=env, timeout=90, check=False, **popen,  # type: ignore[arg-type]
    )  # fmt: skip


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


def _end(*procs_: subprocess.Popen[bytes] | None) -> None:
    for proc in procs_:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


# --- case 11: a full disk ------------------------------------------------------------------------
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


# --- case 6: a stop that leaves a live agent is a failure ----------------------------------------
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


# --- case 5: a superseded host reads no mail -----------------------------------------------------
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


# --- case 1: fork --wait's own final stop under pid reuse ----------------------------------------
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
        time.sleep(0.05)  # a later clock tick: identity is pid + start ticks (see test_faults)
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


# --- case 13: a deeply nested profile, on the launch paths ---------------------------------------
def test_13_a_deeply_nested_profile_is_a_clear_error_from_fire_and_resume_too(tmp_path: Path) -> None:
    """``fire --profile`` and ``resume`` (dry run and real) read the profiles as ``profiles`` does:
    a hostile nesting is exit 2 naming the file, never a ``RecursionError``, and nothing starts."""
    from helpers import dead_identity

    from pi_tmux_matrix.matrix.model import ResumablePayload

    agent = Path(os.environ["PI_CODING_AGENT_DIR"])
    (agent / "launch_profiles").mkdir(parents=True)
    (agent / "launch_profiles" / "deep.toml").write_text(
        '[profile]\nname = "deep"\nprovider = "pi"\ncommand = ["pi"]\nx = ' + "[" * 5000 + "]" * 5000 + "\n"
    )
    store = MatrixStore(tmp_path / "state")
    session_file = str(tmp_path / "d13.jsonl")
    identity = make_identity("d13", cwd=str(tmp_path), profile="deep", session_file=session_file)
    payload = ResumablePayload(identity=identity, reason="parent_lost", at=now_ms())
    dead = dead_identity()
    store.register(
        make_entry("d13", status=Status.RESUMABLE, identity=identity, process=dead, resumable=payload)
    )
    master = spawn_registered_parent(store.root, "boss")
    try:
        parent = ("--parent-pid", str(master.pid), "--parent-session", "boss")
        for words in (
            ("fire", "--profile", "deep", "--backend", "subprocess", *parent, "--", "HANG"),
            ("fire", "--profile", "deep", "--dry-run", *parent, "--", "HANG"),
            ("resume", "worker-d13", "--dry-run", *parent),
            ("resume", "worker-d13", "--backend", "subprocess", *parent),
        ):
            done = _cli(store.root, *words, env=dict(os.environ), cwd=tmp_path)
            assert done.returncode == 2, (words, done.stdout, done.stderr)
            assert "deep.toml" in done.stderr and "nested too deeply" in done.stderr, (words, done.stderr)
            assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr
        assert store.get("worker-d13").status is Status.RESUMABLE  # nothing claimed, nothing started
        assert not (store.root / "jobs").exists() or not list((store.root / "jobs").glob("job-*.json"))
    finally:
        _end(master)


# --- case 15: worker text shown escaped, in repair and in a bash master's handoff line -----------
HOSTILE = "\x1b]0;PWNED\x07\x1b[2K"
SHOWN = "^[]0;PWNED^G^[[2K"


def test_15_repair_dry_run_shows_a_hostile_file_name_escaped(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    store.register(make_entry("ok15"))  # makes the state dir as the product does (mode 0700)
    (store.root / f"worker-{HOSTILE}.json").write_text("not json")
    done = _cli(store.root, "repair", "--dry-run", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    assert f"would quarantine {store.root}/worker-{SHOWN}.json: " in done.stdout, done.stdout
    assert (store.root / f"worker-{HOSTILE}.json").exists()  # a dry run moves nothing


def test_15_a_bash_masters_handoff_line_shows_worker_text_escaped(tmp_path: Path, tmux_socket: str) -> None:
    """The worker's last words and the result path its bridge reported reach a non-pi master's
    terminal as one line with every control character shown, ``cat -v`` style: the pane's title
    stays and no line is erased."""
    from helpers import dead_identity
    from tmux_support import kill_tmux_server

    from pi_tmux_matrix.matrix import lifecycle
    from pi_tmux_matrix.matrix.model import ExitRecord
    from pi_tmux_matrix.supervise.handoff_text import handoff_message

    store = MatrixStore(tmp_path / "state")
    dead = dead_identity()
    entry = store.register(make_entry("h15", process=dead, parent_pid=dead.pid, parent_session_id="boss"))
    record = ExitRecord(kind=ExitKind.EXITED, at=now_ms(), code=0)
    store.update(
        entry.key,
        lambda e: lifecycle.record_terminal(
            e, record, now_ms(), summary=f"all done {HOSTILE}", result_pointer=f"/tmp/r-{HOSTILE}.json"
        ),
        registration=entry.registration,
    )
    ended = store.get(entry.key)
    assert "\x1b" not in handoff_message(ended, ended.handoffs[0])  # a pi master's frame too
    env = {**os.environ, "PI_MATRIX_STATE_DIR": str(store.root)}
    names = ("PATH", "HOME", "PI_CODING_AGENT_DIR", "PI_MATRIX_STATE_DIR", "PYTHONPATH", "VIRTUAL_ENV")
    tmux = ["tmux", "-L", tmux_socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "bash", "-x", "200",
         *(w for name in names if name in env for w in ("-e", f"{name}={env[name]}")), "-e", "PS1=$ ",
         "-c", str(tmp_path), "--", sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss",
         "--", "bash", "--norc", "--noprofile"],
        env=env, check=True,
    )  # fmt: skip
    master = wait_for("the bash master", lambda: store.find("master-boss"), timeout=30)
    try:
        wait_for("the handoff delivered", lambda: store.get(entry.key).handoffs[0].delivered_at, timeout=30)

        def pane() -> str:
            argv = [*tmux, "capture-pane", "-p", "-J", "-t", "=bash:"]
            return subprocess.run(argv, capture_output=True, text=True, check=False).stdout

        def printed() -> str | None:
            return screen if "handoff worker-h15" in (screen := pane()) else None

        screen = wait_for("the handoff line", printed, detail=pane)
        (line,) = [line for line in screen.splitlines() if "handoff worker-h15" in line]
        assert f"all done {SHOWN}" in line and f"/tmp/r-{SHOWN}.json" in line, screen
        title = subprocess.run(
            [*tmux, "display-message", "-p", "-t", "=bash:", "#{pane_title}"], capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert "PWNED" not in title.stdout, title.stdout
    finally:
        kill_tmux_server(tmux_socket)  # the pane hangs up: bash and its master end (bash ignores SIGTERM)
        if master.process is not None and not procs.wait_for_exit(master.process, 10):
            procs.send_signal(master.process, signal.SIGKILL)
