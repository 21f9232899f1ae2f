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
import json
import os
import re
from pathlib import Path

from helpers import make_entry, make_identity, spawn_sleeper
from test_master import SETTINGS, Lab, adopted_by, lab, several_orphans, wait_for  # noqa: F401

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Status

N = 12
LINE = re.compile(r"^orphan (worker-\S+) \((exact|foreign), (alive|dead), [^)]*\): (.*)$", re.MULTILINE)


def _long_grace() -> None:
    """No orphan's grace may run out while a dozen hosts start on a shared machine."""
    settings = json.loads(json.dumps(SETTINGS))
    settings["processMatrix"]["adoptionGraceMs"] = 120_000
    (Path(os.environ["PI_CODING_AGENT_DIR"]) / "settings.json").write_text(json.dumps(settings))


def test_a_once_master_over_live_orphans_reports_each_grant_as_it_stands(lab: Lab) -> None:  # noqa: F811
    _long_grace()
    sessions: list[tuple[str, str | None]] = [(f"w{i}", None) for i in range(N)]
    orphans = several_orphans(lab, "boss", "goal-1", sessions)
    # One host cannot look at its entry during the activation (stopped): its grant waits untaken.
    stopped = lab.entry("worker-w0").process
    assert stopped is not None
    lab.pause(stopped)

    done = lab.run("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")

    assert done.returncode == 0, done.stderr
    once = lab.entry("master-boss")
    said = {m.group(1): m.group(4) for m in LINE.finditer(done.stdout)}
    assert sorted(said) == sorted(f"worker-{s}" for s, _ in sessions), done.stdout
    readopted = [k for k, text in said.items() if text.startswith("re-adopted")]
    assert said["worker-w0"].startswith("granted, not yet accepted"), done.stdout  # it was "re-adopted"
    for key, text in said.items():
        assert text.startswith(("re-adopted", "granted, not yet accepted")), (key, text)
        assert "one-shot master ends now" in text, text
        if key in readopted:
            # Said only of a host that accepted: its entry named this master (its own log says so).
            assert adopted_by(lab, key, once.pid or 0), (key, lab.events(key))
        else:
            assert "waiting for the worker's host to accept" in text, text
    assert not adopted_by(lab, "worker-w0", once.pid or 0)
    assert readopted, done.stdout  # live hosts take a grant at once: most are seen to

    # The one-shot master ended: whoever accepted counts its parent lost again (as the report said).
    def lost_again(key: str) -> bool:
        entry = lab.entry(key)
        return entry.status is Status.RESUMABLE and entry.reason == lifecycle.PARENT_LOST

    for key in readopted:
        wait_for(
            functools.partial(lost_again, key), 15, f"{key} resumable again after the one-shot master ended"
        )
    for proc, _entry in orphans.values():
        assert proc.poll() is None  # no host ended: its grace is long


def test_a_worker_another_launcher_resumes_is_reported_so_and_never_attempted(lab: Lab) -> None:  # noqa: F811
    _long_grace()
    dead = spawn_sleeper()
    lab.popens.append(dead)
    parent = procs.identify(dead.pid)
    new_host = spawn_sleeper()
    lab.popens.append(new_host)
    host = procs.identify(new_host.pid)
    assert parent is not None and host is not None
    dead.kill()
    dead.wait()
    entry = make_entry(
        "wl", status=Status.LAUNCHING, process=host, identity=make_identity("wl", cwd=str(lab.root)),
        parent_pid=parent.pid, parent_proc_start=parent.start_ticks, parent_session_id="boss",
        task_ref="goal-1", reason=lifecycle.RELAUNCH,
    )  # fmt: skip
    lab.store.create(entry)
    before = lab.raw(entry.key)

    done = lab.run("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")

    assert done.returncode == 0, done.stderr
    line = f"orphan {entry.key} (exact, alive, agent agent-wl, lane -): skipped: "
    assert f"{line}being launched by another launcher (pid {host.pid})" in done.stdout, done.stdout
    assert "cannot move to adopted" not in done.stdout + done.stderr
    assert lab.raw(entry.key) == before  # nothing was written over the launcher's claim
