"""Issue 17, continued (tests/test_faults.py holds one test per case): a full disk reaching a
stop and the watcher; a stop that leaves a survivor.

A full disk is forced at our own write seams only (``fsio._write_all``: entries and records, the
results among them; ``mailbox._write_all``: the mailbox; ``mailbox._append_line``: the event log and
the agent's notices), in the process under test, through a ``sitecustomize`` on its
``PYTHONPATH``: every other process (the host a stop reaches, the test) writes as usual.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
from helpers import make_entry
from test_dispatch import Lab, sublab, wait_for  # noqa: F401 - sublab is a fixture

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

ENOSPC_LINE = "No space left on device"
SEAMS = {
    "records": "fsio._write_all = _full",
    "mailbox": "mailbox._write_all = _full",
    "events": "mailbox._append_line = _full",
}


def _full_disk(at: Path, *which: str) -> dict[str, str]:
    """The environment of a process whose disk is full at the ``which`` seams (all by default)."""
    folder = at / f"full-{'-'.join(which) or 'all'}"
    folder.mkdir(exist_ok=True)
    lines = [SEAMS[name] for name in which or SEAMS]
    (folder / "sitecustomize.py").write_text(
        "import errno\n"
        "from pi_tmux_matrix.matrix import fsio, mailbox\n"
        "def _full(*_args, **_kwargs):\n"
        f"    raise OSError(errno.ENOSPC, {ENOSPC_LINE!r})\n" + "\n".join(lines) + "\n"
    )
    return {**os.environ, "PYTHONPATH": str(folder)}


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


def _watchers_of(job_id: str) -> list[procs.ProcessIdentity]:
    return [p for p in procs.with_argument(job_id) if "watch" in (procs.cmdline(p) or [])]


def _end(*procs_: subprocess.Popen[bytes] | None) -> None:
    for proc in procs_:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


# --- case 11: a full disk ------------------------------------------------------------------------
def test_11_stop_job_on_a_full_disk_still_stops_its_agents_and_says_what_was_not_written(
    sublab: Lab,  # noqa: F811
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
    done = _cli(sublab.state, "stop", fired.job.id, "--confirm", "yes-tmux-stop", env=_full_disk(sublab.tmp))
    _one_error_line(done, "results", fired.job.id)
    assert procs.wait_for_exit(entry.process, 10), "the job's host was left running"
    assert not procs.is_alive(entry.child_process), "the job's agent was left running"
    # No stop message was queued, so nothing waited the host's own stop sequence out (15 s).
    assert time.monotonic() - started < 12


def test_11_a_deadline_whose_timeout_result_cannot_be_written_still_stops_the_agent(
    sublab: Lab,  # noqa: F811
) -> None:
    """The watcher's result write (here the deadline's ``timeout``) hits a full disk: the
    watcher ends with one error line, exit 1, and the agent is stopped all the same (the
    deadline is the owner's limit; it used to end the watcher with the agent left running)."""
    sublab.start_master()
    fired = sublab.fire("HANG long work", backend="subprocess")
    (agent,) = fired.job.agents
    entry = sublab.worker(agent.key)
    assert entry.process is not None and agent.log is not None
    # The fire's own watcher goes (it would see the deadline below too): ours is the round's only one.
    (own,) = wait_for("the fire's watcher", lambda: _watchers_of(fired.job.id))
    procs.send_signal(own, signal.SIGKILL)
    assert procs.wait_for_exit(own, 5)
    jobs = JobStore(sublab.store)
    # The round's deadline passed.
    jobs.update(
        fired.job.id,
        lambda j: attrs.evolve(j, agents=tuple(attrs.evolve(a, deadline_at=now_ms() - 1) for a in j.agents)),
    )
    done = _cli(
        sublab.state, "watch", "--job", fired.job.id, "--agent", agent.agent_id, "--round", "1",
        "--follow", agent.log, env=_full_disk(sublab.tmp), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    _one_error_line(done, "results")
    assert procs.wait_for_exit(entry.process, 10), "the agent outlived its deadline"


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
    from pi_tmux_matrix.dispatch.jobs import new_job_id, new_nonce
    from pi_tmux_matrix.dispatch.model import SUBPROCESS, Job, JobAgent, ResultKind

    host = subprocess.Popen(
        ["sleep", "60"], start_new_session=True, user=NOBODY, group=NOBODY, extra_groups=[]
    )  # another user's process: only CAP_KILL could signal it
    try:
        host_id = procs.identify(host.pid)
        assert host_id is not None
        store = MatrixStore(tmp_path / "state")
        store.register(make_entry("s6", process=host_id))
        agent = JobAgent(
            agent_id="a1", key="worker-s6", session_id="s6", profile="stand-in", provider="pi", mode="print",
            cwd=str(tmp_path), backend=SUBPROCESS, nonce=new_nonce(), round=1, deadline_at=now_ms() + 600_000,
            deadline_s=600.0, target=f"pid {host_id.pid}", host_pid=host_id.pid,
            host_start=host_id.start_ticks, boot_id=host_id.boot_id,
        )  # fmt: skip
        job = Job(
            id=new_job_id(), created_at=now_ms(), parent_pid=os.getpid(), parent_session_id="boss", task="t",
            profile="stand-in", team=None, agents=(agent,), backend=SUBPROCESS,
        )  # fmt: skip
        jobs = JobStore(store)
        jobs.create(job)
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
