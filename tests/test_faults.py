"""Under faults and hostile input (issue 17): nothing launched twice, no traceback, no silent loss.

One test per numbered case of the issue, each seen to fail on the code before its fix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
from labs import Lab
from seams import spawn_on_pid
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.request import FireRequest


def test_8_a_task_starting_with_a_dash_reaches_every_team_member(sublab: Lab) -> None:
    """The task summary goes to each host as ``--task-summary=VALUE``: a task that starts with
    ``-`` is never read as a flag (each host used to die on ``--task-summary -x``)."""
    sublab.start_master()
    fired = sublab.fire("-x", profile=None, team="stand-in-pair", backend="subprocess")
    assert len(fired.job.agents) == 2
    for agent in fired.job.agents:
        assert agent.host is not None
        sublab.started.append(agent.host)
        entry = sublab.worker(agent.key)
        assert entry.task_summary == "-x"
        assert procs.is_alive(entry.process)


def test_7_an_oversized_followup_or_steer_is_refused_before_anything_moves(sublab: Lab) -> None:
    sublab.start_master()
    fired = sublab.fire("HANG long work", backend="subprocess")
    (agent,) = fired.job.agents
    assert agent.host is not None
    sublab.started.append(agent.host)
    sublab.worker(agent.key)
    huge = "x" * 70_000
    follow = sublab.cli("followup", fired.job.id, "--", huge)
    assert follow.returncode == 2, follow.stderr
    assert "TEXT" in follow.stderr and "bytes once encoded" in follow.stderr
    assert "Traceback" not in follow.stderr
    assert JobStore(sublab.store).get(fired.job.id).agents[0].round == 1  # the round did not move
    steer = sublab.cli("send", agent.key, "--steer", huge)
    assert steer.returncode == 2 and "--steer" in steer.stderr and "Traceback" not in steer.stderr
    mailbox = sublab.state / "mailbox" / agent.key
    assert not mailbox.exists() or list(mailbox.iterdir()) == []


def test_9_an_agent_id_too_long_for_its_result_names_is_refused_before_the_job_is_written(
    sublab: Lab,
) -> None:
    master = sublab.start_master()
    done = sublab.cli(
        "fire", "--profile", "stand-in", "--backend", "subprocess", "--parent-pid", str(master.pid),
        "--parent-session", "boss", "--agent-id", "a" * 120, "--", "HANG",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--agent-id" in done.stderr and "use at most" in done.stderr
    assert not (sublab.state / "jobs").exists() or not list((sublab.state / "jobs").glob("job-*.json"))
    assert sublab.cli("jobs").returncode == 0


def test_10_a_relative_state_dir_is_made_absolute_once_for_every_process(sublab: Lab, tmp_path: Path) -> None:
    master = sublab.start_master()
    other = tmp_path / "other"
    other.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", "relstate", "fire", "--dry-run", "--json",
         "--profile", "stand-in", "--path", str(other), "--parent-pid", str(master.pid),
         "--parent-session", "boss", "--", "HANG"],
        capture_output=True, text=True, env=sublab.env, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (planned,) = json.loads(done.stdout)["agents"]
    argv = planned["argv"]
    assert argv[argv.index("--state-dir") + 1] == str(tmp_path / "relstate")
    assert planned["env"]["PI_MATRIX_STATE_DIR"] == str(tmp_path / "relstate")


def test_12_a_job_record_claiming_a_billion_rounds_is_reported_corrupt_not_a_hang(sublab: Lab) -> None:
    sublab.start_master()
    fired = sublab.fire("HANG", backend="subprocess")
    for agent in fired.job.agents:
        if agent.host is not None:
            sublab.started.append(agent.host)
    record = sublab.state / "jobs" / f"{fired.job.id}.json"
    raw = json.loads(record.read_text())
    raw["agents"][0]["round"] = 10**9
    record.write_text(json.dumps(raw))
    done = sublab.cli("jobs", "--json")
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    assert fired.job.id in done.stdout + done.stderr and "round" in done.stdout + done.stderr


def test_18_an_empty_state_dir_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", "", "ls"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--state-dir is empty" in done.stderr


def test_13_a_deeply_nested_profile_is_a_clear_error_not_a_recursion_crash(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    (agent / "launch_profiles").mkdir(parents=True)
    (agent / "launch_profiles" / "deep.toml").write_text(
        '[profile]\nname = "deep"\nprovider = "pi"\ncommand = ["pi"]\nx = ' + "[" * 5000 + "]" * 5000 + "\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "profiles"], capture_output=True, text=True, timeout=60,
        check=False, env={**os.environ, "PI_CODING_AGENT_DIR": str(agent)},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "deep.toml" in done.stderr and "nested too deeply" in done.stderr
    assert "Traceback" not in done.stderr


def test_14_a_lone_surrogate_in_allowed_paths_is_refused_whole() -> None:
    from pi_tmux_matrix.contract import parse_allowed_paths, path_allowed
    from pi_tmux_matrix.errors import ContractError

    raw = json.dumps(["/work/ok", "/work/\udcff"])
    with pytest.raises(ContractError, match="item 1 is not valid UTF-8"):
        parse_allowed_paths(raw)
    assert path_allowed("/work/\ud800/x", ["/work"]) is False  # never raises


def test_15_worker_text_reaches_the_terminal_with_its_escape_sequences_shown_not_run(tmp_path: Path) -> None:
    """``show`` prints a worker's task summary and its blocked-tool paths; a master prints a
    handoff's summary: every control character goes through one sanitiser (``cat -v`` style)."""
    from helpers import make_entry

    from pi_tmux_matrix.matrix.mailbox import EventLog
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
    from pi_tmux_matrix.safetext import printable

    hostile = "\x1b]0;PWNED-TITLE\x07\x1b[2K\x1b[1A\x9b31m"
    store = MatrixStore(tmp_path / "state")
    store.create(make_entry("w1", task_summary=f"fix it {hostile}"))
    EventLog(store, "worker-w1").write("tool_blocked", tool="write", path=f"/x/{hostile}", reason=hostile)
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "show", "worker-w1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\x9b" not in done.stdout
    assert "^[]0;PWNED-TITLE^G^[[2K^[[1AM-^[31m" in done.stdout
    assert printable("a\tb\nc") == "a^Ib^Jc" and now_ms() > 0


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


