"""Faults forced at a seam outside the code under test: a ``sitecustomize`` on the PYTHONPATH of
the processes under test only (the test's own process and every other one run as usual), and a
pid taken on purpose."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# --- hosts held back before they start -------------------------------------------------------------
# What the gated seam does in a pane's Python while the gate file exists: hold it (at most a
# minute), or end it at once (a host that dies before it registers, as a pane that died at once).
HOLD = (
    "deadline = time.monotonic() + 60\n"
    "while os.path.exists(GATE) and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)"
)
DIE = "os._exit(3)"
# Held (saying so in ``<gate>.held``) until the gate goes, then ended: a host the fire saw start,
# and published, that dies before it registers. DIE alone may end it before the fire has read the
# pane's pid, on a loaded machine.
HOLD_THEN_DIE = "open(GATE + '.held', 'w').close()\n" + HOLD + "\nos._exit(3)"


def gated_pythonpath(tmp: Path, body: str) -> str:
    """A PYTHONPATH whose ``sitecustomize`` runs ``body`` in every Python started with it (a
    fire's hosts, before they import anything of ours), while the gate file ``tmp/gate`` exists
    (made here; the test removes it to let them go)."""
    folder = tmp / "seam"
    folder.mkdir(exist_ok=True)
    gate = tmp / "gate"
    gate.touch()
    indented = "".join(f"    {line}\n" for line in body.splitlines())
    (folder / "sitecustomize.py").write_text(
        f"import os, sys, time\nGATE = {str(gate)!r}\nif os.path.exists(GATE):\n{indented}"
    )
    return os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])


# --- a full disk ---------------------------------------------------------------------------------
ENOSPC_LINE = "No space left on device"
# Our own write seams: entries and records (the results among them), the mailbox, and the event
# log with the agent's notices.
FULL_DISK_SEAMS = {
    "records": "fsio._write_all = _full",
    "mailbox": "mailbox._write_all = _full",
    "events": "mailbox._append = _full",
}


def full_disk(at: Path, *which: str) -> dict[str, str]:
    """The environment of a process whose disk is full at the ``which`` seams (all by default)."""
    folder = at / f"full-{'-'.join(which) or 'all'}"
    folder.mkdir(exist_ok=True)
    lines = [FULL_DISK_SEAMS[name] for name in which or FULL_DISK_SEAMS]
    (folder / "sitecustomize.py").write_text(
        "import errno\n"
        "from pi_tmux_matrix.matrix import fsio, mailbox\n"
        "def _full(*_args, **_kwargs):\n"
        f"    raise OSError(errno.ENOSPC, {ENOSPC_LINE!r})\n" + "\n".join(lines) + "\n"
    )
    return {**os.environ, "PYTHONPATH": str(folder)}


# --- a pid reused ----------------------------------------------------------------------------------
def spawn_on_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A sleeper that gets ``pid`` (via ns_last_pid, root only); None if another process took it."""
    for _ in range(20):
        with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
            handle.write(str(pid - 1))
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if child.pid == pid:
            return child
        child.kill()
        child.wait()
    return None
