"""Every `pi-matrix` command in the README's and docs/'s ```bash blocks runs (issue 6).

Each is run against a scratch world: its own state dir and agent dir, a private tmux socket, a
scratch git repo as cwd, the stand-in agent as "pi". Placeholders are filled in (`ID` → the job
the docs fired, `worker-<id>` → a worker of the matrix, `<task>` → the task, `[--flags]` dropped).
A command may end 0-3 (the CLI's documented outcomes: a preview exits 2, a refusal 1) but must
end, and never with a traceback. `pi-matrix master … -- bash` runs bash with no input, so it ends.
A verb that serves until it is stopped (`fake-model`) must say it serves, then end 0 on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tmux_support import kill_tmux_server, require_tmux

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity, Role
from pi_tmux_matrix.matrix.store import MatrixStore

ROOT = Path(__file__).resolve().parent.parent
STANDIN = [sys.executable, "-m", "pi_tmux_matrix.testing.standin"]
# Verbs that serve until stopped, and the line that says they serve.
SERVING = {"fake-model": "export PI_CODING_AGENT_DIR="}


def documented_commands() -> list[tuple[str, str]]:
    """Each distinct documented command once, where it first appears (a command several pages
    show runs once: the same words need no second run)."""
    found: dict[str, str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.DOTALL):
            for line in block.splitlines():
                command = line.split("  #")[0].strip()
                if command.startswith("pi-matrix "):
                    found.setdefault(command, path.name)
    return [(source, command) for command, source in found.items()]


def _fill(command: str, job_id: str, worker: str) -> list[str]:
    command = re.sub(r"\s\[[^\]]*\]", "", command)  # optional flags in the synopsis
    command = command.replace("worker-<id>", worker).replace("worker-3f1c9a", worker)
    command = re.sub(r"<the same session>|<yours>", "m1", command)
    command = re.sub(r"<the same task>|<task>", "goal-7", command)
    words = shlex.split(command)
    return [job_id if w == "ID" else w for w in words]


def _serve_and_stop(argv: list[str], ready: str, cwd: Path, env: dict[str, str], log: Path) -> str | None:
    """Run a serving verb until it says ``ready``, stop it with SIGTERM: None, or what failed."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    identity = procs.identify(proc.pid)
    try:
        deadline = time.monotonic() + 30
        while ready not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if ready not in log.read_text():
            return f"did not say {ready!r} in 30 s:\n{log.read_text()[-800:]}"
        if identity is not None:
            procs.send_signal(identity, signal.SIGTERM)
        code = proc.wait(timeout=10)
        return None if code == 0 else f"exit {code} on SIGTERM:\n{log.read_text()[-800:]}"
    finally:
        if proc.poll() is None and identity is not None:
            procs.send_signal(identity, signal.SIGKILL)
            proc.wait(timeout=10)


def test_every_documented_command_runs(tmp_path: Path) -> None:
    require_tmux()
    commands = documented_commands()
    assert len(commands) >= 30, "the docs' commands were not found"
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "init"], check=True, timeout=30)
    agent = Path(os.environ["PI_CODING_AGENT_DIR"])
    agent.mkdir(parents=True, exist_ok=True)
    settings = {
        "heartbeatMs": 1000,
        "watcherPollMs": 1000,
        "adoptionGraceMs": 5000,
        "maxConcurrentAgents": 64,
    }
    (agent / "settings.json").write_text(json.dumps({"processMatrix": settings}))
    socket = f"pm-test-docs-{os.getpid()}"
    state = tmp_path / "state"
    env = dict(
        os.environ, PI_MATRIX_STATE_DIR=str(state), PI_MATRIX_TMUX_SOCKET=socket,
        PI_MATRIX_PI_COMMAND=json.dumps(STANDIN), STANDIN_STEP_S="0.02",
    )  # fmt: skip
    store = MatrixStore(state)
    started: list[ProcessIdentity] = []
    failures: list[str] = []
    ran: list[str] = []
    try:
        for source, command in commands:
            jobs = sorted((state / "jobs").glob("job-*.json")) if (state / "jobs").exists() else []
            workers = [e.key for e in store.list().entries if e.role is Role.WORKER] if store.exists() else []
            words = _fill(
                command, jobs[0].stem if jobs else "job-none", workers[0] if workers else "worker-none"
            )
            # Never the user's own dispatcher socket: ours.
            words = [socket if p == "--socket" else w for p, w in zip(["", *words], words, strict=False)]
            inner = [sys.executable, "-m", "pi_tmux_matrix", *words[1:]]
            if words[1] in SERVING:
                ran.append(" ".join(words))
                failed = _serve_and_stop(inner, SERVING[words[1]], repo, env, tmp_path / f"{words[1]}.log")
                if failed is not None:
                    failures.append(f"{source}: {command}: {failed}")
                continue
            argv = inner
            if words[1] != "master":
                # Every other command runs under a master of the docs' session, as a user would.
                argv = [
                    sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "m1", "--task-ref",
                    "goal-7", "--headless", "--mode", "print", "--", *inner,
                ]  # fmt: skip
            ran.append(" ".join(words))
            began = time.monotonic()
            try:
                done = subprocess.run(
                    argv, cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False,
                    stdin=subprocess.DEVNULL,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                failures.append(f"{source}: {command}: did not end in 120 s")
                continue
            if os.environ.get("PI_MATRIX_DOCS_VERBOSE"):
                print(
                    f"{time.monotonic() - began:6.2f}s",
                    done.returncode,
                    " ".join(words),
                    done.stderr.strip().splitlines()[-1:] if done.stderr else "",
                )
            if done.returncode not in (0, 1, 2, 3) or "Traceback" in done.stderr:
                failures.append(f"{source}: {command}: exit {done.returncode}\n{done.stderr[-800:]}")
            assert time.monotonic() - began < 120
            for entry in store.list().entries if store.exists() else ():
                started += [i for i in (entry.process, entry.child_process) if i is not None]
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for ident in started:
                procs.send_signal(ident, sig)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(procs.is_alive(i) for i in started):
                time.sleep(0.05)
        kill_tmux_server(socket)
        kill_tmux_server("pi-matrix-docs-unused")
    assert failures == [], "\n".join(failures)
    assert len(ran) == len(commands)
    assert any(w.startswith("pi-matrix resume worker-") and "none" not in w for w in ran), ran
