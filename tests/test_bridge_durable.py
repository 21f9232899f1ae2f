"""Issue 28 case 8: a report the pi bridge posts into its host's inbox (and every other file the
bridge writes: result artifacts, usage claims, a fork's result) is as durable as the host's own
writes: temp -> write -> fsync -> rename -> fsync the folder (``fsio.durable_write``).

An fsync cannot be seen from outside the process, so the harness runs common.ts in node through
pi's own loader with ``fs.fsyncSync`` and ``fs.renameSync`` wrapped to record what they were
called on (the file behind each fd, from /proc/self/fd) and in what order: our writer's calls to
node, observed, never replaced. ``Inbox.post`` (the Python senders: send, stop, the watcher) is
held to the same order with ``os.fsync`` observed the same way.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from pi_support import pi_jiti, pi_temp

from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.matrix.mailbox import Inbox
from pi_tmux_matrix.matrix.store import MatrixStore

HARNESS = """import { createRequire } from "node:module";
const fs = createRequire(import.meta.url)("node:fs"); // the object common.ts's "node:fs" is
const seen = [];
const where = (fd) => fs.readlinkSync(`/proc/self/fd/${fd}`);
const fsync = fs.fsyncSync, rename = fs.renameSync;
fs.fsyncSync = (fd) => { seen.push(["fsync", where(fd)]); return fsync(fd); };
fs.renameSync = (from, to) => { seen.push(["rename", String(from), String(to)]); return rename(from, to); };
const { createJiti } = await import(process.env.JITI);
const common = await createJiti(import.meta.url).import(process.env.COMMON);
common.post("bridge", JSON.stringify({ event: "durable" }));
const write = common.durableWrite || common.atomicWrite; // atomicWrite: its name before issue 28
write(process.env.ARTIFACT, JSON.stringify({ text: "artifact" }));
console.log(JSON.stringify(seen));
"""


def _durable_steps(seen: list[list[str]], final: Path) -> None:
    """fsync(temp in the folder) -> rename(temp -> final) -> fsync(the folder), in that order."""
    folder = str(final.parent)
    rename = next(i for i, step in enumerate(seen) if step[0] == "rename" and step[2] == str(final))
    temp = seen[rename][1]
    assert os.path.dirname(temp) == folder and os.path.basename(temp).startswith("."), temp
    assert ["fsync", temp] in seen[:rename], (
        f"{final.name}: the temp file was never fsynced before its rename"
    )
    assert ["fsync", folder] in seen[rename + 1 :], (
        f"{final.name}: the folder was never fsynced after the rename"
    )
    info = os.stat(final)
    assert stat.S_IMODE(info.st_mode) == 0o600


@pytest.mark.real_pi
def test_the_bridges_report_and_artifact_are_fsynced_renamed_and_their_folder_fsynced(tmp_path: Path) -> None:
    jiti = pi_jiti()
    state = tmp_path / "state"
    artifacts = state / "artifacts" / "worker-t1"
    artifacts.mkdir(parents=True)
    script = tmp_path / "harness.mjs"
    script.write_text(HARNESS)
    env = dict(
        os.environ, JITI=str(jiti), COMMON=str(bridge_path().parent / "common.ts"), TMPDIR=pi_temp(tmp_path),
        PI_MATRIX_KEY="worker-t1", PI_MATRIX_STATE_DIR=str(state), ARTIFACT=str(artifacts / "run-0001.json"),
    )  # fmt: skip
    done = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    (posted,) = (state / "mailbox" / "worker-t1").iterdir()
    _durable_steps(seen, posted)
    _durable_steps(seen, artifacts / "run-0001.json")
    # What the host reads: the report, whole.
    (message,) = Inbox(MatrixStore(state), "worker-t1").take()
    assert message.kind == "bridge" and json.loads(message.text) == {"event": "durable"}


def test_inbox_post_fsyncs_the_message_then_its_folder(
    store: MatrixStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    fsync, replace = os.fsync, os.replace

    def observed_fsync(fd: int) -> None:
        seen.append(["fsync", os.readlink(f"/proc/self/fd/{fd}")])
        fsync(fd)

    def observed_replace(
        source: str | Path,
        target: str | Path,
        *,
        src_dir_fd: int | None = None,
        dst_dir_fd: int | None = None,
    ) -> None:
        # fsio's durable write renames within an open folder: the names are that folder's.
        def where(name: str | Path, fd: int | None) -> str:
            return str(name) if fd is None else os.path.join(os.readlink(f"/proc/self/fd/{fd}"), name)

        seen.append(["rename", where(source, src_dir_fd), where(target, dst_dir_fd)])
        replace(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "fsync", observed_fsync)
    monkeypatch.setattr(os, "replace", observed_replace)
    posted = Inbox(store, "worker-h1").post("stop", sender="test")
    _durable_steps(seen, posted)
