"""Issue 30.5: the state dir is bounded. What belonged to an entry alone goes with it; history is
kept for the retention window, then swept by ``pi-matrix gc`` (a preview first) or, at most once
an hour, by reconcile; nothing live, unfinished, unreadable or quarantined is ever removed.

Real files, real processes (the stand-in agent under real hosts, a real master, real lock
contenders); records are made old by writing their own times, files by their mtimes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
from helpers import Reaper, fifo_writer, make_entry, spawn_sleeper
from labs import Lab
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore, new_nonce
from pi_tmux_matrix.dispatch.model import SUBPROCESS, TMUX, Job, JobAgent
from pi_tmux_matrix.fork.model import ForkRun, RunMode, RunStatus
from pi_tmux_matrix.fork.store import RunStore
from pi_tmux_matrix.matrix.layout import pipe_name
from pi_tmux_matrix.matrix.mailbox import AgentNotices, EventLog, Inbox
from pi_tmux_matrix.matrix.records import RecordStore
from pi_tmux_matrix.matrix.retention import STATE_FILE, SWEEP_EVERY_MS
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.retention import plan, sweep_if_due

DAY_MS = 24 * 3600 * 1000
OLD_MS = 40 * DAY_MS  # past the default 30-day window


def cli(state: Path, *words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), *words],
        capture_output=True, text=True, env=env or dict(os.environ), timeout=120, check=False,
    )  # fmt: skip


def age(path: Path, ms_ago: int) -> None:
    """Set ``path``'s mtime (and, for a folder, every file's in it) ``ms_ago`` into the past."""
    at = (now_ms() - ms_ago) * 1_000_000
    for item in [*(path.iterdir() if path.is_dir() else ()), path]:
        os.utime(item, ns=(at, at), follow_symlinks=False)


def leftovers(state: Path, key: str) -> list[str]:
    """What of ``key``'s entry alone is still there: its lock file, mailbox, notices."""
    names = (f"locks/{key}.lock", f"mailbox/{key}", f"mailbox/{key}.agent.jsonl")
    return [name for name in names if os.path.lexists(state / name)]


def finished(lab: Lab, key: str) -> bool:
    """The worker's host is gone and its master took its handoff: reconcile may remove it."""
    entry = lab.store.find(key)
    return entry is not None and not procs.is_alive(entry.process) and not entry.undelivered


# === what belonged to an entry goes with it ======================================================
def test_reconcile_removes_each_ended_entry_with_its_lock_and_mailbox_and_keeps_its_history(lab: Lab) -> None:
    master = lab.start_master()
    # The master's activation swept the state dir: no other sweep is due for an hour.
    wait_for("the activation's sweep", (lab.state / STATE_FILE).exists)
    jobs = [lab.fire("say hi"), lab.fire("say hi too", backend="subprocess"), lab.fire("HANG until stopped")]
    keys = [job.job.agents[0].key for job in jobs]
    for job in jobs[:2]:
        wait_for("a DONE result", lambda job=job: lab.result(job.job.id, job.job.agents[0].agent_id))
    lab.worker(keys[2])
    for job in jobs:
        stopped = cli(lab.state, "stop", job.job.id, "--confirm", "yes-tmux-stop", env=lab.env)
        assert stopped.returncode == 0, stopped.stderr
    for key in keys:
        wait_for(f"{key} ended and its handoff taken", lambda key=key: finished(lab, key), timeout=30)
    # Mail nobody will read: a message for a host that is gone.
    Inbox(lab.store, keys[0]).post("steer", "too late", sender="test")
    AgentNotices(lab.store, keys[0]).notify("steer", "too late")
    for key in keys:
        assert {f"locks/{key}.lock", f"mailbox/{key}"} <= set(leftovers(lab.state, key))

    done = cli(lab.state, "reconcile", env=lab.env)
    assert done.returncode == 0, done.stderr
    for key in keys:
        assert f"{key}: remove (" in done.stdout
        assert leftovers(lab.state, key) == []
        assert (lab.state / "events" / f"{key}.jsonl").exists()  # history: kept for the window
    assert "gc: removed" not in done.stdout  # the hourly sweep had run: this was the entries' own
    assert leftovers(lab.state, master.key) == [f"locks/{master.key}.lock", f"mailbox/{master.key}"]

    assert procs.send_signal(master.process, signal.SIGTERM)
    wait_for("the master to end", lambda: not procs.is_alive(master.process), timeout=30)
    done = cli(lab.state, "reconcile", env=lab.env)
    assert done.returncode == 0, done.stderr
    assert lab.store.find(master.key) is None and leftovers(lab.state, master.key) == []
    preview = json.loads(cli(lab.state, "gc", "--json", env=lab.env).stdout)
    assert [i["path"] for i in preview["remove"] if i["folder"] in ("locks", "mailbox")] == []


