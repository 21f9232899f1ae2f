"""What a fire makes durable, and with how many fsyncs (issue 30 point 4: twenty fires one after
another wait for each fsync in turn, each a journal commit that costs milliseconds while other
hosts start and write).

``os.fsync`` is observed in this process (the one door of the state dir's fsyncs, fsio's
``_fsync``, calls it, as the session header's does): each call's file and whether it is a folder.
Real tmux on a private socket, real hosts (held before they register, so only the fire writes).
"""

from __future__ import annotations

import os
import stat

import pytest
from labs import Lab
from seams import HOLD, gated_pythonpath

from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.errors import DispatchError, StoreError
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore


def _observe_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    seen: list[tuple[str, bool]] = []
    real = os.fsync

    def observed(fd: int) -> None:
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(os.fstat(fd).st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", observed)
    return seen


def test_a_fire_fsyncs_each_record_once_and_only_the_jobs_folder(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One agent: its job record's two versions, its ``launching`` entry and its session header,
    each fsynced once before it counts; of the folders only ``jobs/``, once, after the job's last
    version got its name (that one fsync keeps the create and the update). The state root is not
    fsynced for the ``launching`` entry, which a crash makes moot (its host dies with it). Five
    fsyncs; there were seven (``jobs/`` twice, the state root once)."""
    lab.start_master()
    # No host registers while we count (they are other processes anyway).
    pythonpath = gated_pythonpath(lab.tmp, HOLD)
    seen = _observe_fsyncs(monkeypatch)
    fired = lab.fire("HANG counted", env={"PYTHONPATH": pythonpath})
    monkeypatch.undo()
    (lab.tmp / "gate").unlink()
    (agent,) = fired.job.agents
    jobs_dir = str(lab.state / "jobs")
    folders = [path for path, is_dir in seen if is_dir]
    files = [os.path.basename(path) for path, is_dir in seen if not is_dir]
    assert folders == [jobs_dir], seen
    assert sorted(files) == sorted(
        [f".{fired.job.id}.json.tmp", f".{fired.job.id}.json.tmp", f".{agent.key}.json.tmp",
         os.path.basename(str(agent.session_file))]
    ), seen  # fmt: skip
    # The folder's fsync comes after both versions of the job were fsynced (and named).
    assert [p for p, _ in seen].index(jobs_dir) > max(
        i for i, (p, _) in enumerate(seen) if p.endswith(f".{fired.job.id}.json.tmp")
    ), seen
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


def test_a_fire_reads_the_state_dir_whole_once_under_its_cap_lock(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fire's parent check and its task ref read the master's own entry by its key; only the
    cap check (under the fire lock) lists every entry. Each listing reads every file: at 100
    agents a fire read the state dir three times (issue 30.4). Other agents' entries are there."""
    lab.start_master()
    pythonpath = gated_pythonpath(lab.tmp, HOLD)
    lab.fire("HANG first", env={"PYTHONPATH": pythonpath})
    listings: list[int] = []
    real_list = MatrixStore.list

    def counted(self: MatrixStore) -> object:
        listings.append(1)
        return real_list(self)

    monkeypatch.setattr(MatrixStore, "list", counted)
    lab.fire("HANG counted", env={"PYTHONPATH": pythonpath})
    monkeypatch.undo()
    (lab.tmp / "gate").unlink()
    assert len(listings) == 1, listings
