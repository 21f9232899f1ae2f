"""Issue 30.8: the activation report says what happened, not what was asked for.

An adoption grant is ``re-adopted`` only once the worker's host is seen to accept it (its entry's
parent becomes the master); otherwise ``granted, not yet accepted``. A worker another launcher
is resuming (``launching``) is reported as such and never attempted (it used to be ``exact,
alive`` then ``failed: status launching cannot move to adopted``). ``master --once`` says that
its adoptions end with it: a worker that accepted sees its parent die again and waits
``resumable`` (why 85 of 100 were ``resumable`` 5 s after ``re-adopted``). Real hosts of the
stand-in agent whose master was killed -9.
"""

from __future__ import annotations

import functools
import re

from helpers import make_entry, make_identity, spawn_sleeper
from masterlab import MasterLab, adopted_by, several_orphans
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Status

N = 12
LINE = re.compile(r"^orphan (worker-\S+) \((exact|foreign), (alive|dead), [^)]*\): (.*)$", re.MULTILINE)


def _long_grace(lab: MasterLab) -> None:
    """No orphan's grace may run out while a dozen hosts start on a shared machine."""
    lab.settings.set(adoptionGraceMs=120_000)


def test_a_once_master_over_live_orphans_reports_each_grant_as_it_stands(master_lab: MasterLab) -> None:
    _long_grace(master_lab)
    sessions: list[tuple[str, str | None]] = [(f"w{i}", None) for i in range(N)]
    orphans = several_orphans(master_lab, "boss", "goal-1", sessions)
    # One host cannot look at its entry during the activation (stopped): its grant waits untaken.
    stopped = master_lab.entry("worker-w0").process
    assert stopped is not None
    master_lab.pause(stopped)

    done = master_lab.cli("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")

    assert done.returncode == 0, done.stderr
    once = master_lab.entry("master-boss")
    said = {m.group(1): m.group(4) for m in LINE.finditer(done.stdout)}
    assert sorted(said) == sorted(f"worker-{s}" for s, _ in sessions), done.stdout
    readopted = [k for k, text in said.items() if text.startswith("re-adopted")]
    assert said["worker-w0"].startswith("granted, not yet accepted"), done.stdout  # it was "re-adopted"
    for key, text in said.items():
        assert text.startswith(("re-adopted", "granted, not yet accepted")), (key, text)
        assert "one-shot master ends now" in text, text
        if key in readopted:
            # Said only of a host that accepted: its entry named this master (its own log says so).
            assert adopted_by(master_lab, key, once.pid or 0), (key, master_lab.events(key))
        else:
            assert "waiting for the worker's host to accept" in text, text
    assert not adopted_by(master_lab, "worker-w0", once.pid or 0)
    assert readopted, done.stdout  # live hosts take a grant at once: most are seen to

    # The one-shot master ended: whoever accepted counts its parent lost again (as the report said).
    def lost_again(key: str) -> bool:
        entry = master_lab.entry(key)
        return entry.status is Status.RESUMABLE and entry.reason == lifecycle.PARENT_LOST

    for key in readopted:
        wait_for(
            f"{key} resumable again after the one-shot master ended", functools.partial(lost_again, key), 15
        )
    for proc, _entry in orphans.values():
        assert proc.poll() is None  # no host ended: its grace is long


def test_a_worker_another_launcher_resumes_is_reported_so_and_never_attempted(master_lab: MasterLab) -> None:
    _long_grace(master_lab)
    dead = spawn_sleeper()
    master_lab.popens.append(dead)
    parent = procs.identify(dead.pid)
    new_host = spawn_sleeper()
    master_lab.popens.append(new_host)
    host = procs.identify(new_host.pid)
    assert parent is not None and host is not None
    dead.kill()
    dead.wait()
    entry = make_entry(
        "wl", status=Status.LAUNCHING, process=host, identity=make_identity("wl", cwd=str(master_lab.work)),
        parent_pid=parent.pid, parent_proc_start=parent.start_ticks, parent_session_id="boss",
        task_ref="goal-1", reason=lifecycle.RELAUNCH,
    )  # fmt: skip
    master_lab.store.create(entry)
    before = master_lab.raw(entry.key)

    done = master_lab.cli("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")

    assert done.returncode == 0, done.stderr
    line = f"orphan {entry.key} (exact, alive, agent agent-wl, lane -): skipped: "
    assert f"{line}being launched by another launcher (pid {host.pid})" in done.stdout, done.stdout
    assert "cannot move to adopted" not in done.stdout + done.stderr
    assert master_lab.raw(entry.key) == before  # nothing was written over the launcher's claim
