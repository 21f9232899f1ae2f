"""The search tools pi runs: fd for its ``find`` tool, ripgrep (``rg``) for its ``grep``.

pi takes ``<agent dir>/bin/fd`` (``bin/rg``) when it exists, else the first of ``fd``, ``fdfind``
(Debian's name) on PATH (``rg``), and never downloads one offline. Its find passes fd
``--no-require-git`` (respect .gitignore even outside a git repository; fd 8.7.0 added it): pi
0.67.6 to 0.79.9 on every find, pi 0.79.10 and later only outside a git repository. An older fd
(Debian bookworm's fd-find 8.6.0) rejects the flag and each such find is a usage error.
``scripts/install-pi`` then installs an adapter (``scripts/pi-fd-adapter``) as
``<prefix>/tools/fd``, and its wrapper ``<prefix>/bin/pi`` puts that folder first on PATH.

:func:`search_tools` says which fd and rg the pi of a command would run, their versions, and
whether the fd takes the flag, as ``pi-matrix doctor`` reports it (and the tests check it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from .piversion import small_text

__all__ = ["ALWAYS_PASSED_BEFORE", "FD_FLAG", "FD_FLAG_SINCE", "SearchTool", "search_tools", "wrapper_path"]

FD_FLAG: Final = "--no-require-git"
FD_FLAG_SINCE: Final = "8.7.0"  # the fd release that added it
# pi before 0.79.10 passes the flag on every find; 0.79.10 and later only outside a git repository.
ALWAYS_PASSED_BEFORE: Final[tuple[int, int, int]] = (0, 79, 10)
ADAPTER_MARK: Final = "pi-matrix fd adapter"  # a line of scripts/pi-fd-adapter
# install-pi's wrapper: `if [ -d "DIR" ]; then PATH="DIR:$PATH"; export PATH; fi`
_WRAPPER_PATH: Final = re.compile(r'if \[ -d "([^"\n]+)" \]; then PATH="\1:\$PATH"')


@attrs.frozen
class SearchTool:
    """One tool as pi would run it."""

    name: str  # "fd" or "rg"
    path: str | None  # the program pi runs, or None: pi finds none
    where: str = ""  # "agent dir", "wrapper" (install-pi's tools/ first on PATH) or "PATH"
    version: str | None = None  # the first line of its --version
    adapter: bool = False  # install-pi's fd adapter
    takes_flag: bool | None = None  # fd only: does it accept --no-require-git?


def _run(argv: list[str], env: Mapping[str, str]) -> tuple[int, str] | None:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
            stdin=subprocess.DEVNULL,
            env=dict(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return done.returncode, (lines[0][:80] if lines else "")


def wrapper_path(command: Sequence[str]) -> str | None:
    """The folder a ``scripts/install-pi`` wrapper puts first on PATH (its ``tools/``, holding the
    fd adapter), when ``command`` is such a wrapper and the folder exists (as the wrapper checks)."""
    program = shutil.which(command[0]) if command else None
    text = small_text(os.path.realpath(program)) if program is not None else None
    found = _WRAPPER_PATH.search(text) if text is not None else None
    return found[1] if found and os.path.isdir(found[1]) else None


def _find(names: Sequence[str], agent_dir: Path, path: str, wrapper: str | None) -> tuple[str | None, str]:
    own = agent_dir / "bin" / names[0]
    if os.path.exists(own):  # pi checks only that it exists
        return str(own), "agent dir"
    for name in names:
        found = shutil.which(name, path=path)
        if found is not None:
            where = "wrapper" if wrapper and os.path.dirname(found) == wrapper.rstrip("/") else "PATH"
            return found, where
    return None, ""


def search_tools(
    command: Sequence[str] | None, agent_dir: Path, environ: Mapping[str, str] | None = None
) -> tuple[SearchTool, SearchTool]:
    """(fd, rg) as the pi of ``command`` (its argv prefix; None: a plain ``pi``) would find them
    with ``agent_dir`` and ``environ``'s PATH (default: this process's), each run once for its
    version, and the fd once more with ``--no-require-git --version``."""
    env = dict(os.environ if environ is None else environ)
    wrapper = wrapper_path(command) if command else None
    path = env.get("PATH", os.defpath)
    if wrapper is not None:
        path = f"{wrapper}:{path}"
    env["PATH"] = path
    found: list[SearchTool] = []
    for name, names in (("fd", ("fd", "fdfind")), ("rg", ("rg",))):
        program, where = _find(names, agent_dir, path, wrapper)
        if program is None:
            found.append(SearchTool(name, None))
            continue
        answer = _run([program, "--version"], env)
        version = answer[1] if answer is not None and answer[0] == 0 else None
        adapter = name == "fd" and ADAPTER_MARK in (small_text(program) or "")
        takes: bool | None = None
        if name == "fd":
            tried = _run([program, FD_FLAG, "--version"], env)
            takes = tried is not None and tried[0] == 0
        found.append(SearchTool(name, program, where, version, adapter, takes))
    return found[0], found[1]
