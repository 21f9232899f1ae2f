"""Issue 30.2: no kernel limit at 100 agents. The kernel gives each user 128 inotify instances
(``fs.inotify.max_user_instances``); with an instance in every host and every job watcher, 37 of
100 watchers died at start with EMFILE. Now an agent holds one (its host's; a master's too, its
inbox and state dir on the same instance), a one-shot verb none, and where the kernel refuses,
the process polls and says so once in its agent's events.

The refusals are made in-process through the module's seams (``inotify._init``,
``inotify._add_watch``), never by lowering a system-wide sysctl."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import in_host, plant_job, read_events
from labs import Lab
from waiting import wait_for

from pi_tmux_matrix import inotify, procs
from pi_tmux_matrix.cli import main
from pi_tmux_matrix.cli.app import Io
from pi_tmux_matrix.dispatch import watch
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.dispatch.watch import Watcher
from pi_tmux_matrix.identity import AgentIdentityContract, Mode, Role
from pi_tmux_matrix.launch_contract import LaunchContract
from pi_tmux_matrix.matrix.mailbox import Inbox
from pi_tmux_matrix.matrix.model import ExitKind
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.settings import MatrixSettings
from pi_tmux_matrix.supervise.host import AgentHost
from pi_tmux_matrix.supervise.hostspec import HostSpec


# --- counting the instances a process holds ------------------------------------------------------
def inotify_instances(pid: int) -> int:
    """How many inotify instances ``pid`` holds: its fds that are one (close-on-exec everywhere,
    so no two processes share one)."""
    count = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for name in names:
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def watchers_of(job_id: str) -> list[int]:
    """The processes of the job's ``pi-matrix watch`` (and the shell tmux's pipe-pane runs it in)."""
    return [p for p in procs.running_pids() if job_id in cmdline(p) and "watch" in cmdline(p)]


@pytest.mark.parametrize("backend", ["tmux", "subprocess"])
def test_an_agent_holds_one_inotify_instance_its_hosts_and_its_master_one(lab: Lab, backend: str) -> None:
    """Before: a detached agent held two (its host's and its watcher's), a master two (its inbox's
    and its state dir's): 100 agents and a master spent 202 of the user's 128. Now one each."""
    master = lab.start_master()
    fired = lab.fire("HANG counted", backend=backend)
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("the host's inbox watch", lambda: inotify_instances(entry.pid) == 1)
    time.sleep(0.5)  # a round thread that would make one has made it by now
    held = {"host": inotify_instances(entry.pid), "agent": inotify_instances(entry.child_pid or 0)}
    assert held == {"host": 1, "agent": 0}  # the host's rounds ride no instance of their own
    assert watchers_of(fired.job.id) == []  # and run in the host (issue 30.1): no watcher process
    assert inotify_instances(master.pid) == 1  # its inbox and the state dir, on one instance


def test_a_detached_agents_watcher_polls_its_log_and_still_finds_the_marker_soon(lab: Lab) -> None:
    lab.start_master()
    fired = lab.fire("say hello", backend="subprocess")
    (agent,) = fired.job.agents
    result = wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=30)
    assert result.kind is ResultKind.DONE


# --- one-shot verbs make none --------------------------------------------------------------------
def test_one_shot_verbs_make_no_inotify_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fire`` waits for its agents' starts by polling; ``ls``, ``jobs``, ``show``, ``send`` …
    read and leave. Each runs in-process here, with the seam that makes an instance counting."""
    made: list[str] = []

    def counted() -> int:
        made.append("instance")
        raise OSError(errno.EMFILE, "counted, never made")

    monkeypatch.setattr(inotify, "_init", counted)
    sub = Lab(tmp_path, "pm-test-unused")
    try:
        master = sub.start_master()
        monkeypatch.chdir(sub.work)
        for name, value in sub.env.items():
            monkeypatch.setenv(name, value)
        state = ["--state-dir", str(sub.state)]

        def run(*words: str) -> str:
            out, err = io.StringIO(), io.StringIO()
            code = main([*state, *words], io=Io(out, err))
            assert code == 0, (words, err.getvalue())
            return out.getvalue()

        parent = ["--parent-pid", str(master.pid), "--parent-session", "boss"]
        fired = json.loads(
            run("fire", "--profile", "stand-in", "--backend", "subprocess", *parent, "--json", "--", "HANG a")
        )
        job_id = fired["jobId"]
        key = fired["agents"][0]["key"]
        sub.started += [i for a in JobStore(sub.store).get(job_id).agents if (i := a.host) is not None]
        for words in (
            ("ls",), ("ls", "--json"), ("show", key), ("jobs",), ("job", job_id), ("tree",),
            ("send", "--steer", "carry on", key), ("top", "--once"), ("status",),
        ):  # fmt: skip
            run(*words)
        assert made == []
    finally:
        sub.cleanup()


# --- refused: the host polls and says so once ----------------------------------------------------
def refuse(monkeypatch: pytest.MonkeyPatch, seam: str, code: int) -> list[str]:
    """Make the kernel refuse through ``seam``; returns the list of the calls it got."""
    calls: list[str] = []

    def refused(*_args: object) -> int:
        calls.append(seam)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(inotify, seam, refused)
    return calls


def events_named(store: MatrixStore, name: str) -> list[dict[str, Any]]:
    """Every key's events called ``name`` (a session switch moves a host's events to a new key)."""
    found = []
    for path in sorted((store.root / "events").glob("*.jsonl")):
        found += read_events(store.root, path.name.removesuffix(".jsonl"), name)
    return found


@pytest.mark.parametrize(
    ("seam", "code"),
    [("_init", errno.EMFILE), ("_init", errno.ENOMEM), ("_add_watch", errno.ENOSPC)],
)
def test_a_host_refused_inotify_takes_its_mail_by_polling_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seam: str, code: int
) -> None:
    """The host's own loop, in-process: refused at its first watch (the inbox), it takes a
    ``switch`` (whose new inbox is not watched either, and is not told again) and then a
    ``stop`` from its polled inbox, and ends its agent as asked."""
    calls = refuse(monkeypatch, seam, code)
    store = MatrixStore(tmp_path / "state")
    spec = HostSpec(
        argv=(sys.executable, "-c", "import time; time.sleep(60)"),
        identity=AgentIdentityContract(agent_id="a-s1", session_id="s1", cwd=str(tmp_path)),
        contract=LaunchContract(), mode=Mode.PRINT, role=Role.MASTER, stop_grace_s=0.2, deadline_s=30,
    )  # fmt: skip
    host = AgentHost(spec, store, MatrixSettings(), out=io.StringIO(), err=io.StringIO())
    Inbox(store, "master-s1").post("switch", json.dumps({"sessionId": "s2"}), sender="test")

    def stop_after_the_switch() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and store.find("master-s2") is None:
            time.sleep(0.05)
        Inbox(store, "master-s2").post("stop", "stop", sender="test")

    asking = threading.Thread(target=stop_after_the_switch)
    asking.start()
    started = time.monotonic()
    try:
        code_out = host.run()
    finally:
        asking.join()
    assert time.monotonic() - started < 20  # the stop, not the 30 s deadline
    entry = store.get("master-s2")
    assert entry.exit is not None and entry.exit.kind is ExitKind.KILLED, entry.exit
    assert code_out != 0
    (said,) = events_named(store, "inotify_unavailable")
    assert said["errno"] == errno.errorcode[code] and said["detail"] == "polling every 1000 ms"
    # Asked once: an instance once refused is not asked for again; a watch is, each time.
    assert calls == ([seam] if seam == "_init" else [seam, seam])
    assert inotify_instances(os.getpid()) == 0  # the instance a refused watch left is given back


