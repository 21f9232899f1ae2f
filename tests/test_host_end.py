"""Issue 19, the worker host's end is light: when 50 workers end at once on 2 CPUs, every
host's end costs CPU their master needs to deliver the handoffs (benchmarks/bench_handoff.py).
A host whose state dir has no fork run imports no fork code at its end, and a host leaves
without tearing its interpreter down, once its agent's end is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pi_tmux_matrix.matrix.store import MatrixStore

HOOK = """import atexit, os, sys
def _teardown():
    if "pi_tmux_matrix" not in sys.modules:
        return  # the agent (a python too): not the host
    with open(os.environ["END_PROBE"], "a") as handle:
        handle.write("teardown\\n")
atexit.register(_teardown)
"""


def host(tmp_path: Path, *agent: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    """``pi-matrix host`` run as the console script runs it (its own process, to its end)."""
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(HOOK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(probe_dir), os.environ.get("PYTHONPATH", "")]),
        "END_PROBE": str(tmp_path / "probe.log"),
        "PI_CODING_AGENT_DIR": str(tmp_path / "agent"),
        "HOME": str(tmp_path),
    }
    env.pop("PI_MATRIX_STATE_DIR", None)
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run(
        [sys.executable, *flags, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"),
         "host", "--parent-pid", str(os.getpid()), "--parent-session", "boss", "--session-id", "end1",
         "--provider", "bench", "--mode", "print", "--", *agent],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_host_with_no_fork_run_imports_no_fork_code_at_its_end(tmp_path: Path) -> None:
    done = host(tmp_path, sys.executable, "-c", "print('done')", importtime=True)
    assert done.returncode == 0, done.stderr
    loaded = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    assert not {m for m in loaded if m.startswith("pi_tmux_matrix.fork")}, sorted(loaded)
    entry = MatrixStore(tmp_path / "state").get("worker-end1")
    assert entry.status.value == "terminal" and [h.outcome for h in entry.handoffs] == ["exited"]


def test_a_host_leaves_without_interpreter_teardown_once_the_end_is_recorded(tmp_path: Path) -> None:
    done = host(tmp_path, sys.executable, "-c", "import sys; print('bye'); sys.exit(3)")
    assert done.returncode == 3, done.stderr
    assert "bye" in done.stdout  # the agent's output, and the host's own, are all out
    assert not (tmp_path / "probe.log").exists()  # no atexit hook ran: no teardown
    entry = MatrixStore(tmp_path / "state").get("worker-end1")
    assert entry.exit is not None and entry.exit.code == 3
    events = [
        json.loads(line)["event"] for line in (tmp_path / "state" / "events" / "worker-end1.jsonl").open()
    ]
    assert events[-2:] == ["child_exited", "status"]


def test_other_verbs_still_leave_through_the_interpreter(tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(HOOK)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "probe"), "END_PROBE": str(tmp_path / "probe.log")}
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), "ls"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "probe.log").read_text() == "teardown\n"
