"""Worker text shown escaped (issue 17, case 15): what a worker wrote (its task summary, a blocked
tool's path and reason, its last words, the result path its bridge reported, a file name it put
in the state dir) reaches a person's terminal with every control character shown, ``cat -v``
style, never run: ``show``, ``repair --dry-run`` and a bash master's handoff line neither retitle
the pane nor move the cursor nor erase a line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import cli_at as _cli
from helpers import make_entry
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix.model import ExitKind
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

HOSTILE = "\x1b]0;PWNED\x07\x1b[2K"
SHOWN = "^[]0;PWNED^G^[[2K"


def test_15_worker_text_reaches_the_terminal_with_its_escape_sequences_shown_not_run(tmp_path: Path) -> None:
    """``show`` prints a worker's task summary and its blocked-tool paths; a master prints a
    handoff's summary: every control character goes through one sanitiser (``cat -v`` style)."""
    from helpers import make_entry

    from pi_tmux_matrix.matrix.mailbox import EventLog
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
    from pi_tmux_matrix.safetext import printable

    hostile = "\x1b]0;PWNED-TITLE\x07\x1b[2K\x1b[1A\x9b31m"
    store = MatrixStore(tmp_path / "state")
    store.create(make_entry("w1", task_summary=f"fix it {hostile}"))
    EventLog(store, "worker-w1").write("tool_blocked", tool="write", path=f"/x/{hostile}", reason=hostile)
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "show", "worker-w1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\x9b" not in done.stdout
    assert "^[]0;PWNED-TITLE^G^[[2K^[[1AM-^[31m" in done.stdout
    assert printable("a\tb\nc") == "a^Ib^Jc" and now_ms() > 0


def test_15_repair_dry_run_shows_a_hostile_file_name_escaped(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    store.register(make_entry("ok15"))  # makes the state dir as the product does (mode 0700)
    (store.root / f"worker-{HOSTILE}.json").write_text("not json")
    done = _cli(store.root, "repair", "--dry-run", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    assert f"would quarantine {store.root}/worker-{SHOWN}.json: " in done.stdout, done.stdout
    assert (store.root / f"worker-{HOSTILE}.json").exists()  # a dry run moves nothing


def test_15_a_bash_masters_handoff_line_shows_worker_text_escaped(tmp_path: Path, tmux_socket: str) -> None:
    """The worker's last words and the result path its bridge reported reach a non-pi master's
    terminal as one line with every control character shown, ``cat -v`` style: the pane's title
    stays and no line is erased."""
    from helpers import dead_identity
    from tmux_support import kill_tmux_server

    from pi_tmux_matrix.matrix import lifecycle
    from pi_tmux_matrix.matrix.model import ExitRecord
    from pi_tmux_matrix.supervise.handoff_text import handoff_message

    store = MatrixStore(tmp_path / "state")
    dead = dead_identity()
    entry = store.register(make_entry("h15", process=dead, parent_pid=dead.pid, parent_session_id="boss"))
    record = ExitRecord(kind=ExitKind.EXITED, at=now_ms(), code=0)
    store.update(
        entry.key,
        lambda e: lifecycle.record_terminal(
            e, record, now_ms(), summary=f"all done {HOSTILE}", result_pointer=f"/tmp/r-{HOSTILE}.json"
        ),
        registration=entry.registration,
    )
    ended = store.get(entry.key)
    assert "\x1b" not in handoff_message(ended, ended.handoffs[0])  # a pi master's frame too
    env = {**os.environ, "PI_MATRIX_STATE_DIR": str(store.root)}
    names = ("PATH", "HOME", "PI_CODING_AGENT_DIR", "PI_MATRIX_STATE_DIR", "PYTHONPATH", "VIRTUAL_ENV")
    tmux = ["tmux", "-L", tmux_socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "bash", "-x", "200",
         *(w for name in names if name in env for w in ("-e", f"{name}={env[name]}")), "-e", "PS1=$ ",
         "-c", str(tmp_path), "--", sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss",
         "--", "bash", "--norc", "--noprofile"],
        env=env, check=True,
    )  # fmt: skip
    master = wait_for("the bash master", lambda: store.find("master-boss"), timeout=30)
    try:
        wait_for("the handoff delivered", lambda: store.get(entry.key).handoffs[0].delivered_at, timeout=30)

        def pane() -> str:
            argv = [*tmux, "capture-pane", "-p", "-J", "-t", "=bash:"]
            return subprocess.run(argv, capture_output=True, text=True, check=False).stdout

        def printed() -> str | None:
            return screen if "handoff worker-h15" in (screen := pane()) else None

        screen = wait_for("the handoff line", printed, detail=pane)
        (line,) = [line for line in screen.splitlines() if "handoff worker-h15" in line]
        assert f"all done {SHOWN}" in line and f"/tmp/r-{SHOWN}.json" in line, screen
        title = subprocess.run(
            [*tmux, "display-message", "-p", "-t", "=bash:", "#{pane_title}"], capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert "PWNED" not in title.stdout, title.stdout
    finally:
        kill_tmux_server(tmux_socket)  # the pane hangs up: bash and its master end (bash ignores SIGTERM)
        if master.process is not None and not procs.wait_for_exit(master.process, 10):
            procs.send_signal(master.process, signal.SIGKILL)
