"""Real git repositories in a test's tmp_path, and ``pi-matrix lanes`` on them (the ``git_env``
fixture, in conftest.py, gives git a committer and nothing of the machine's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def git(cwd: Path | str, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def make_repo(path: Path, *, commit: bool = True) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    if commit:
        (path / "README").write_text("hello\n")
        (path / "src").mkdir()
        (path / "src" / "a.py").write_text("x = 1\n")
        git(path, "add", ".")
        git(path, "commit", "-q", "-m", "init")
    return path


def lanes_cli(state: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), "lanes", *words],
        capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