def test_a_host_watches_its_inbox_on_one_instance_and_is_refused_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master included: its host watches its inbox and nothing else (a worker's new handoff is
    told there), so no other agent's write wakes it; one instance, and one refusal said once."""
    from pi_tmux_matrix.supervise.record import OwnRecord

    (tmp_path / "state").mkdir(mode=0o700)
    record = OwnRecord(MatrixStore(tmp_path / "state"), "master-boss")
    record.watch_mail(lambda: None)
    assert record.mail_watch is not None
    assert inotify_instances(os.getpid()) == 1
    assert record.watches.add(tmp_path / "no-such-folder", lambda _names: None) is None
    assert record.watches.refused is None  # one path that cannot be watched is no refusal
    record.unwatch_mail()
    record.watches.close()
    assert inotify_instances(os.getpid()) == 0

    refuse(monkeypatch, "_init", errno.EMFILE)
    (tmp_path / "state2").mkdir(mode=0o700)
    refused = OwnRecord(MatrixStore(tmp_path / "state2"), "master-boss")
    refused.watch_mail(lambda: None)
    refused.watch_mail(lambda: None)
    assert refused.mail_watch is None  # mail polled; handoffs at the poll and the heartbeat
    assert len(events_named(refused.store, "inotify_unavailable")) == 1


