"""A worker whose host and agent are both killed -9 under a living master: the master notices at
its next look (here a 1 s heartbeat) and says how to get it back, and ``pi-matrix resume`` works at
once, with no ``reconcile`` first (issue 31.6: ``tree`` said ``running (adopted)`` 15 s later, and
resume refused with "status running is not resumable").

A real headless master, a stand-in worker fired into a private tmux server, real kills."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from labs import Lab
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix.model import Entry, Status


def _killed_outright(lab: Lab) -> Entry:
    """One worker up under the lab's master, then its host and its agent killed -9."""
    (agent,) = lab.fire("HANG a long task").job.agents
    worker = lab.worker(agent.key)
    for identity in (worker.process, worker.child_process):
        assert identity is not None
        procs.send_signal(identity, signal.SIGKILL)
        assert procs.wait_for_exit(identity, 10)
    return worker


def _running(lab: Lab, key: str) -> Entry | None:
    found = lab.store.find(key)
    return found if found is not None and found.status is Status.RUNNING and found.child_pid else None


def _closed(lab: Lab, key: str) -> Entry | None:
    found = lab.store.find(key)
    return found if found is not None and found.status is Status.CLOSED else None


def _slow_master(lab: Lab) -> None:
    """A master that looks only once a minute: what is seen meanwhile is resume's own doing."""
    path = lab.agent_dir / "settings.json"
    settings = json.loads(path.read_text())
    settings["processMatrix"].update(heartbeatMs=60_000, watcherPollMs=60_000)
    path.write_text(json.dumps(settings))


def test_a_living_master_notices_its_worker_killed_outright_and_says_how_to_resume(lab: Lab) -> None:
    master = lab.start_master()
    worker = _killed_outright(lab)
    resumable = wait_for(
        f"{worker.key} to be resumable (the master's 1 s look)",
        lambda: e if (e := lab.store.find(worker.key)) and e.status is Status.RESUMABLE else None,
        timeout=15,
    )
    assert resumable.reason == "interrupted"
    said = next(lab.tmp.glob(f"master-{master.identity.session_id}.*.out"))
    wait_for("the master's word", lambda: f"resumable: pi-matrix resume {worker.key}" in said.read_text())


def test_resume_works_at_once_without_a_reconcile(lab: Lab) -> None:
    _slow_master(lab)
    master = lab.start_master()
    worker = _killed_outright(lab)
    assert lab.store.get(worker.key).status is Status.RUNNING  # nobody looked yet
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", worker.key, "--parent-pid", str(master.pid),
         "--parent-session", master.identity.session_id, "--socket", lab.socket],
        cwd=lab.work, env=lab.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    back = wait_for(f"{worker.key} running again", lambda: _running(lab, worker.key), timeout=30)
    assert back.process is not None and back.process != worker.process
    lab.started += [i for i in (back.process, back.child_process) if i is not None]


def test_a_dry_run_resume_of_a_worker_killed_outright_writes_nothing(lab: Lab) -> None:
    _slow_master(lab)
    master = lab.start_master()
    worker = _killed_outright(lab)
    before = lab.store.get(worker.key)
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", worker.key, "--dry-run", "--parent-pid",
         str(master.pid), "--parent-session", master.identity.session_id],
        cwd=lab.work, env=lab.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"would resume {worker.key}")
    assert lab.store.get(worker.key).generation == before.generation  # untouched


def test_a_master_killed_outright_is_gone_in_every_view_not_running(lab: Lab) -> None:
    """Issue 31.7: ``ls`` listed a master killed -9 ``running`` beside ALIVE ``no``. Every view now
    says the same true word for it: ``gone (recorded running)``; its record is left as it is."""
    lab.start_master()
    found = lambda: e if (e := lab.store.find("master-boss")) and e.child_pid else None  # noqa: E731
    master = wait_for("the master's agent", found)
    for identity in (master.process, master.child_process):
        assert identity is not None
        procs.send_signal(identity, signal.SIGKILL)
        assert procs.wait_for_exit(identity, 10)
    for verb in (["ls"], ["tree"], ["top", "--once"]):
        done = subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", *verb], cwd=lab.work, env=dict(lab.env, COLUMNS="200"),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (line,) = [row for row in done.stdout.splitlines() if master.key in row]
        assert "gone (recorded running)" in line, (verb, done.stdout)
        assert " running " not in f"{line} ".replace("recorded running", ""), (verb, line)
    assert lab.store.get(master.key).status is Status.RUNNING  # a view writes nothing


def test_one_stop_reads_the_same_whether_its_handoff_was_owed_or_not(lab: Lab) -> None:
    """Issue 31.7: ``stop JOB`` on a working agent recorded ``closed (delivered)`` and top's ``s``
    on an idle finished one ``closed (killed)`` for the same act. A closed record now keeps how its
    agent ended: ``killed``, then ``delivered`` when a handoff was owed."""
    lab.start_master()
    (working,) = lab.fire("HANG busy").job.agents
    lab.worker(working.key)
    finished_job = lab.fire("quick one").job
    (finished,) = finished_job.agents
    lab.worker(finished.key)
    wait_for("the finished round", lambda: lab.result(finished_job.id, finished.agent_id))
    delivered = lambda: all(h.delivered_at for h in lab.store.get(finished.key).handoffs)  # noqa: E731
    wait_for("its handoff delivered", delivered)
    for key in (working.key, finished.key):
        done = subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", "stop", key, "--confirm", "yes-tmux-stop"],
            cwd=lab.work, env=lab.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    for key in (working.key, finished.key):
        entry = wait_for(f"{key} closed", lambda k=key: _closed(lab, k))
        # How it ended first, then (when its handoff was owed) that it was delivered.
        assert entry.reason in ("killed", "killed, delivered"), entry