def test_16_the_off_switch_forbids_every_write(tmp_path: Path) -> None:
    """With ``processMatrix.enabled: false``, ``runs``, ``fork``, ``adopt`` and ``cleanup`` refuse
    (exit 2, naming the setting) and leave no state dir, lock or entry behind."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "settings.json").write_text(json.dumps({"processMatrix": {"enabled": False}}))
    state = tmp_path / "state"
    env = {**os.environ, "PI_CODING_AGENT_DIR": str(agent), "PI_MATRIX_STATE_DIR": str(state)}
    for words in (
        ("runs",), ("runs", "run-x"), ("adopt", "worker-w1"), ("cleanup", "worker-w1"),
        ("fork", "--session", str(tmp_path / "s.jsonl"), "--", "task"),
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", *words],
            capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, (words, done.stdout, done.stderr)
        assert "processMatrix.enabled" in done.stderr and "Traceback" not in done.stderr
        assert not state.exists(), f"{words} wrote the state dir"


@pytest.mark.parametrize(
    "command",
    [
        '["pi", "--tools", "read,tmux_agent_manager"]',
        '["pi", "--tools=read,fork"]',
        '["pi", "-e", "/tmp/evil.ts"]',
        '["opencode", "--allow", "subagent"]',
    ],
)
def test_18_a_profile_cannot_set_tools_or_extensions_in_its_command_words(command: str) -> None:
    from pi_tmux_matrix.dispatch.profile import parse_profile
    from pi_tmux_matrix.errors import ProfileError

    provider = "pi" if command.startswith('["pi"') else "opencode"
    text = f'[profile]\nname = "p"\nprovider = "{provider}"\ncommand = {command}\n'
    with pytest.raises(ProfileError, match=r"p\.toml: profile\.command\[\d\]"):
        parse_profile(text, "p.toml")


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
    if slow_python:
        slow = at.tmp / "slow-python"
        slow.mkdir()
        (slow / "sitecustomize.py").write_text("import time\ntime.sleep(4)\n")
        env["PYTHONPATH"] = str(slow)
    subprocess.run(
        ["tmux", "-L", at.socket, "new-session", "-d", "-s", "pi-matrix", "sleep", "600"],
        env=env, check=True, timeout=10,
    )  # fmt: skip
    _tmux(at.socket, "set-hook", "-g", "after-new-window", f"run-shell '{hook}'")
    dispatcher = at.dispatcher()
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


def test_17_a_payload_must_describe_the_entry_it_sits_in(tmp_path: Path) -> None:
    """A resumable payload whose identity differs from its entry's is a corrupt entry: the loader
    reports it (naming the field) and leaves the file alone, no write can produce one, and the
    steps that change an entry's identity move its payload with it (a session file reported by
    the bridge while the worker is already resumable used to leave the payload behind)."""
    from helpers import make_entry, make_identity

    from pi_tmux_matrix.errors import CorruptEntry, InvalidId
    from pi_tmux_matrix.matrix import lifecycle
    from pi_tmux_matrix.matrix.model import ResumablePayload, Status
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

    store = MatrixStore(tmp_path / "state")
    identity = make_identity("w17", session_file=str(tmp_path / "w17.jsonl"), cwd=str(tmp_path))
    payload = ResumablePayload(identity=identity, reason="parent_lost", at=now_ms())
    entry = make_entry("w17", status=Status.RESUMABLE, identity=identity, resumable=payload)
    store.register(entry)

    # The bridge reports pi's real session file after the payload was written.
    real = str(tmp_path / "real-w17.jsonl")
    moved = store.update(entry.key, lambda e: lifecycle.with_identity(e, session_file=real))
    assert moved.resumable is not None and moved.resumable.identity == moved.identity
    assert moved.resumable.identity.session_file == real

    # No write can make the payload name another agent.
    path = store.root / f"{entry.key}.json"
    before = path.read_bytes()
    other = attrs.evolve(moved.identity, agent_id="someone-else")
    with pytest.raises(InvalidId, match=r"resumable\.identity: .* in agentId;"):
        store.update(entry.key, lambda e: attrs.evolve(e, resumable=attrs.evolve(payload, identity=other)))
    assert path.read_bytes() == before

    # A file that holds one anyway is reported, by every reader, and never deleted.
    raw = json.loads(before)
    raw["resumable"]["identity"]["sessionFile"] = "/elsewhere/w17.jsonl"
    path.write_text(json.dumps(raw))
    with pytest.raises(CorruptEntry, match=r"resumable\.identity: .* in sessionFile;"):
        store.get(entry.key)
    listed = cli_at(store.root, "ls")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    assert f"{path}: resumable.identity: differs from the entry's identity in sessionFile" in listed.stderr
    for words in (("show", entry.key), ("resume", entry.key, "--dry-run")):
        done = cli_at(store.root, *words)
        assert done.returncode == 1 and "resumable.identity" in done.stderr, (words, done.stderr)
        assert "Traceback" not in done.stderr
    assert json.loads(path.read_text()) == raw


def cli_at(state: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), *words],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


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


def _end(stranger: subprocess.Popen[bytes]) -> None:
    stranger.kill()
    stranger.wait()


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
