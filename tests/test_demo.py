"""``pi-matrix demo`` end to end: under a minute, nothing left behind (issue 4)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from helpers import fifo_writer
from tmux_support import require_tmux
from waiting import wait_for


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline or text in environ:
            found.append(int(entry.name))
    return found


def test_the_demo_runs_end_to_end_in_under_a_minute_and_leaves_nothing_behind(tmp_path: Path) -> None:
    require_tmux()
    env = dict(os.environ, TMPDIR=str(tmp_path))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "demo"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < 60, f"the demo took {elapsed:.1f}s"

    out = done.stdout
    steps = [
        "fire three stand-in agents on two lanes",
        "kill -9 the master",
        "a worker is lost too",
        "recovers its exact orphans",
    ]
    positions = [out.index(step) for step in steps]
    assert positions == sorted(positions)
    assert out.count("resumable (parent_lost)") >= 3
    assert "  lane-a  " in out and "  lane-b  " in out  # the tree's LANE column
    assert re.search(r"same key, same session file .+, new host pid \d+ \(was \d+\)", out)
    socket = re.search(r"tmux -L (pi-matrix-demo-\d+)", out)
    assert socket is not None

    # Nothing left: no tmux server on its socket, no process of its scratch folder, no folder.
    probe = subprocess.run(["tmux", "-L", socket.group(1), "ls"], capture_output=True, text=True, check=False)
    assert probe.returncode != 0
    assert _processes_mentioning(str(tmp_path)) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("pi-matrix-demo-")] == []


def test_the_demo_runs_without_tmux_on_path_with_detached_agents(tmp_path: Path) -> None:
    """Issue 20.15: tmux absent from PATH, the demo's agents run detached and it still passes."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "ps"):  # what the demo needs besides Python, and nothing called tmux
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = dict(os.environ, TMPDIR=str(tmp_path), PATH=str(bin_dir))
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "demo"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "tmux is not installed" in out and "detached processes (no tmux)" in out
    assert "tmux -L" not in out and "recovers its exact orphans" in out
    assert re.search(r"same key, same session file .+, new host pid \d+ \(was \d+\)", out)
    assert _processes_mentioning(str(tmp_path)) == []


def test_a_pane_pipe_left_opening_its_fifo_is_found_under_the_state_dir_and_let_go(tmp_path: Path) -> None:
    """The demo's teardown: a pane pipe's helper (tmux's pipe-pane runs it, nobody's child) that
    opens its FIFO after the host stopped reading waits for a reader for good. The demo finds it
    by its FIFO's path under the scratch state dir, and removing the FIFOs lets it go."""
    from pi_tmux_matrix import procs
    from pi_tmux_matrix.matrix.fsio import drop_fifos

    pipes = tmp_path / "state" / "pipes"
    pipes.mkdir(mode=0o700, parents=True)
    pipes.parent.chmod(0o700)
    fifo = pipes / "job-1.a.fifo"
    os.mkfifo(fifo, 0o600)
    helper = fifo_writer(fifo)  # blocked in opening the FIFO: no reader
    try:
        wait_for(
            "the helper under the state dir",
            lambda: helper.pid in [i.pid for i in procs.with_argument(str(tmp_path / "state"))] or None,
        )
        drop_fifos(pipes)
        assert helper.wait(timeout=10) == 0
        assert list(pipes.iterdir()) == []
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
