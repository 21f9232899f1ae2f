"""What a fire makes durable, and with how many fsyncs (issue 30 point 4: twenty fires one after
another wait for each fsync in turn, each a journal commit that costs milliseconds while other
hosts start and write).

``os.fsync`` is observed in this process (the one door of the state dir's fsyncs, fsio's
``_fsync``, calls it, as the session header's does): each call's file, whether it is a folder and
whether the fire's own thread made it.
Real tmux on a private socket, real hosts (held before they register, so only the fire writes).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import attrs
import pytest
from labs import Lab
from seams import DIE, HOLD, gated_pythonpath
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore, new_job_id
from pi_tmux_matrix.dispatch.model import SUBPROCESS, ResultKind
from pi_tmux_matrix.errors import DispatchError, StoreError
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore


def _observe_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, bool]]:
    """Each fsync: its file, whether a folder, whether made by the fire's own thread."""
    seen: list[tuple[str, bool, bool]] = []
    real = os.fsync

    def observed(fd: int) -> None:
        own = threading.current_thread() is threading.main_thread()
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(os.fstat(fd).st_mode), own))
        real(fd)

    monkeypatch.setattr(os, "fsync", observed)
    return seen


def test_a_fire_fsyncs_each_record_once_and_waits_only_for_the_record_of_its_panes(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One agent: its job record's two versions, its ``launching`` entry and its session header,
    each fsynced once before it counts; of the folders only ``jobs/``, once, after the job's first
    version got its name. The state root is not fsynced for the ``launching`` entry, which a
    crash makes moot (its host dies with it). Five fsyncs; there were seven (``jobs/`` twice, the
    state root once). The fire's own thread makes one, after its tmux call: the update recording
    its panes (there were three: the job's first version's before the tmux call, the update's
    file and its folder). The rest run beside: the job's first version, file and folder, during
    the tmux call (its hosts wait for it); the update's own folder fsync is left out
    (docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs)."""
    lab.start_master()
    # No host registers while we count (they are other processes anyway).
    pythonpath = gated_pythonpath(lab.tmp, HOLD)
    seen = _observe_fsyncs(monkeypatch)
    fired = lab.fire("HANG counted", env={"PYTHONPATH": pythonpath})
    monkeypatch.undo()
    (lab.tmp / "gate").unlink()
    (agent,) = fired.job.agents
    jobs_dir = str(lab.state / "jobs")
    job_tmp = f".{fired.job.id}.json.tmp"
    folders = [path for path, is_dir, _ in seen if is_dir]
    files = [os.path.basename(path) for path, is_dir, _ in seen if not is_dir]
    assert folders == [jobs_dir], seen
    assert sorted(files) == sorted(
        [job_tmp, job_tmp, f".{agent.key}.json.tmp", os.path.basename(str(agent.session_file))]
    ), seen
    assert [os.path.basename(p) for p, _, own in seen if own] == [job_tmp], seen
    # The folder's fsync comes after the job's first version was fsynced (and named).
    paths = [p for p, _, _ in seen]
    assert paths.index(jobs_dir) > paths.index(os.path.join(jobs_dir, job_tmp)), seen
    # What the fire returned is what is on disk, the entry included.
    assert JobStore(lab.store).get(fired.job.id) == fired.job
    entry = lab.store.find(agent.key)
    assert entry is not None and entry.status is Status.LAUNCHING and entry.pid == agent.host_pid


def test_a_launching_entry_the_disk_refuses_fails_the_fire_after_its_job_recorded_the_host(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``launching`` entry is written beside the job's update: when it cannot be written the
    fire still fails, naming it, and the job record names the host that runs (it used to be left
    out of the record, as if it had not started)."""
    lab.start_master()
    real_create = MatrixStore.create

    def refusing(store: MatrixStore, entry: object, **kwargs: object) -> object:
        if getattr(entry, "status", None) is Status.LAUNCHING:
            raise StoreError("launching entry: write failed (No space left on device)")
        return real_create(store, entry, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(MatrixStore, "create", refusing)
    with pytest.raises(DispatchError, match="launching entry") as failed:
        lab.fire("HANG refused")
    monkeypatch.undo()
    (job,) = JobStore(lab.store).list_jobs()[0]
    (agent,) = job.agents
    assert agent.host is not None and agent.pane_id is not None, job
    lab.started.append(agent.host)
    assert job.id in str(failed.value) and agent.agent_id in str(failed.value)


def _listings_of_a_fire(lab: Lab, monkeypatch: pytest.MonkeyPatch, pythonpath: str) -> tuple[int, str]:
    """How many times one fire listed the state dir, and its refusal ('' if it launched)."""
    listings: list[int] = []
    real_list = MatrixStore.list

    def counted(self: MatrixStore) -> object:
        listings.append(1)
        return real_list(self)

    monkeypatch.setattr(MatrixStore, "list", counted)
    refused = ""
    try:
        lab.fire("HANG counted", env={"PYTHONPATH": pythonpath})
    except DispatchError as exc:
        refused = str(exc)
    finally:
        monkeypatch.undo()
    return len(listings), refused


def test_a_fire_under_its_cap_reads_no_entry_and_one_near_it_reads_the_state_dir_once(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fire's parent check and its task ref read the master's own entry by its key; the cap
    check (under the fire lock) counts the workers' entry files by name, and reads them only when
    that count reaches the cap: then it lists every entry once. Each listing reads every file: at
    100 agents a fire read the state dir three times, then once (issue 30.4); now none while the
    fleet is under its cap. Other agents' entries are there."""
    lab.settings.set(maxConcurrentAgents=2)
    lab.start_master()
    pythonpath = gated_pythonpath(lab.tmp, HOLD)
    lab.fire("HANG first", env={"PYTHONPATH": pythonpath})
    assert _listings_of_a_fire(lab, monkeypatch, pythonpath) == (0, "")  # 1 worker file + 1 <= 2
    listings, refused = _listings_of_a_fire(lab, monkeypatch, pythonpath)  # 2 + 1 > 2: read
    assert listings == 1 and "maxConcurrentAgents=2" in refused, (listings, refused)
    (lab.tmp / "gate").unlink()


def test_a_job_whose_record_of_its_panes_a_crash_undid_is_settled_with_its_boot(lab: Lab) -> None:
    """The fire's update recording its hosts and panes is not made durable on its own: a crash
    may undo it, leaving the job's first version, whose agents name only the boot they were
    launched in. After that boot, ``jobs`` settles such an agent as ended (its host ended with
    the boot): an ``exited`` result and a finished job, or an orphaned one when unwatched, never
    ``running`` for good (both stayed ``running`` before agents named their boot)."""
    lab.start_master()
    pythonpath = gated_pythonpath(lab.tmp, DIE)  # nothing of this launch outlives it, as after a crash
    fired = lab.fire("HANG crashed", env={"PYTHONPATH": pythonpath})
    (agent,) = fired.job.agents
    assert agent.boot_id == procs.boot_id()
    wait_for("the host to end", lambda: not procs.is_alive(agent.host) or None)
    # The first version as a crash in an earlier boot left it: no host, no pane, that boot's id.
    first = attrs.evolve(
        agent, pane_id=None, target=None, host_pid=None, host_start=None, boot_id="0" * 8 + "-ended-boot"
    )
    jobs = JobStore(lab.store)
    jobs.jobs.put(fired.job.id, attrs.evolve(fired.job, agents=(first,)))
    listed = lab.cli("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    (view,) = [v for v in json.loads(listed.stdout) if v["jobId"] == fired.job.id]
    assert view["state"] == "finished", view
    result = lab.result(fired.job.id, agent.agent_id)
    assert result is not None and result.kind is ResultKind.EXITED, result
    assert result.detail == "the host ended without recording an exit", result
    # A job of unwatched agents (a workspace) gets no results: it is orphaned instead.
    unwatched = attrs.evolve(fired.job, id=new_job_id(), watched=False, agents=(first,))
    jobs.create(unwatched)
    listed = lab.cli("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    (view,) = [v for v in json.loads(listed.stdout) if v["jobId"] == unwatched.id]
    assert view["state"] == "orphaned", view


def test_a_host_started_before_its_job_record_is_written_waits_for_it(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's first version is written beside the tmux call, so a host can start before it
    is there (a disk slow to write it, made so here): the host waits for it and its round is
    watched as usual. Before the host waited, its rounds went unwatched (no result, ever)."""
    lab.start_master()
    real = JobStore.create

    def slow(self: JobStore, *args: object, **kwargs: object) -> object:
        time.sleep(1.5)  # the host is well past its start by then
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(JobStore, "create", slow)
    fired = lab.fire("slowly recorded")
    monkeypatch.undo()
    (agent,) = fired.job.agents
    result = wait_for("the round's result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=30)
    assert result.kind is ResultKind.DONE, result


def test_a_fire_whose_job_record_cannot_be_written_fails_and_its_host_starts_nothing(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's create fails (a full disk, forced at its seam): the fire fails naming the record,
    and its host, which waited for the record in vain (the wait cut to 1 s here), ends with
    nothing started; no agent ran unwatched."""
    lab.start_master()
    seam = lab.tmp / "short-wait"
    seam.mkdir()
    (seam / "sitecustomize.py").write_text(
        "import pi_tmux_matrix.dispatch.jobs as jobs\njobs.JOB_WAIT_S = 1.0\n"
    )
    pythonpath = os.pathsep.join(filter(None, [str(seam), os.environ.get("PYTHONPATH")]))

    def full(self: JobStore, *args: object, **kwargs: object) -> object:
        raise StoreError("jobs/: No space left on device")

    monkeypatch.setattr(JobStore, "create", full)
    request_env = {"PYTHONPATH": pythonpath}
    with pytest.raises(DispatchError) as raised:
        lab.fire("never recorded", env=request_env, backend=SUBPROCESS)
    monkeypatch.undo()
    said = str(raised.value)
    assert "its record could not be written" in said and "start no agent" in said, said
    (log,) = wait_for("the host's log", lambda: list((lab.state / "logs").glob("*.log")) or None)
    text = wait_for("the host's end", lambda: "nothing started" in (t := log.read_text()) and t, timeout=20)
    assert "no job" in text, text
    workers = [e for e in lab.store.list().entries if e.role.value == "worker"]
    assert [e for e in workers if e.status is Status.RUNNING or e.child_pid is not None] == [], workers
