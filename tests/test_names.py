"""Issue 20 item 7: the names a person types. A unique prefix of a key or job id, or an agent id
naming one entry, is accepted by every verb that takes one; an ambiguous one is refused with the
candidates listed (exit 2); keys and job ids complete from the state dir."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_entry, make_identity, plant_job, run_main

from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

LONG = "7b31747a-0f2c-4c1e-9d3b-5e6f7a8b9c0d"  # a generated session id's shape: 43-char key


@pytest.fixture
def named(store: MatrixStore) -> MatrixStore:
    store.create(make_entry(LONG, identity=make_identity(LONG, agent_id="reviewer")))
    store.create(make_entry("ab1"))
    store.create(make_entry("ab2"))
    store.create(make_entry("twin1", identity=make_identity("twin1", agent_id="twin")))
    store.create(make_entry("twin2", identity=make_identity("twin2", agent_id="twin")))
    return store


def test_a_unique_prefix_of_a_key_or_its_session_id_names_the_entry(named: MatrixStore) -> None:
    for word in ("worker-7b31747a", "worker-7b3", "7b31747a"):
        code, out, err = run_main("--state-dir", str(named.root), "show", word)
        assert code == 0, (word, err)
        assert out.startswith(f"worker-{LONG}  worker  running"), out


def test_a_key_pasted_as_a_table_shows_it_with_its_ellipsis_names_the_entry(named: MatrixStore) -> None:
    """Issue 20.2: ``top`` and ``ls`` shorten a key to its unique prefix and an ellipsis; that cell,
    pasted into any verb, names the entry (it was ``no such entry``)."""
    from pi_tmux_matrix.cli.render import shorten, unique_prefix_length

    keys = [e.key for e in named.list().entries]
    cell = shorten(f"worker-{LONG}", unique_prefix_length(keys, 12))
    assert cell.endswith("…") and len(cell) < len(f"worker-{LONG}")
    for argv in (["show", cell], ["show", "--json", cell]):
        code, out, err = run_main("--state-dir", str(named.root), *argv)
        assert code == 0, (argv, err)
        assert LONG in out
    code, _out, err = run_main("--state-dir", str(named.root), "show", "worker-ab…")
    assert code == 2 and "is ambiguous" in err
    code, _out, err = run_main("--state-dir", str(named.root), "show", "…")
    assert code == 2 and "empty" in err


def test_an_ambiguous_prefix_is_refused_listing_the_candidates(named: MatrixStore) -> None:
    code, out, err = run_main("--state-dir", str(named.root), "show", "worker-ab")
    assert code == 2 and out == ""
    assert "'worker-ab' is ambiguous" in err and "worker-ab1, worker-ab2" in err
    assert len(err.strip().splitlines()) == 1


def test_an_agent_id_naming_one_entry_is_accepted_and_two_are_refused(named: MatrixStore) -> None:
    code, out, _ = run_main("--state-dir", str(named.root), "show", "reviewer")
    assert code == 0 and out.startswith(f"worker-{LONG}")
    code, _, err = run_main("--state-dir", str(named.root), "show", "twin")
    assert code == 2 and "worker-twin1, worker-twin2" in err


def test_nothing_matching_is_not_found_and_the_exact_key_wins_over_a_longer_one(named: MatrixStore) -> None:
    code, _, err = run_main("--state-dir", str(named.root), "show", "worker-zz")
    assert code == 3 and "no such entry" in err
    named.create(make_entry("ab"))
    code, out, _ = run_main("--state-dir", str(named.root), "show", "worker-ab")
    assert code == 0 and out.startswith("worker-ab  ")


@pytest.mark.parametrize(
    "argv",
    [
        ["adopt", "7b31747a"],
        ["cleanup", "7b31747a"],
        ["send", "7b31747a", "--abort"],
        ["stop", "7b31747a"],
        ["resume", "7b31747a", "--dry-run"],
    ],
)
def test_every_verb_that_takes_a_key_resolves_it_the_same_way(named: MatrixStore, argv: list[str]) -> None:
    """Each verb gets past the name to its own next check (a master, a live host), and an
    ambiguous word is refused by all of them in the same words."""
    code, _, err = run_main("--state-dir", str(named.root), *argv)
    assert "no such entry" not in err and "invalid" not in err, err
    assert f"worker-{LONG}" in err or "calling master" in err or code == 0, err
    code, _, err = run_main("--state-dir", str(named.root), argv[0], "ab", *argv[2:])
    assert code == 2 and "'ab' is ambiguous: it names worker-ab1, worker-ab2" in err, err


def test_job_ids_resolve_by_prefix_and_stop_tells_keys_from_jobs(named: MatrixStore, tmp_path: Path) -> None:
    plant_job(named, "job-20261205-071800-a1b2c3", tmp_path)
    plant_job(named, "job-20261205-071900-d4e5f6", tmp_path)
    root = str(named.root)
    code, out, err = run_main("--state-dir", root, "job", "job-20261205-0718", "--json")
    assert code == 0, err
    assert '"jobId": "job-20261205-071800-a1b2c3"' in out
    code, _, err = run_main("--state-dir", root, "job", "job-2026")
    assert code == 2 and "job-20261205-071800-a1b2c3, job-20261205-071900-d4e5f6" in err
    code, _, err = run_main("--state-dir", root, "var", "job-20261205-0719")
    assert code == 0, err
    # stop takes either: a job prefix previews the job, a key prefix the agent.
    code, out, _ = run_main("--state-dir", root, "stop", "job-20261205-0719")
    assert code == 2 and "would stop job job-20261205-071900-d4e5f6" in out
    code, _, err = run_main("--state-dir", root, "job", "job-nope")
    assert code == 3 and "no job 'job-nope'" in err


def test_completion_offers_the_keys_and_job_ids_in_the_state_dir(named: MatrixStore, tmp_path: Path) -> None:
    plant_job(named, "job-20261205-071800-a1b2c3", tmp_path)
    code, out, _ = run_main("--state-dir", str(named.root), "complete-names", "entry", "job")
    assert code == 0
    assert out.splitlines() == sorted(
        [
            f"worker-{LONG}",
            "worker-ab1",
            "worker-ab2",
            "worker-twin1",
            "worker-twin2",
            "job-20261205-071800-a1b2c3",
        ]
    )
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    # The real bash script, completing `pi-matrix --state-dir S show worker-a<TAB>`.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "pi-matrix"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m pi_tmux_matrix "$@"\n')
    shim.chmod(0o755)
    script = run_main("completion", "bash")[1]
    probe = (
        script
        + f"COMP_WORDS=(pi-matrix --state-dir {named.root} show worker-a); COMP_CWORD=4; _pi_matrix\n"
        + 'printf "%s\\n" "${COMPREPLY[@]}"\n'
        + f"COMP_WORDS=(pi-matrix --state-dir {named.root} stop job-); COMP_CWORD=4; _pi_matrix\n"
        + 'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.stdout.split() == ["worker-ab1", "worker-ab2", "job-20261205-071800-a1b2c3"], done.stderr


def test_a_stopped_entrys_key_is_still_named_by_its_prefix(store: MatrixStore) -> None:
    store.create(make_entry("gone1", status=Status.TERMINAL))
    code, out, _ = run_main("--state-dir", str(store.root), "show", "gone")
    assert code == 0 and out.startswith("worker-gone1")


def test_fork_run_ids_resolve_by_prefix_too(store: MatrixStore, tmp_path: Path) -> None:
    from pi_tmux_matrix.fork.model import ForkRun, RunMode, RunStatus
    from pi_tmux_matrix.fork.store import RunStore

    runs = RunStore(store)
    for run_id in ("run-20261205-071800-abcdef", "run-20261205-071900-fedcba"):
        now = now_ms()
        runs.put(
            ForkRun(
                id=run_id, cwd=str(tmp_path), task="t", mode=RunMode.BACKGROUND, created_at_ms=now,
                updated_at_ms=now, status=RunStatus.COMPLETED, ended_at_ms=now,
            ),
            exclusive=True,
        )  # fmt: skip
    root = str(store.root)
    code, out, err = run_main("--state-dir", root, "runs", "run-20261205-0718", "--json")
    assert code == 0 and '"run-20261205-071800-abcdef"' in out, err
    code, _, err = run_main("--state-dir", root, "runs", "run-2026")
    assert code == 2 and "run-20261205-071800-abcdef, run-20261205-071900-fedcba" in err
    code, out, _ = run_main("--state-dir", root, "complete-names", "run")
    assert out.split() == ["run-20261205-071800-abcdef", "run-20261205-071900-fedcba"]