def test_an_entry_deleted_or_quarantined_takes_what_was_its_alone_and_a_fifo_there_stays_named(
    store: MatrixStore,
) -> None:
    gone = store.create(make_entry("gone1"))
    Inbox(store, gone.key).post("wake", sender="test")
    AgentNotices(store, gone.key).notify("steer", "hi")
    EventLog(store, gone.key).write("hello")
    os.mkfifo(store.root / "mailbox" / gone.key / "trap")
    store.delete(gone.key, gone.generation)
    assert leftovers(store.root, gone.key) == [f"mailbox/{gone.key}"]  # only what is not a regular file
    assert os.listdir(store.root / "mailbox" / gone.key) == ["trap"]
    assert (store.root / "events" / f"{gone.key}.jsonl").exists()
    kept = {f.path: f.reason for f in plan(store).kept}
    assert kept[f"mailbox/{gone.key}/trap"] == "not a regular file: never followed or removed"

    broken = store.create(make_entry("broken1"))
    Inbox(store, broken.key).post("wake", sender="test")
    (store.root / f"{broken.key}.json").write_bytes(b'{"half": ')
    (action,) = store.repair()
    assert action.action == "quarantine" and action.target is not None and Path(action.target).exists()
    assert leftovers(store.root, broken.key) == []


# === history: kept for the window, then swept ======================================================
def _stop_and_reconcile(lab: Lab, *jobs: Any) -> None:
    for job in jobs:
        stopped = cli(lab.state, "stop", job.job.id, "--confirm", "yes-tmux-stop", env=lab.env)
        assert stopped.returncode == 0, stopped.stderr
    for job in jobs:
        key = job.job.agents[0].key
        wait_for(f"{key} ended and its handoff taken", lambda key=key: finished(lab, key), timeout=30)
    assert cli(lab.state, "reconcile", env=lab.env).returncode == 0
    assert all(lab.store.find(job.job.agents[0].key) is None for job in jobs)


def _make_old(store: MatrixStore, job: Job) -> None:
    """The job ended 40 days ago: its own times and its results' say so, and its files' mtimes."""
    then = now_ms() - OLD_MS
    JobStore(store).update(job.id, lambda j: attrs.evolve(j, created_at=then, stopped_at=then))
    results = RecordStore(store, "results")
    for name in results.names():
        if name.startswith(f"{job.id}."):
            results.update(name, lambda raw: {**(raw or {}), "at": then})
    for folder in ("logs", "results"):
        for path in (store.root / folder).glob(f"{job.id}.*"):
            age(path, OLD_MS)


def _plant_old_job(
    store: MatrixStore, tmp: Path, job_id: str, session: str, backend: str = SUBPROCESS
) -> Job:
    """A job of one agent ``a1`` (no entry, no live host) that ended 40 days ago."""
    then = now_ms() - OLD_MS
    agent = JobAgent(
        agent_id="a1", key=f"worker-{session}", session_id=session, profile="stand-in", provider="pi",
        mode="print" if backend == SUBPROCESS else "interactive", cwd=str(tmp), backend=backend,
        nonce=new_nonce(), round=1, deadline_at=then, deadline_s=1.0,
    )  # fmt: skip
    job = Job(
        id=job_id, created_at=then, parent_pid=1, parent_session_id="boss", task="t", profile="stand-in",
        team=None, agents=(agent,), backend=backend, stopped_at=then,
    )  # fmt: skip
    JobStore(store).create(job)
    return job


