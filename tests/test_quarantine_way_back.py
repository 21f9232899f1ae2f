"""Quarantine keeps the way back (issue 31.12): after ``repair`` moves a corrupt worker entry
aside, a worker whose bytes still name its identity and a session file that is there can be
resumed (a ``resumable`` entry is written for it from them); ``repair``'s preview says so, or says
what is given up. Real files, the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import make_entry, make_identity

from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore

PI_MATRIX = [sys.executable, "-m", "pi_tmux_matrix"]


def _run(store: MatrixStore, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PI_MATRIX, "--state-dir", str(store.root), *words], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def _corrupt_worker(store: MatrixStore, tmp_path: Path, session: str, *, with_file: bool) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    session_file = tmp_path / f"{session}.jsonl"
    if with_file:
        session_file.write_text(json.dumps({"type": "session", "id": session, "cwd": str(work)}) + "\n")
    identity = make_identity(session, cwd=str(work), session_file=str(session_file), provider="pi")
    made = make_entry(session, identity=identity, task_ref="goal-7", task_summary="fix the parser")
    entry = store.register(made)
    path = store.root / f"{entry.key}.json"
    raw = json.loads(path.read_text())
    raw["status"] = "no-such-status"  # corrupt, the identity still readable
    path.write_text(json.dumps(raw))
    return entry.key


def test_a_quarantined_worker_with_its_session_file_stays_resumable(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    key = _corrupt_worker(store, tmp_path, "s1", with_file=True)
    preview = _run(store, "repair", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert f"would keep {key} resumable from its session file" in preview.stdout, preview.stdout
    done = _run(store, "repair")
    assert done.returncode == 0, done.stderr
    assert f"keep {key} resumable" in done.stdout
    assert len(list((store.root / "quarantine").iterdir())) == 1  # the evidence is kept
    entry = store.get(key)
    assert entry.status is Status.RESUMABLE and entry.reason == "repaired"
    assert entry.task_ref == "goal-7" and entry.task_summary == "fix the parser"
    assert entry.resumable is not None and entry.resumable.identity == entry.identity
    # The way back is open: resume plans it (a master's own would run it; here its checks pass).
    plan = _run(store, "resume", key, "--dry-run", "--json", "--parent-pid", "1", "--parent-session", "boss")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["key"] == key


def test_the_preview_says_what_a_worker_without_its_session_file_gives_up(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    key = _corrupt_worker(store, tmp_path, "s2", with_file=False)
    preview = _run(store, "repair", "--dry-run")
    assert f"{key} cannot be resumed afterwards" in preview.stdout, preview.stdout
    assert _run(store, "repair").returncode == 0
    assert store.find(key) is None