# --- the watcher: no instance, and never a silent death ------------------------------------------
@pytest.fixture
def followed(tmp_path: Path) -> Iterator[tuple[Watcher, Path]]:
    """A subprocess-backend agent's round as its host's round thread runs it: following the host's
    log, in this process (the host)."""
    store = MatrixStore(tmp_path / "state")
    job = plant_job(store, "job-20261207-010000-a1b2c3", tmp_path)
    log = store.side_dir("logs") / "job.a1.log"
    log.write_text("starting\n")
    agent = attrs.evolve(job.agents[0], log=str(log))
    job = JobStore(store).update(job.id, lambda j: attrs.evolve(j, agents=(agent,)))
    with in_host() as host:
        yield Watcher(store, job, agent, 1, host, follow=str(log)), log


def later(seconds: float, action: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_watcher_finds_the_marker_in_its_polled_log_with_inotify_refused(
    followed: tuple[Watcher, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = refuse(monkeypatch, "_init", errno.EMFILE)
    watcher, log = followed

    def marker() -> None:
        with log.open("a") as handle:
            handle.write(f"the answer\nDONE:{watcher.agent.nonce}\n")

    written = 0.0
    thread = later(0.5, marker)
    try:
        assert watcher.run() == 0
        written = time.monotonic()
    finally:
        thread.join()
    result = JobStore(watcher.store).result(watcher.job.id, watcher.agent.agent_id, 1)
    assert result is not None and result.kind is ResultKind.DONE
    assert written > 0 and calls == []  # it never asked for an instance
    (told,) = Inbox(watcher.store, watcher.agent.key).take()  # the host is told the round ended
    assert told.kind == "round"
    assert events_named(watcher.store, "watcher_failed") == []


def test_the_marker_waits_at_most_a_poll_for_the_watcher(followed: tuple[Watcher, Path]) -> None:
    watcher, log = followed
    at: list[float] = []

    def marker() -> None:
        with log.open("a") as handle:
            handle.write(f"DONE:{watcher.agent.nonce}\n")
        at.append(time.monotonic())

    thread = later(0.6, marker)
    try:
        watcher.run()
        seen = time.monotonic()
    finally:
        thread.join()
    assert seen - at[0] < 1.0  # one 250 ms poll, with room for a loaded machine


def test_a_watcher_that_fails_says_so_in_the_agents_events(
    followed: tuple[Watcher, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a watcher refused at start died with only a traceback in its own log, and the job
    went on saying ``running``: now the agent's events say the round is not watched."""
    watcher, _log = followed

    def no_fds(_path: object) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(watch, "open_state_file", no_fds)  # the round's log cannot be opened
    with pytest.raises(OSError, match="Too many open files"):
        watcher.run()
    (failed,) = events_named(watcher.store, "watcher_failed")
    assert failed["job"] == watcher.job.id and failed["round"] == 1
    assert "Too many open files" in failed["error"]