def _plant_job_with_an_unreadable_result(store: MatrixStore, tmp: Path) -> Job:
    job = _plant_old_job(store, tmp, "job-20261001-000000-d0d0d0", "planted1")
    bad = store.root / "results" / f"{job.id}.a1.1.json"
    bad.write_bytes(b'{"jobId": ')
    age(bad, OLD_MS)
    return job


def test_gc_previews_only_old_history_keeps_live_unfinished_and_unreadable_files_and_removes_with_the_word(
    lab: Lab,
) -> None:
    master = lab.start_master()
    old = lab.fire("say old", backend="subprocess")
    new = lab.fire("say new", backend="subprocess")
    live = lab.fire("HANG still working", backend="subprocess")
    for job in (old, new):
        wait_for("a DONE result", lambda job=job: lab.result(job.job.id, job.job.agents[0].agent_id))
    live_entry = lab.worker(live.job.agents[0].key)
    _stop_and_reconcile(lab, old, new)
    old_key = old.job.agents[0].key
    _make_old(lab.store, old.job)
    age(lab.state / "events" / f"{old_key}.jsonl", OLD_MS)
    for path in (lab.state / "logs").glob(f"{live.job.id}.*"):
        age(path, OLD_MS)  # old mtimes, but its agent lives: never touched
    planted = _plant_job_with_an_unreadable_result(lab.store, lab.tmp)
    junk = lab.state / "worker-junk.json"
    junk.write_bytes(b"not json")
    assert cli(lab.state, "repair", env=lab.env).returncode == 0
    (quarantined,) = (lab.state / "quarantine").iterdir()

    shown = cli(lab.state, "gc", "--json", env=lab.env)
    assert shown.returncode == 2, shown.stderr  # a preview: nothing removed
    preview = json.loads(shown.stdout)
    paths = {item["path"] for item in preview["remove"]}
    name = f"{old.job.id}.{old.job.agents[0].agent_id}"
    assert {
        f"jobs/{old.job.id}.json", f"locks/jobs.{old.job.id}.lock", f"results/{name}.1.json",
        f"locks/results.{name}.1.lock", f"logs/{name}.log",
        f"events/{old_key}.jsonl",
    } <= paths, sorted(paths)  # fmt: skip
    for other in (new.job.id, live.job.id, live_entry.key, master.key, planted.id, "quarantine/"):
        assert not [p for p in paths if other in p], other
    kept = {item["path"]: item["reason"] for item in preview["kept"]}
    assert f"job {planted.id} with it" in kept[f"results/{planted.id}.a1.1.json"]
    assert "never removed by gc" in kept[f"quarantine/{quarantined.name}"]
    assert all((lab.state / p.rstrip("/")).exists() for p in paths)

    text = cli(lab.state, "gc", env=lab.env)
    assert text.returncode == 2
    assert "would remove" in text.stdout and "preview only: run again with --confirm yes-gc" in text.stdout
    assert f"quarantine/{quarantined.name}: moved aside by 'pi-matrix repair'" in text.stdout
    assert f"results/{planted.id}.a1.1.json:" in text.stdout

    done = cli(lab.state, "gc", "--confirm", "yes-gc", env=lab.env)
    assert done.returncode == 0, done.stderr
    assert "removed" in done.stdout
    assert not [p for p in paths if (lab.state / p.rstrip("/")).exists()]
    for job in (new, live, planted):
        job_id = job.id if isinstance(job, Job) else job.job.id
        assert (lab.state / "jobs" / f"{job_id}.json").exists()
    assert (lab.state / "events" / f"{new.job.agents[0].key}.jsonl").exists()  # young history
    assert quarantined.exists() and (lab.state / "results" / f"{planted.id}.a1.1.json").exists()
    assert procs.is_alive(live_entry.process)

    # With no window at all, every job that is over goes; the live one and its files stay.
    everything = cli(lab.state, "gc", "--older-than", "0", "--confirm", "yes-gc", "--json", env=lab.env)
    assert everything.returncode == 0, everything.stderr
    assert not (lab.state / "jobs" / f"{new.job.id}.json").exists()
    assert (lab.state / "jobs" / f"{live.job.id}.json").exists()
    assert list((lab.state / "logs").glob(f"{live.job.id}.*"))
    assert leftovers(lab.state, live.job.agents[0].key)[:2] == [
        f"locks/{live_entry.key}.lock", f"mailbox/{live_entry.key}",
    ]  # fmt: skip
    assert procs.is_alive(live_entry.process) and procs.is_alive(live_entry.child_process)


