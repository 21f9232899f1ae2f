"""The envelope judges a path the way the kernel will act on it: a differential test (issue 16).

Thousands of seeded paths over a small tree full of awkward links (relative and absolute, inside
and outside, dangling, a loop, one into the agent dir, one back in from outside), with ``..``,
``.``, ``//`` and components that do not exist yet. For each path the verdict of envelope.ts's
``judge`` (run under the pinned pi's own node and jiti, as pi loads it) is compared with what
really happens in a fresh copy of the tree when a write tool makes the missing parents (``mkdir
-p`` of the folder, as pi's write tool does) and opens the file: the write is allowed exactly when
every folder it made and the file it opened lie inside the allowed root and outside every private
root. A pure Python test of the ground truth; nothing but the envelope is under test.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from pi_support import pi_bin, pi_jiti, pi_temp

from pi_tmux_matrix.bridge import bridge_path

pytestmark = pytest.mark.real_pi  # any_pi below: test_envelope.py runs its pi part on the oldest pi

SEED = 20261204
COUNT = 5000
# What a generated path is made of: existing folders, links of every kind, missing names, dots.
WORDS = (
    "d1", "d2", "in_rel", "in_abs", "out_rel", "out_abs", "dangling_out", "dangling_in", "loop",
    "cfg", "up", "back", "m1", "m2", "..", "..", ".", "", ".pi", ".git", "hooks", "config",
)  # fmt: skip
FINALS = (
    "f.txt", "g", "config", "auth.json", "..", "x", "dangling_out", "dangling_in", "out_abs", "cfg", ".git",
)  # fmt: skip


def build(base: Path) -> None:
    """The tree: ``A`` is the allowed root, ``agent`` pi's agent dir (private), ``outside`` neither."""
    allowed, outside, agent = base / "A", base / "outside", base / "agent"
    (allowed / "d1" / "d2").mkdir(parents=True)
    (allowed / ".git" / "hooks").mkdir(parents=True)
    (allowed / ".pi").mkdir()
    (outside / "o1").mkdir(parents=True)
    agent.mkdir()
    (agent / "auth.json").write_text("{}")
    (allowed / "in_rel").symlink_to("d1")
    (allowed / "in_abs").symlink_to(allowed / "d1" / "d2")
    (allowed / "out_rel").symlink_to("../outside")
    (allowed / "out_abs").symlink_to(outside / "o1")
    (allowed / "dangling_out").symlink_to(outside / "nowhere")
    (allowed / "dangling_in").symlink_to("d1/nothing")
    (allowed / "loop").symlink_to("loop")
    (allowed / "cfg").symlink_to(agent)
    (allowed / "d1" / "up").symlink_to("..")
    (outside / "back").symlink_to(allowed / "d1")
    (allowed / "d1" / "back").symlink_to(outside / "back")


def generated(rng: random.Random) -> list[str]:
    """Paths relative to the base folder (``A/...``) or relative to the session cwd (``A``)."""
    paths: list[str] = []
    for _ in range(COUNT):
        parts = [rng.choice(WORDS) for _ in range(rng.randint(0, 5))]
        final = rng.choice(FINALS)
        body = "/".join([*parts, final])
        # A relative path never starts with "/" (that would be the machine's root, not the cwd).
        roll = rng.random()
        if roll < 0.7:
            paths.append(f"@ABS/A/{body}")  # absolute, from the allowed root: `..` goes as written
        elif roll < 0.8:
            paths.append(f"@ABS/{body}")
        else:
            paths.append(body.lstrip("/") or final)
    return paths


def private_for_writes(real: str, allowed: str, agent: str) -> bool:
    """The envelope's private roots for a write: pi's agent dir whole, any ``.pi`` folder, and
    any ``.git`` entry (the file or folder itself and all inside; issue 28)."""
    parts = real.split("/")
    return (
        real == agent
        or real.startswith(agent + "/")
        or ".pi" in parts
        or any(part.lower() == ".git" for part in parts)
    )


def inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root + "/")


def _walk(top: Path) -> tuple[set[str], set[str]]:
    """The folders and the other names (files, links) under ``top``, links not followed."""
    folders: set[str] = set()
    others: set[str] = set()
    for folder, names, files in os.walk(top, followlinks=False):
        for name in names:
            path = os.path.join(folder, name)
            (others if os.path.islink(path) else folders).add(path)
        others.update(os.path.join(folder, n) for n in files)
    return folders, others


DEPTH = 7  # deeper than any run of ".." a generated path holds, so every folder it makes is seen


def nested(top: Path) -> Path:
    base = top.joinpath(*["n"] * DEPTH)
    base.mkdir(parents=True)
    return base


