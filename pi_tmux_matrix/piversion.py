"""Which pi a command runs, and whether pi-matrix supports it: the one place that knows.

The supported range is the oldest pi the tests run against (0.73.1, the last release under
``@mariozechner/pi-coding-agent``) up to today's (1.6.x, ``@earendil-works/pi-coding-agent``).
A pi's node need is its package.json ``engines.node`` (1.6.0: ``>=22.19.0``).

The version is read from the package.json next to pi's ``dist/cli.js`` when the command leads
there (a ``node_modules/.bin/pi`` link, ``node …/dist/cli.js``, or a small wrapper script naming
that cli.js, as ``scripts/install-pi`` writes); otherwise from ``pi --version`` (about a second,
so once per process and command). Launches ask here whether pi knows a flag (``--no-approve``
exists since 0.79.0).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs

from .identity import AgentIdentityContract
from .programs import agent_argv

__all__ = [
    "NEWEST_SUPPORTED",
    "OLDEST_SUPPORTED",
    "TRUST_FLAGS_SINCE",
    "PiInfo",
    "agent_version",
    "is_pi_program",
    "node_for",
    "parse_version",
    "pi_info",
    "program_length",
    "small_text",
    "supported",
    "supported_range",
    "warn_unsupported",
]

log = logging.getLogger(__name__)

Version = tuple[int, int, int]

OLDEST_SUPPORTED: Final[Version] = (0, 73, 1)
NEWEST_SUPPORTED: Final[tuple[int, int]] = (1, 6)  # any 1.6.x
# pi 0.79.0 added the project-trust dialog and the --approve / --no-approve flags that answer it.
TRUST_FLAGS_SINCE: Final[Version] = (0, 79, 0)
# Only a small file is read as a possible wrapper script (install-pi's is ~200 bytes).
_WRAPPER_MAX_BYTES: Final = 8192
_PACKAGE_MAX_BYTES: Final = 256 * 1024  # pi 1.6's package.json is ~4 KB
_CLI_JS: Final = re.compile(r"""["']?([^"'\s]*pi-coding-agent/dist/cli\.js)["']?""")
# A wrapper's command line that runs a program named ``pi`` (``exec pi "$@"``,
# ``exec "/opt/pi/bin/pi" "$@"``): the wrapper is pi if that program is.
_RUNS_PI: Final = re.compile(r"""(?m)^\s*(?:exec\s+)?["']?((?:[^"'\s$`;|&]*/)?pi)["']?(?=\s|$)""")
_WRAPPER_DEPTH: Final = 3  # wrappers of wrappers followed this deep (and never in a loop)
_VERSION: Final = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_BARE: Final = re.compile(r"v?\d+\.\d+\.\d+")


def parse_version(text: str) -> Version | None:
    """The first ``X.Y.Z`` in ``text`` (``1.6.0``, ``v22.19.0``, ``>=22.19.0``), or None."""
    found = _VERSION.search(text)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def supported_range() -> str:
    low = ".".join(map(str, OLDEST_SUPPORTED))
    return f"{low} … {NEWEST_SUPPORTED[0]}.{NEWEST_SUPPORTED[1]}.x"


def supported(version: Version) -> bool:
    return version >= OLDEST_SUPPORTED and version[:2] <= NEWEST_SUPPORTED


@attrs.frozen
class PiInfo:
    """What is known of the pi a command runs: its version and the node it needs (when its
    package.json was found), and where that came from."""

    version: Version | None
    node_need: Version | None = None  # engines.node's floor
    package_dir: str | None = None
    source: str = ""  # "package.json" or "--version"

    @property
    def text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else "unknown"

    @property
    def version_text(self) -> str | None:
        return ".".join(map(str, self.version)) if self.version else None

    def knows(self, since: Version) -> bool:
        """Does this pi know a flag added in ``since``? An unknown version is taken as not."""
        return self.version is not None and self.version >= since


def small_text(path: str, limit: int = _WRAPPER_MAX_BYTES) -> str | None:
    """A small regular file of pi's own (a wrapper script, a package.json, trust.json) as text, or
    None: never blocks on a FIFO or device, never reads more than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def program_length(argv: Sequence[str]) -> int:
    """How many leading words of ``argv`` are the program: 2 for ``node …/cli.js`` (pi's flags go
    after both), else 1."""
    if len(argv) >= 2 and os.path.basename(argv[0]).startswith("node") and argv[1].endswith(".js"):
        return 2
    return 1


def is_pi_program(argv: Sequence[str]) -> bool:
    """Does ``argv`` start pi, seen through its name: ``node …/pi-coding-agent/dist/cli.js``, a
    link to that cli.js, or a small wrapper script naming it (no process is started)."""
    return bool(argv) and _package_dir_of(list(argv[: program_length(argv)])) is not None


