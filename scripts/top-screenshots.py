#!/usr/bin/env python3
"""Screenshots of ``pi-matrix top`` for docs/top.md: a demo matrix in a temporary state dir, top
in a private tmux server at 80x24 and 160x40, ``tmux capture-pane -e`` rendered to PNG.

Needs tmux and Pillow (``pip install pillow``; not a dependency of the product). The ANSI capture
is parsed by rich (``Text.from_ansi``) and each cell drawn in DejaVu Sans Mono. Every process it
starts is killed by pid and its tmux server by its own socket.

    python scripts/top-screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from rich.console import Console
from rich.style import Style
from rich.terminal_theme import MONOKAI
from rich.text import Text

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import AgentIdentityContract, Role
from pi_tmux_matrix.matrix.mailbox import EventLog
from pi_tmux_matrix.matrix.model import Entry, Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
FONT_BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"
BUSY = """import time
while True:
    t = time.monotonic()
    while time.monotonic() - t < {on}: pass
    time.sleep({off})
"""


def _spawn(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)


def demo_matrix(store: MatrixStore, started: list[subprocess.Popen[bytes]]) -> None:
    """A lead master with four workers in lanes, one of them busy, and an orphan."""
    now = now_ms()

    def add(
        session: str, role: Role, status: Status, proc: subprocess.Popen[bytes] | None, **more: object
    ) -> str:
        lane = more.pop("lane", None)
        identity = AgentIdentityContract(agent_id=f"agent-{session[:8]}", session_id=session, lane=lane)
        fields: dict[str, object] = {
            "key": identity.key(role), "role": role, "status": status, "identity": identity,
            "created_at": now - int(more.pop("age_s", 60)) * 1000, "updated_at": now,
        }  # fmt: skip
        if proc is not None:
            ident = procs.identify(proc.pid)
            assert ident is not None
            fields.update(pid=ident.pid, proc_start=ident.start_ticks, boot_id=ident.boot_id)
            fields["heartbeat_at"] = now
        fields.update(more)
        store.create(Entry(**fields))  # type: ignore[arg-type]
        return str(fields["key"])

    lead = str(uuid.uuid4())
    started.append(_spawn(BUSY.format(on=0.01, off=0.2)))
    add(lead, Role.MASTER, Status.RUNNING, started[-1], task_ref="GOAL-42", age_s=1860)
    sessions = sorted(str(uuid.uuid4()) for _ in range(4))  # rows in this order: api first
    for session, (lane, task, status, busy, age_s) in zip(
        sessions,
        (
            ("api", "GOAL-42#auth", Status.RUNNING, 0.08, 1500),
            ("web", "GOAL-42#login-form", Status.RUNNING, 0.02, 1320),
            ("docs", "GOAL-42#changelog", Status.TERMINAL, None, 960),
            ("infra", "GOAL-42#ci-cache", Status.RESUMABLE, None, 640),
        ),
        strict=True,
    ):
        proc = None
        if busy is not None:
            started.append(_spawn(BUSY.format(on=busy, off=0.1)))
            proc = started[-1]
        key = add(
            session, Role.WORKER, status, proc, lane=lane, task_ref=task, age_s=age_s,
            parent_session_id=lead, parent_pid=started[0].pid,
            reason="parent_lost" if status is Status.RESUMABLE else None,
        )  # fmt: skip
        log = EventLog(store, key)
        log.write("registered", pid=proc.pid if proc else 0)
        if lane == "api":
            why = "outside the worker's allowed paths"
            log.write("tool_blocked", tool="write", path="/etc/hosts", reason=why)
    add(
        str(uuid.uuid4()), Role.WORKER, Status.WINDING_DOWN, None, lane="spike", task_ref="GOAL-17",
        age_s=5400, parent_session_id=str(uuid.uuid4()), reason="parent_lost",
    )  # fmt: skip


def render_png(ansi: str, columns: int, rows: int, path: Path) -> None:
    """A terminal's captured screen (SGR escapes) drawn cell by cell."""
    font, bold = ImageFont.truetype(FONT, 15), ImageFont.truetype(FONT_BOLD, 15)
    cell_w, cell_h = int(font.getlength("M")), 19
    pad = 10
    size = (columns * cell_w + 2 * pad, rows * cell_h + 2 * pad)
    image = Image.new("RGB", size, tuple(MONOKAI.background_color))
    draw = ImageDraw.Draw(image)
    console = Console(width=columns, color_system="truecolor", force_terminal=True)
    for y, raw in enumerate(ansi.split("\n")[:rows]):
        x = 0
        for segment in Text.from_ansi(raw, no_wrap=True).render(console):
            style = segment.style or Style()
            fg = tuple(style.color.get_truecolor(MONOKAI) if style.color else MONOKAI.foreground_color)
            bg = style.bgcolor.get_truecolor(MONOKAI, foreground=False) if style.bgcolor else None
            back = tuple(bg) if bg else None
            if style.reverse:
                fg, back = back or tuple(MONOKAI.background_color), fg
            if style.dim:
                fg = tuple(int(c * 0.6) for c in fg)
            for char in segment.text:
                if char == "\n":
                    continue
                left, top = pad + x * cell_w, pad + y * cell_h
                if back is not None:
                    draw.rectangle([left, top, left + cell_w, top + cell_h], fill=back)
                draw.text((left, top + 1), char, font=bold if style.bold else font, fill=fg)
                x += 1
    image.save(path)


def shoot(socket: str, state: Path, size: tuple[int, int], keys: list[str], out: Path) -> None:
    columns, rows = size
    tmux = ["tmux", "-L", socket]
    argv = f"{sys.executable} -m pi_tmux_matrix --state-dir {state} top; sleep 60"
    subprocess.run([*tmux, "new-session", "-d", "-x", str(columns), "-y", str(rows), "-s", "shot",
                    "-e", "TERM=xterm-256color", argv], check=True)  # fmt: skip
    try:
        time.sleep(2.5)  # two CPU samples apart
        for key in keys:
            subprocess.run([*tmux, "send-keys", "-t", "shot", key], check=True)
            time.sleep(0.3)
        time.sleep(0.5)
        ansi = subprocess.run([*tmux, "capture-pane", "-p", "-e", "-N", "-t", "shot"], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        render_png(ansi, columns, rows, out)
        print(f"wrote {out}")
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img", help="where the PNGs go (default docs/img)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen[bytes]] = []
    socket = f"top-shots-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "process-matrix"
        try:
            demo_matrix(MatrixStore(state), started)
            shoot(socket, state, (80, 24), ["j"], out / "top-80x24.png")
            shoot(socket, state, (160, 40), ["j"], out / "top-160x40.png")
            shoot(socket, state, (80, 24), ["j", "Enter"], out / "top-detail-80x24.png")
            shoot(socket, state, (80, 24), ["j", "j", "j", "j", "a"], out / "top-adopt-80x24.png")
        finally:
            for proc in started:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