def test_fork_runs_go_once_ended_past_the_window_and_a_running_one_never(
    store: MatrixStore, reaper: Reaper
) -> None:
    runs = RunStore(store)
    then = now_ms() - OLD_MS
    sleeper = reaper.popen(spawn_sleeper())
    running_process = procs.identify(sleeper.pid)
    for run_id, status, process in (
        ("run-20261001-000000-aaaaaa", RunStatus.COMPLETED, None),
        ("run-20261001-000000-bbbbbb", RunStatus.RUNNING, running_process),
    ):
        run = ForkRun(
            id=run_id, cwd="/", task="t", mode=RunMode.BACKGROUND, status=status, created_at_ms=then,
            updated_at_ms=then, ended_at_ms=None if status is RunStatus.RUNNING else then, process=process,
        )  # fmt: skip
        runs.put(run, exclusive=True)
        (runs.folder(run_id) / "pane.log").write_text("pane\n")
        age(store.root / "runs" / run_id, OLD_MS)
    found = plan(store, days=0)
    assert {i.path for i in found.items} == {
        "runs/run-20261001-000000-aaaaaa.json", "locks/runs.run-20261001-000000-aaaaaa.lock",
        "runs/run-20261001-000000-aaaaaa/",
    }  # fmt: skip
    assert cli(store.root, "gc", "--confirm", "yes-gc").returncode == 0
    left = sorted(os.listdir(store.root / "runs"))
    assert left == ["run-20261001-000000-bbbbbb", "run-20261001-000000-bbbbbb.json"]