class Trials:
    """One tree for every trial: what a trial makes is removed after it, which leaves the tree as
    built (a fresh copy per trial cost ~12 ms, this ~1 ms)."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.base = nested(top)
        build(self.base)
        self.allowed = str((self.base / "A").resolve())
        self.agent = str((self.base / "agent").resolve())
        self.folders, self.others = _walk(top)

    def truth(self, raw: str) -> bool | None:
        """What a write of ``raw`` does in the tree: True when everything it made and the file it
        opened lie inside the allowed root and off every private root, False when anything lands
        outside or in a private root, None when the write fails having made nothing outside (a
        loop, a folder, a dangling parent): then blocking and allowing are both safe. pi's write
        makes the missing parents, then opens the file for writing."""
        base, allowed, agent = self.base, self.allowed, self.agent
        # pi joins a relative path to the session cwd and normalises it; an absolute one goes as written.
        relative = not raw.startswith("@ABS")
        target = os.path.normpath(f"{base}/A/{raw}") if relative else raw.replace("@ABS", str(base))
        reached: str | None = None
        try:
            os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                reached = os.readlink(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENOTDIR, errno.EEXIST):
                raise
        folders, others = _walk(self.top)
        new_folders = folders - self.folders
        made = [os.path.realpath(d) for d in new_folders]
        for path in others - self.others:
            os.unlink(path)
        for path in sorted(new_folders, key=len, reverse=True):
            os.rmdir(path)
        if any(not inside(d, allowed) or private_for_writes(d, allowed, agent) for d in made):
            return False  # a folder was made where the worker may not write
        if reached is None:
            return None  # the write failed; what it made lies inside: no escape, nothing to allow
        return inside(reached, allowed) and not private_for_writes(reached, allowed, agent)


def judge_all(tmp: Path, base: Path, paths: list[str]) -> list[str | None]:
    """envelope.ts's verdict for each path: None (allowed) or the reason."""
    jiti = pi_jiti()
    concrete = [p.replace("@ABS", str(base)) for p in paths]
    listing = tmp / "paths.json"
    listing.write_text(json.dumps(concrete))
    script = tmp / "judge.mjs"
    module = json.dumps(str(bridge_path().parent / "envelope.ts"))
    allowed, agent = json.dumps(str(base / "A")), json.dumps(str(base / "agent"))
    script.write_text(
        f"import {{ createJiti }} from {json.dumps(str(jiti))};\n"
        'import * as fs from "node:fs";\n'
        f"const m = await createJiti(import.meta.url).import({module});\n"
        f"const e = {{ allowed: [m.physical({allowed})], privateRoots: "
        f"[{{ real: m.physical({agent}), what: 'the agent dir' }}], sessionsDirs: [], "
        f"agent: m.physical({agent}) }};\n"
        f"const paths = JSON.parse(fs.readFileSync({json.dumps(str(listing))}, 'utf8'));\n"
        f"console.log(JSON.stringify(paths.map((p) => m.judge(e, 'write', p, {allowed}, null) ?? null)));\n"
    )
    node = shutil.which("node", path=os.path.dirname(pi_bin()) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(
        [node or "node", str(script)], capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, TMPDIR=pi_temp(tmp)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    verdicts: list[str | None] = json.loads(done.stdout)
    return verdicts


@pytest.mark.any_pi  # pi's node and jiti load envelope.ts in test_envelope.py too
def test_every_generated_path_is_judged_as_the_kernel_acts_on_it(tmp_path: Path) -> None:
    paths = generated(random.Random(SEED))
    judged = nested(tmp_path / "judged")
    build(judged)
    verdicts = judge_all(tmp_path, judged, paths)
    wrong: list[str] = []
    outcomes = {True: 0, False: 0, None: 0}
    trials = Trials(tmp_path / "trials")
    for raw, verdict in zip(paths, verdicts, strict=True):
        really = trials.truth(raw)
        outcomes[really] += 1
        if really is not None and really != (verdict is None):
            kernel = "allowed" if really else "escaped"
            wrong.append(f"{raw}: kernel {kernel}, envelope {verdict or 'allowed'}")
    assert _walk(trials.top) == (trials.folders, trials.others), "a trial left something behind"
    assert not wrong, f"{len(wrong)} of {len(paths)} wrong, e.g.\n" + "\n".join(wrong[:15])
    # The harness can fail: its paths land inside, escape (outside, the agent dir, a .pi folder,
    # .git hooks), and fail harmlessly, in good numbers each.
    assert outcomes[True] > 300 and outcomes[False] > 300 and outcomes[None] > 50, outcomes