def _package_dir_of(command: Sequence[str], depth: int = 0) -> Path | None:
    """pi's package folder, from the command's own words, its resolved program, the cli.js a
    small wrapper script names, or the ``pi`` a wrapper runs (a ``mypi`` script that does
    ``exec pi "$@"`` is pi, whatever it is called)."""
    for word in command[:3]:
        if word.endswith(os.path.join("pi-coding-agent", "dist", "cli.js")):
            return Path(os.path.realpath(word)).parent.parent
    program = shutil.which(command[0]) if command else None
    if program is None:
        return None
    real = os.path.realpath(program)
    if real.endswith(os.path.join("pi-coding-agent", "dist", "cli.js")):
        return Path(real).parent.parent
    head = small_text(real)
    found = _CLI_JS.search(head) if head is not None else None
    if found:
        return Path(os.path.realpath(found[1])).parent.parent
    runs = _RUNS_PI.search(head) if head is not None and head.startswith("#!") else None
    if runs is None or depth >= _WRAPPER_DEPTH:
        return None
    # The wrapper's own PATH is not known: a bare ``pi`` is looked up on ours, as the launch will.
    inner = os.path.realpath(shutil.which(runs[1]) or runs[1])
    return None if inner == real else _package_dir_of([inner], depth + 1)


def _from_package(folder: Path) -> PiInfo | None:
    text = small_text(str(folder / "package.json"), _PACKAGE_MAX_BYTES)
    try:
        document = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(document, dict) or not str(document.get("name", "")).endswith("pi-coding-agent"):
        return None
    version = parse_version(str(document.get("version", "")))
    engines = document.get("engines")
    need = parse_version(str(engines.get("node", ""))) if isinstance(engines, dict) else None
    return PiInfo(version, need, str(folder), "package.json")


@functools.lru_cache(maxsize=16)
def _info(command: tuple[str, ...], ask: bool) -> PiInfo:
    folder = _package_dir_of(command)
    if folder is not None:
        found = _from_package(folder)
        if found is not None:
            return found
    if not ask:
        return PiInfo(None)
    try:
        done = subprocess.run(
            [*command, "--version"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return PiInfo(None)
    # pi answers with the bare version ("1.6.0"); anything else (a stand-in's "stand-in 0.1.0")
    # is not a pi version.
    answer = (done.stdout or "").strip()
    version = parse_version(answer) if done.returncode == 0 and _BARE.fullmatch(answer) else None
    return PiInfo(version, None, None, "--version" if version else "")


def pi_info(command: Sequence[str], *, ask: bool = True) -> PiInfo:
    """The pi ``command`` runs (its argv prefix, e.g. :func:`~.programs.pi_command`'s). Without
    ``ask``, only a package.json is read (no process started: what a launch can afford)."""
    return _info(tuple(command), ask)


_NODE_IN_WRAPPER: Final = re.compile(r"""exec\s+["']?([^"'\s]*/node)["'\s]""")


def node_for(command: Sequence[str]) -> str | None:
    """The node that runs ``command``'s pi: ``node …/cli.js``'s own, the one a wrapper script
    execs, else the first on PATH (a ``#!/usr/bin/env node`` script's)."""
    if command and os.path.basename(command[0]).startswith("node"):
        return shutil.which(command[0])
    program = shutil.which(command[0]) if command else None
    text = small_text(program) if program is not None else None
    found = _NODE_IN_WRAPPER.search(text) if text is not None else None
    if found and os.access(found[1], os.X_OK):
        return found[1]
    return shutil.which("node")


def agent_version(argv: Sequence[str], identity: AgentIdentityContract) -> str | None:
    """A pi agent's version as its entry records it (``show``): read from pi's package.json
    through the argv as started (``$PI_MATRIX_PI_COMMAND`` for a plain ``pi``); no process is
    started. None for another CLI, or a pi seen through a wrapper it cannot read."""
    if not identity.is_pi or not argv:
        return None
    started = agent_argv(argv)
    return pi_info(started[: program_length(started)], ask=False).version_text


_warned: set[str] = set()


def warn_unsupported(info: PiInfo) -> bool:
    """Warn once per process and version when pi's known version is outside the supported
    range (an unknown one is not warned about: a wrapper pi-matrix cannot see into). Returns
    whether it is not known to be unsupported."""
    if info.version is None or supported(info.version):
        return True
    if info.text not in _warned:
        _warned.add(info.text)
        log.warning(
            "pi %s is outside the supported range %s; it may work, but is untested (install a "
            "supported one: 'bash scripts/install-pi' in a pi-matrix checkout, then set "
            "PI_MATRIX_PI_COMMAND)",
            info.text,
            supported_range(),
        )
    return False