# === the sweep after reconcile: at most once an hour ==============================================
def test_the_sweep_after_reconcile_runs_at_most_once_an_hour_and_a_held_lock_is_left_alone(
    store: MatrixStore, tmp_path: Path, reaper: Reaper
) -> None:
    EventLog(store, "worker-old1").write("bye")
    age(store.root / "events" / "worker-old1.jsonl", OLD_MS)
    now = now_ms()
    first = sweep_if_due(store, now=now)
    assert first is not None and [f.path for f in first.removed] == ["events/worker-old1.jsonl"]
    EventLog(store, "worker-old2").write("bye")
    age(store.root / "events" / "worker-old2.jsonl", OLD_MS)
    assert sweep_if_due(store, now=now + SWEEP_EVERY_MS - 1) is None  # within the hour: not again
    assert (store.root / "events" / "worker-old2.jsonl").exists()
    later = sweep_if_due(store, now=now + SWEEP_EVERY_MS)
    assert later is not None and [f.path for f in later.removed] == ["events/worker-old2.jsonl"]

    # A leftover whose lock a live process holds is busy: kept, named, never waited for long.
    Inbox(store, "worker-held1").post("wake", sender="test")
    holder = reaper.popen(
        subprocess.Popen(
            [sys.executable, "-c", HOLD, str(store.root), "worker-held1"], stdout=subprocess.PIPE, text=True
        )
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    done = cli(store.root, "gc", "--confirm", "yes-gc", "--json")
    assert done.returncode == 0, done.stderr
    kept = {item["path"]: item["reason"] for item in json.loads(done.stdout)["kept"]}
    assert kept["mailbox/worker-held1/"].startswith("busy: its lock is held")
    assert (store.root / "mailbox" / "worker-held1").exists()


HOLD = """
import sys, time
from pi_tmux_matrix.matrix.store import MatrixStore
with MatrixStore(sys.argv[1]).locked(sys.argv[2]):
    print("held", flush=True)
    time.sleep(60)
"""


# === the lock file removed under contention ======================================================
# Each contender takes the entry's lock over and over; inside it claims a marker file exclusively
# (a second holder would find it taken), and half the time removes the lock file as delete does:
# as the last act under it (from then on a newcomer locks the file made anew).
CONTENDER = """
import os, random, sys, time
from pi_tmux_matrix.matrix.store import MatrixStore
root, key, marker, go, seconds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
store = MatrixStore(root)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
until = time.monotonic() + seconds
rounds = clashes = 0
while time.monotonic() < until:
    with store.locked(key) as root_fd:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            clashes += 1  # someone else holds "the" lock at the same time
            continue
        time.sleep(0.0002)
        os.unlink(marker)
        if random.random() < 0.5:
            store.drop_lock(root_fd, key + ".lock")
    rounds += 1
print(rounds, clashes, flush=True)
"""


def test_a_lock_file_removed_under_contention_never_lets_two_writers_hold_it(
    store: MatrixStore, tmp_path: Path, reaper: Reaper
) -> None:
    store.create(make_entry("hot1"))
    marker, go = tmp_path / "inside", tmp_path / "go"
    argv = [sys.executable, "-c", CONTENDER, str(store.root), "worker-hot1", str(marker), str(go), "3.0"]
    contenders = [reaper.popen(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)) for _ in range(5)]
    # The 3 s of contention start once all five are up: a start slowed by a loaded machine would
    # otherwise eat the window (a contender that began after it ended locked nothing at all).
    assert [popen.stdout.readline() for popen in contenders] == ["ready\n"] * 5
    go.touch()
    counts = [tuple(map(int, popen.communicate(timeout=60)[0].split())) for popen in contenders]
    assert all(popen.returncode == 0 for popen in contenders)
    assert sum(rounds for rounds, _ in counts) > 100, counts  # they really contended
    assert [clashes for _, clashes in counts] == [0] * len(counts), counts


def test_a_pane_pipe_a_killed_host_left_goes_with_its_job_and_a_fifo_elsewhere_stays(
    store: MatrixStore, tmp_path: Path, reaper: Reaper
) -> None:
    """pipes/ holds the FIFO a tmux agent's host reads its pane from, removed by the host at its
    end; one a killed host left goes with its job once the job is over and past the window, or,
    of no job, by its own time. A FIFO anywhere else is still never removed (issue 30.5)."""
    job = _plant_old_job(store, tmp_path, "job-20261001-000000-p1p1p1", "piped1", TMUX)
    pipes = store.side_dir("pipes")
    left = pipes / pipe_name(job.id, "a1", 4242)
    loose = pipes / pipe_name("job-20261002-000000-gone00", "a1", 4243)
    young = pipes / pipe_name("job-20261203-000000-young0", "a1", 4244)
    for fifo in (left, loose, young):
        os.mkfifo(fifo, 0o600)
    # A pane pipe's writer blocked in its open (its host was killed first): it ends once gc
    # removes the FIFO, never left behind for good.
    writer = reaper.popen(fifo_writer(left))
    age(loose, OLD_MS)
    elsewhere = store.side_dir("logs") / "planted.fifo"
    os.mkfifo(elsewhere, 0o600)
    age(elsewhere, OLD_MS)

    shown = cli(store.root, "gc", "--json")
    assert shown.returncode == 2, shown.stderr
    paths = {item["path"] for item in json.loads(shown.stdout)["remove"]}
    assert {f"pipes/{left.name}", f"pipes/{loose.name}", f"jobs/{job.id}.json"} <= paths, sorted(paths)
    assert f"pipes/{young.name}" not in paths
    done = cli(store.root, "gc", "--confirm", "yes-gc", "--json")
    assert done.returncode == 0, done.stderr
    assert not left.exists() and not loose.exists()
    assert young.exists() and elsewhere.exists()
    assert writer.wait(timeout=10) is not None  # let go, it ended
    kept = {item["path"]: item["reason"] for item in json.loads(done.stdout)["kept"]}
    assert "not a regular file" in kept.get("logs/planted.fifo", ""), kept


