"""Issue 20 item 16: one unreadable file never costs a listing. ``jobs`` and ``job ID`` show the job
whose agent's entry is corrupt (and warn); ``ls``, ``tree`` and ``scan`` end their warnings with
the ``repair`` hint; a file a newer pi-matrix wrote says to upgrade, never to run ``repair``
(which leaves such files alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_entry, plant_job, run_main

from pi_tmux_matrix.matrix.store import MatrixStore

JOB = "job-20261205-071800-a1b2c3"


@pytest.fixture
def damaged(store: MatrixStore, tmp_path: Path) -> MatrixStore:
    store.create(make_entry("ok1"))
    plant_job(store, JOB, tmp_path)  # its agent's entry is worker-j1
    (store.root / "worker-j1.json").write_text("{garbage")
    return store


@pytest.mark.parametrize("argv", [["jobs"], ["jobs", "--json"], ["job", JOB], ["job", JOB, "--json"]])
def test_a_corrupt_agent_entry_never_costs_the_job(damaged: MatrixStore, argv: list[str]) -> None:
    code, out, err = run_main("--state-dir", str(damaged.root), *argv)
    assert code == 0, err
    assert JOB in out and "worker-j1" in out
    assert "pi-matrix: warning: " in err and "worker-j1.json" in err and "invalid JSON" in err


@pytest.mark.parametrize("verb", ["ls", "tree", "scan"])
def test_listing_warnings_end_with_the_repair_hint(damaged: MatrixStore, verb: str) -> None:
    code, out, err = run_main("--state-dir", str(damaged.root), verb)
    assert code == 0
    lines = err.strip().splitlines()
    assert lines[0].startswith("pi-matrix: warning: ") and "worker-j1.json" in lines[0]
    assert lines[-1].startswith("pi-matrix: hint: run 'pi-matrix repair'"), err
    if verb != "scan":
        assert "worker-ok1" in out


def _newer(store: MatrixStore) -> None:
    store.create(make_entry("new1"))
    path = store.root / "worker-new1.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "schemaVersion": 99}))


def test_a_newer_schema_says_upgrade_not_repair(store: MatrixStore) -> None:
    _newer(store)
    code, _, err = run_main("--state-dir", str(store.root), "show", "worker-new1")
    assert code == 1
    assert "upgrade pi-matrix" in err and "run 'pi-matrix repair'" not in err, err
    code, _, err = run_main("--state-dir", str(store.root), "ls")
    assert code == 0 and "upgrade pi-matrix" in err and "run 'pi-matrix repair'" not in err, err
    code, out, _ = run_main("--state-dir", str(store.root), "repair", "--dry-run")
    assert out.startswith("skip ") and "worker-new1.json" in out  # repair indeed leaves it alone


def test_a_newer_job_record_says_upgrade(store: MatrixStore, tmp_path: Path) -> None:
    plant_job(store, JOB, tmp_path)
    path = store.root / "jobs" / f"{JOB}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "schemaVersion": 99}))
    code, _, err = run_main("--state-dir", str(store.root), "job", JOB)
    assert code == 1 and "newer pi-matrix" in err and "upgrade pi-matrix" in err
    assert "run 'pi-matrix repair'" not in err, err
