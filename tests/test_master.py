"""``pi-matrix master`` and the owner verbs with real processes (issue 3's master acceptance).

Workers are real ``pi-matrix host`` processes running the bundled stand-in, whose parent is a
real ``pi-matrix master`` the test SIGKILLs; dead workers are entries written with the store
(status ``resumable`` with a complete pi context). Settings sit at their lower bounds. Every
process a test starts is tracked and, at the end, stopped by its identity (never by name): the
``master_lab`` fixture (tests/masterlab.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import time
from pathlib import Path

import pytest
from helpers import dead_identity, dir_digest, loaded, make_entry, make_identity, spawn_sleeper
from masterlab import MasterLab, adopted_by, orphaned_worker, several_orphans
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import (
    Entry,
    ExitKind,
    ExitRecord,
    Outcome,
    Status,
)
from pi_tmux_matrix.matrix.store import now_ms


def stable_digest(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """dir_digest with directory sizes dropped (a directory's size is the filesystem's business)."""
    return {
        name: (kind, mode, 0 if stat.S_ISDIR(kind) else size, digest)
        for name, (kind, mode, size, digest) in dir_digest(str(root)).items()
    }


def handoff_lines(text: str, key: str) -> list[str]:
    return [line for line in text.replace("\r", "").splitlines() if line.startswith(f"handoff {key}:")]


# --- exact orphans: recovered without a prompt ------------------------------------------------------
def test_exact_live_orphan_is_readopted_without_a_prompt(master_lab: MasterLab) -> None:
    worker, before = orphaned_worker(master_lab, "w1", "boss", "goal-1")
    assert before.reason == "parent_lost"
    assert before.resumable is not None and before.resumable.task_ref == "goal-1"

    master, out = master_lab.headless_master("boss", "goal-1")

    adopted = wait_for(
        "re-adoption by the new master",
        lambda: (e := master_lab.entry("worker-w1")).status is Status.RUNNING
        and e.parent_pid == master.pid
        and e,
        10,
    )
    assert adopted.parent_session_id == "boss"
    assert adopted.registration == before.registration  # the same host, re-parented
    assert adopted.directive is None and adopted.resumable is None
    assert "orphan worker-w1 (exact, alive, agent agent-w1, lane -): re-adopted" in out.read_text()
    assert worker.poll() is None
    assert procs.is_alive(adopted.child_process)
    # The host logs "adopted" just after its CAS lands, so the entry can be seen first: wait for it.
    wait_for("the host's adopted event", lambda: adopted_by(master_lab, "worker-w1", master.pid), 10)


def test_exact_dead_orphan_is_relaunched_into_the_same_session_and_key(master_lab: MasterLab) -> None:
    before = master_lab.dead_resumable("w2", "boss", "goal-1")
    session_file = Path(before.identity.session_file or "")
    transcript = session_file.read_bytes()

    done = master_lab.cli("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")

    assert done.returncode == 0, done.stderr
    match = re.search(
        r"orphan worker-w2 \(exact, dead, agent agent-w2, lane -\): relaunched: new host pid (\d+)",
        done.stdout,
    )
    assert match, done.stdout
    assert "[y/N]" not in done.stdout + done.stderr
    host_pid = int(match.group(1))
    host = procs.identify(host_pid)
    if host is not None:
        master_lab.started.append(host)

    # The new host registered the same key (a new process generation) ...
    entry = wait_for(
        "the relaunched host to register",
        lambda: (
            (e := master_lab.entry("worker-w2")).registration != before.registration
            and e.status is not Status.LAUNCHING
            and e
        ),
        20,
    )
    assert entry.pid == host_pid
    assert entry.key == before.key
    assert entry.identity.session_file == str(session_file)
    assert entry.identity.agent_id == "agent-w2"
    assert entry.task_ref == "goal-1"
    assert entry.parent_session_id == "boss"
    # ... and the stand-in appended to that very session file: the wake prompt, then its turn.
    finished = wait_for(
        "the resumed turn to end",
        lambda: (e := master_lab.entry("worker-w2")).status is Status.TERMINAL and e,
        20,
    )
    text = session_file.read_bytes()
    assert text.startswith(transcript)
    added = [json.loads(line) for line in text[len(transcript) :].splitlines()]
    assert added[0]["role"] == "user"
    assert added[0]["content"].startswith("[pi-matrix] You are agent agent-w2, resumed in your own session")
    assert "Task: goal-1." in added[0]["content"]
    assert added[1]["role"] == "assistant"
    assert added[1]["content"].startswith("done: ")
    (handoff,) = finished.undelivered
    assert handoff.parent_session_id == "boss"
    assert handoff.outcome is Outcome.EXITED and handoff.code == 0
    assert handoff.generation == entry.registration
    assert (master_lab.state / "logs" / "worker-w2.log").exists()


def test_a_relaunched_worker_keeps_its_pi_identity(master_lab: MasterLab) -> None:
    before = master_lab.dead_resumable("w3", "boss", "goal-1")
    done = master_lab.cli("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")
    assert "relaunched" in done.stdout, done.stdout + done.stderr
    entry = wait_for(
        "the relaunched host to register",
        lambda: (
            (e := master_lab.entry("worker-w3")).registration != before.registration
            and e.status is not Status.LAUNCHING
            and e
        ),
        20,
    )
    assert entry.identity.provider == before.identity.provider == "pi"
    assert entry.identity.resume_complete


@pytest.mark.parametrize("task_state", ["blocked", "terminal"])
def test_a_blocked_or_terminal_task_disables_exact_recovery(master_lab: MasterLab, task_state: str) -> None:
    worker, live = orphaned_worker(master_lab, "w4", "boss", "goal-1")
    master_lab.dead_resumable("w5", "boss", "goal-1")
    dead_bytes = master_lab.raw("worker-w5")

    done = master_lab.cli(
        "master", "--session-id", "boss", "--task-ref", "goal-1", "--task-state", task_state, "--once"
    )

    assert done.returncode == 0, done.stderr
    why = f"task is {task_state}: automatic recovery disabled"
    assert f"orphan worker-w4 (exact, alive, agent agent-w4, lane -): reported: {why}" in done.stdout
    assert f"orphan worker-w5 (exact, dead, agent agent-w5, lane -): reported: {why}" in done.stdout
    assert master_lab.raw("worker-w5") == dead_bytes  # not relaunched, not touched
    assert not (master_lab.state / "logs").exists()
    now = master_lab.entry("worker-w4")
    assert now.status is Status.RESUMABLE
    assert now.directive is None
    assert now.parent_pid == live.parent_pid
    assert not (master_lab.state / "mailbox" / "worker-w4").exists() or not any(
        (master_lab.state / "mailbox" / "worker-w4").iterdir()
    )
    assert worker.poll() is None


# --- foreign orphans: owner-gated in a terminal ------------------------------------------------------
def test_foreign_live_orphans_are_adopted_cleaned_up_or_left_as_the_owner_answers(
    master_lab: MasterLab,
) -> None:
    orphans = several_orphans(master_lab, "home", "goal-1", [("a", "lane-a"), ("b", "lane-b"), ("c", None)])
    leave_host = orphans["c"][1].process
    assert leave_host is not None
    master_lab.pause(leave_host)  # alive, but it cannot write: any byte change would be the master's
    leave_before = {k: v for k, v in stable_digest(master_lab.state).items() if "worker-c" in k}
    assert "worker-c.json" in leave_before

    term = master_lab.pty("master", "--interactive", "--session-id", "other", "--task-ref", "goal-1")

    term.expect(r"adopt worker agent-a \(lane lane-a\)\? \[y/N\] ")
    term.answer("y")
    term.expect(r"adopt worker agent-b \(lane lane-b\)\? \[y/N\] ")
    term.answer("n")
    term.expect(r"clean up worker agent-b \(lane lane-b\) gracefully\? \[y/N\] ")
    term.answer("y")
    term.expect(r"adopt worker agent-c \(lane -\)\? \[y/N\] ")
    term.answer("n")
    term.expect(r"clean up worker agent-c \(lane -\) gracefully\? \[y/N\] ")
    term.answer("n")
    term.expect(r"master master-other active")
    term.expect(r"orphan worker-a \(foreign, alive, agent agent-a, lane lane-a\): adopted")
    term.expect(r"orphan worker-b \(foreign, alive, agent agent-b, lane lane-b\): cleanup_requested")
    term.expect(r"orphan worker-c \(foreign, alive, agent agent-c, lane -\): left")

    # adopt: the grant is written and the worker re-parents to this master.
    adopted = wait_for(
        "worker-a to re-parent",
        lambda: (e := master_lab.entry("worker-a")).status is Status.RUNNING
        and e.parent_pid == term.proc.pid
        and e,
        10,
    )
    assert adopted.parent_session_id == "other"
    wait_for("worker-a's adopted event", lambda: adopted_by(master_lab, "worker-a", term.proc.pid), 10)
    assert orphans["a"][0].poll() is None

    # cleanup: the worker stops its own agent and exits; its record is closed.
    worker_b, entry_b = orphans["b"]
    worker_b.wait(timeout=10)
    closed = master_lab.entry("worker-b")
    assert closed.status is Status.CLOSED and closed.reason == "cleanup"
    assert closed.exit is not None and closed.exit.kind is ExitKind.KILLED
    assert not procs.is_alive(entry_b.child_process)

    # leave: not a byte of that worker's entry, lock, mailbox or events changed.
    after = {k: v for k, v in stable_digest(master_lab.state).items() if "worker-c" in k}
    assert after == leave_before
    assert term.proc.poll() is None


def test_a_dead_foreign_worker_is_offered_resume_first(master_lab: MasterLab) -> None:
    resumed = master_lab.dead_resumable("d", "home", "goal-1", lane="lane-d")
    declined = master_lab.dead_resumable("e", "home", "goal-1")
    declined_bytes = master_lab.raw("worker-e")
    session_file = Path(resumed.identity.session_file or "")
    transcript = session_file.read_bytes()

    term = master_lab.pty("master", "--interactive", "--session-id", "other", "--task-ref", "goal-1")

    first = term.expect(r"(\w[^\n]*) worker agent-d \(lane lane-d\)[^\n]*\? \[y/N\] ")
    assert first.group(0).startswith("resume worker agent-d (lane lane-d) in its own session?")
    term.answer("y")
    first = term.expect(r"(\w[^\n]*) worker agent-e \(lane -\)[^\n]*\? \[y/N\] ")
    assert first.group(0).startswith("resume worker agent-e (lane -) in its own session?")
    term.answer("n")
    match = term.expect(
        r"orphan worker-d \(foreign, dead, agent agent-d, lane lane-d\): resumed: new host pid (\d+)"
    )
    host = procs.identify(int(match.group(1)))
    if host is not None:
        master_lab.started.append(host)
    term.expect(r"orphan worker-e \(foreign, dead, agent agent-e, lane -\): left")
    # A dead worker is never offered adopt or cleanup: there is no process to re-parent.
    assert "adopt worker agent-e" not in term.drain()
    assert "clean up worker agent-e" not in term.seen

    relaunched = wait_for(
        "worker-d to be relaunched",
        lambda: (
            (e := master_lab.entry("worker-d")).registration != resumed.registration
            and e.status is not Status.LAUNCHING
            and e
        ),
        20,
    )
    assert relaunched.parent_pid == term.proc.pid
    assert relaunched.parent_session_id == "other"
    assert relaunched.identity.lane == "lane-d"
    wait_for("the resumed turn", lambda: len(session_file.read_bytes()) > len(transcript) + 1, 20)
    assert session_file.read_bytes().startswith(transcript)
    assert master_lab.raw("worker-e") == declined_bytes
    assert master_lab.entry("worker-e") == declined


# --- headless: report only, write nothing -------------------------------------------------------------
@pytest.mark.parametrize("how", ["headless-flag-in-a-tty", "no-tty"])
def test_headless_reports_foreign_orphans_and_writes_nothing(master_lab: MasterLab, how: str) -> None:
    _, live = orphaned_worker(master_lab, "f1", "home", "goal-1", lane="lane-1")
    master_lab.dead_resumable("f2", "home", "goal-1")
    # The dead master's own record is the reconciliation pass's business, not the scan's: clear
    # it first so the only thing left for this activation to touch is the foreign orphans.
    assert master_lab.cli("reconcile").returncode == 0
    assert live.process is not None
    master_lab.pause(live.process)
    before = stable_digest(master_lab.state)

    args = ["master", "--session-id", "other", "--task-ref", "goal-1", "--once"]
    if how == "no-tty":
        done = master_lab.cli(*args)
        assert done.returncode == 0, done.stderr
        output = done.stdout + done.stderr
    else:
        term = master_lab.pty(*args, "--headless")
        code = term.wait_exit()
        output = term.seen
        assert code == 0, output

    assert "[y/N]" not in output
    assert "orphan worker-f1 (foreign, alive, agent agent-f1, lane lane-1): reported" in output
    assert "orphan worker-f2 (foreign, dead, agent agent-f2, lane -): reported" in output
    after = stable_digest(master_lab.state)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed, "the master registers its own entry"
    assert all("master-other" in name for name in changed), changed


# --- terminal handoffs ----------------------------------------------------------------------------------
def test_a_running_master_delivers_a_handoff_once_and_the_record_closes(master_lab: MasterLab) -> None:
    master, out = master_lab.headless_master("lead")
    worker, _ = master_lab.start_worker("h1", master.pid, "lead", task="write the report", mode="print")
    assert worker.wait(timeout=20) == 0

    closed = wait_for(
        "delivery and close", lambda: (e := master_lab.entry("worker-h1")).status is Status.CLOSED and e, 15
    )
    (handoff,) = closed.handoffs
    assert handoff.delivered_at is not None
    time.sleep(2.5)  # two more heartbeat ticks: nothing is delivered twice
    master.send_signal(signal.SIGTERM)
    master.wait(timeout=15)
    (line,) = handoff_lines(out.read_text(), "worker-h1")
    assert line.startswith("handoff worker-h1: exited code 0")


def test_a_handoff_waits_for_its_session_and_replays_once(master_lab: MasterLab) -> None:
    parent = spawn_sleeper()
    master_lab.popens.append(parent)
    _other, other_out = master_lab.headless_master("elsewhere")
    worker, _ = master_lab.start_worker("h2", parent.pid, "away", task="tidy up", mode="print")
    assert worker.wait(timeout=20) == 0

    waiting = master_lab.entry("worker-h2")
    assert waiting.status is Status.TERMINAL
    (handoff,) = waiting.undelivered
    assert handoff.parent_session_id == "away"
    time.sleep(2.5)  # a master of another session ticks twice: never its handoff
    assert master_lab.entry("worker-h2") == waiting
    assert handoff_lines(other_out.read_text(), "worker-h2") == []

    first = master_lab.cli("master", "--session-id", "away", "--once")
    assert first.returncode == 0, first.stderr
    assert handoff_lines(first.stdout, "worker-h2"), first.stdout
    assert all(
        line.startswith("handoff worker-h2: exited code 0")
        for line in handoff_lines(first.stdout, "worker-h2")
    )
    assert master_lab.entry("worker-h2").status is Status.CLOSED

    second = master_lab.cli("master", "--session-id", "away", "--once")
    assert second.returncode == 0, second.stderr
    assert handoff_lines(second.stdout, "worker-h2") == []


def _terminal_worker(master_lab: MasterLab, session: str, owner: str) -> Entry:
    dead = dead_identity()
    entry = master_lab.store.register(
        make_entry(session, process=dead, parent_pid=dead.pid, parent_session_id=owner)
    )
    record = ExitRecord(kind=ExitKind.EXITED, at=now_ms(), code=0)
    return master_lab.store.update(
        entry.key,
        lambda e: lifecycle.record_terminal(e, record, now_ms(), summary="finished"),
        registration=entry.registration,
    )


def test_a_handoff_replayed_on_activation_is_printed_exactly_once(master_lab: MasterLab) -> None:
    _terminal_worker(master_lab, "h3", "away")
    done = master_lab.cli("master", "--session-id", "away", "--once")
    expected = "handoff worker-h3: exited code 0, agent agent-h3: finished"
    assert handoff_lines(done.stdout, "worker-h3") == [expected]


def test_an_undelivered_handoff_survives_a_closed_record(master_lab: MasterLab) -> None:
    first = _terminal_worker(master_lab, "h4", "away")
    (handoff,) = first.undelivered
    # A relaunch registers a newer generation (the handoff is carried over), which is then
    # cleaned up by its owner: the record closes with the handoff still undelivered.
    newer = master_lab.store.register(make_entry("h4", parent_session_id="away"))
    assert [h.id for h in newer.undelivered] == [handoff.id]
    master_lab.store.update(
        newer.key, lambda e: lifecycle.close(e, "cleanup", now_ms()), registration=newer.registration
    )

    done = master_lab.cli("master", "--session-id", "away", "--once")
    assert done.returncode == 0, done.stderr
    assert handoff_lines(done.stdout, "worker-h4"), done.stdout


# --- scan, reconcile, tree --------------------------------------------------------------------------------
def _matrix_for_owner_verbs(master_lab: MasterLab) -> dict[str, Entry]:
    sleeper = spawn_sleeper()
    master_lab.popens.append(sleeper)
    alive = procs.identify(sleeper.pid)
    assert alive is not None
    me = procs.current()
    dead = dead_identity()
    work = master_lab.work
    complete = {"session_file": str(work / "s.jsonl"), "cwd": str(work), "provider": "pi"}
    entries = [
        make_entry("lead", role=Role.MASTER, process=me),
        make_entry(
            "kid1", process=alive, parent_pid=me.pid, parent_proc_start=me.start_ticks,
            parent_session_id="lead", task_ref="goal-1",
        ),
        make_entry(
            "kid2", status=Status.RESUMABLE, process=dead, parent_pid=me.pid,
            parent_proc_start=me.start_ticks, parent_session_id="lead",
        ),
        make_entry(
            "orphan", process=alive, parent_pid=dead.pid, parent_proc_start=dead.start_ticks,
            parent_session_id="gone", identity=make_identity("orphan", lane="lane-o"),
        ),
        make_entry(
            "crashed", process=dead, parent_pid=me.pid, parent_proc_start=me.start_ticks,
            parent_session_id="lead", identity=make_identity("crashed", **complete), task_ref="goal-2",
        ),
        make_entry("vanished", process=dead, parent_pid=me.pid, parent_proc_start=me.start_ticks,
                   parent_session_id="lead", identity=make_identity("vanished", provider="other")),
        make_entry("done", status=Status.CLOSED, process=dead),
    ]  # fmt: skip
    return {e.key: master_lab.store.register(e) for e in entries}


def test_scan_json_reports_orphans_and_writes_nothing(master_lab: MasterLab) -> None:
    _matrix_for_owner_verbs(master_lab)
    before = dir_digest(str(master_lab.state))

    done = master_lab.cli("scan", "--json")

    assert done.returncode == 0, done.stderr
    rows = {row["key"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"worker-orphan"}
    assert rows["worker-orphan"]["alive"] is True
    assert rows["worker-orphan"]["lane"] == "lane-o"
    assert rows["worker-orphan"]["parentSessionId"] == "gone"
    assert dir_digest(str(master_lab.state)) == before


def test_reconcile_dry_run_plans_and_writes_nothing(master_lab: MasterLab) -> None:
    _matrix_for_owner_verbs(master_lab)
    before = dir_digest(str(master_lab.state))

    done = master_lab.cli("reconcile", "--dry-run", "--json")

    assert done.returncode == 0, done.stderr
    plan = {row["key"]: row["action"] for row in json.loads(done.stdout)}
    assert plan == {
        "master-lead": "keep",
        "worker-kid1": "keep",
        "worker-kid2": "keep",
        "worker-orphan": "keep",
        "worker-crashed": "mark_resumable",
        "worker-vanished": "remove",
        "worker-done": "remove",
    }
    assert dir_digest(str(master_lab.state)) == before


def test_reconcile_removes_closed_records_and_repairs_a_dead_running_worker(master_lab: MasterLab) -> None:
    planted = _matrix_for_owner_verbs(master_lab)
    keys = ("master-lead", "worker-kid1", "worker-kid2", "worker-orphan")
    kept = {key: master_lab.raw(key) for key in keys}

    done = master_lab.cli("reconcile", "--json")

    assert done.returncode == 0, done.stderr
    applied = {row["key"]: row["action"] for row in json.loads(done.stdout)}
    assert applied == {
        "worker-crashed": "mark_resumable",
        "worker-vanished": "remove",
        "worker-done": "remove",
    }
    assert not (master_lab.state / "worker-done.json").exists()
    assert not (master_lab.state / "worker-vanished.json").exists()
    repaired = master_lab.entry("worker-crashed")
    assert repaired.status is Status.RESUMABLE and repaired.reason == "interrupted"
    assert repaired.registration == planted["worker-crashed"].registration
    assert repaired.resumable is not None
    assert repaired.resumable.identity == planted["worker-crashed"].identity
    assert repaired.resumable.task_ref == "goal-2"
    assert {key: master_lab.raw(key) for key in kept} == kept

    again = master_lab.cli("reconcile", "--json")
    assert json.loads(again.stdout) == []


def test_tree_json_groups_workers_under_their_master(master_lab: MasterLab) -> None:
    _matrix_for_owner_verbs(master_lab)
    before = dir_digest(str(master_lab.state))

    done = master_lab.cli("tree", "--json")

    assert done.returncode == 0, done.stderr
    tree = json.loads(done.stdout)
    (master,) = tree["masters"]
    assert master["key"] == "master-lead" and master["alive"] is True
    assert {w["key"] for w in master["workers"]} == {
        "worker-kid1", "worker-kid2", "worker-crashed", "worker-vanished",
    }  # fmt: skip
    kid1 = next(w for w in master["workers"] if w["key"] == "worker-kid1")
    assert kid1["alive"] is True and kid1["taskRef"] == "goal-1" and kid1["status"] == "running"
    assert {w["key"] for w in tree["unparented"]} == {"worker-orphan", "worker-done"}
    assert dir_digest(str(master_lab.state)) == before


def test_a_real_master_and_its_worker_show_up_in_the_tree(master_lab: MasterLab) -> None:
    master, _ = master_lab.headless_master("live")
    master_lab.start_worker("t1", master.pid, "live", "goal-9", lane="lane-t")
    done = master_lab.cli("tree", "--json")
    tree = json.loads(done.stdout)
    (node,) = tree["masters"]
    assert node["key"] == "master-live" and node["alive"] is True
    (worker,) = node["workers"]
    assert worker["key"] == "worker-t1"
    assert worker["alive"] and worker["childAlive"]
    assert worker["lane"] == "lane-t" and worker["taskRef"] == "goal-9"
    assert tree["unparented"] == []


def test_a_master_with_nothing_to_relaunch_loads_no_plugins(tmp_path: Path) -> None:
    """The plugins (entry points, pluggy, the matrix plugin) are loaded at a master's first
    relaunch: most masters never relaunch, and loading them was ~30 % of a master's start."""
    env = dict(os.environ, PI_MATRIX_STATE_DIR=str(tmp_path / "state"))
    modules, done = loaded("master", "--session-id", "b", "--headless", "--once", env=env)
    assert done.returncode == 0, done.stderr
    assert "master" in done.stdout and "active" in done.stdout, done.stdout
    names = ("pluggy", "importlib.metadata", "pi_tmux_matrix.dispatch.plugins")
    assert sorted(m for m in modules if m.startswith(names)) == []