def test_a_round_settled_without_its_host_drops_its_pane_pipe_and_lets_its_writer_go(
    store: MatrixStore, tmp_path: Path, reaper: Reaper
) -> None:
    """A tmux agent's host was killed -9 and its agent ended: whoever settles the round (the next
    `jobs`, `reconcile` or master activation) also removes the FIFO that host read its pane from,
    letting a pipe writer blocked in opening it go (it waited for the sweep, 30 days, before)."""
    from pi_tmux_matrix.dispatch.hostless import settle

    dead = reaper.popen(subprocess.Popen(["true"]))
    dead.wait()
    gone = procs.ProcessIdentity(dead.pid, 1, procs.boot_id())  # a start time no process has
    job = _plant_old_job(store, tmp_path, "job-20261205-000000-h0h0h0", "hostless1", TMUX)
    agent = attrs.evolve(job.agents[0], host_pid=gone.pid, host_start=gone.start_ticks, boot_id=gone.boot_id)
    job = JobStore(store).update(job.id, lambda j: attrs.evolve(j, agents=(agent,), stopped_at=None))
    fifo = store.side_dir("pipes") / pipe_name(job.id, "a1", gone.pid)
    os.mkfifo(fifo, 0o600)
    writer = reaper.popen(fifo_writer(fifo))
    (result,) = settle(JobStore(store), store, job)
    assert result.kind.value == "exited", result
    assert not fifo.exists()
    assert writer.wait(timeout=10) is not None


def test_a_new_host_of_a_job_agent_drops_the_pane_pipes_its_dead_hosts_left(
    store: MatrixStore, reaper: Reaper
) -> None:
    """Each host reads its pane from a FIFO of its own (``pipe_name``: the host's pid in the
    name). One a killed host left goes when the next host of that job agent makes its own, its
    blocked writer let go; a live host's stays (after ``fire --force`` the archived job's host
    still reads from it), and so does another agent's. Before the pid was in the name, the next
    host's FIFO simply replaced the one left."""
    from pi_tmux_matrix.dispatch.roundwatch import RoundWatch

    gone = reaper.popen(subprocess.Popen(["true"]))
    gone.wait()
    live = reaper.popen(subprocess.Popen(["sleep", "60"]))
    pipes = store.side_dir("pipes")
    dead_hosts = pipes / pipe_name("job-x", "a1", gone.pid)
    live_hosts = pipes / pipe_name("job-x", "a1", live.pid)
    other_agents = pipes / pipe_name("job-x", "a10", gone.pid)
    for fifo in (dead_hosts, live_hosts, other_agents):
        os.mkfifo(fifo, 0o600)
    writer = reaper.popen(fifo_writer(dead_hosts))
    # No tmux server on that socket: the pipe is refused after the FIFOs were looked at, and the
    # host goes on without one (its rounds then end by exit or deadline).
    watch = RoundWatch(store, "job-x", "a1", pane="%0", socket=f"pm-no-server-{os.getpid()}")
    watch.open()
    assert not dead_hosts.exists() and writer.wait(timeout=10) is not None
    assert live_hosts.exists() and other_agents.exists()
    assert not (pipes / pipe_name("job-x", "a1", os.getpid())).exists()  # refused: its own is gone too
