"""``pi-matrix doctor``: is this machine ready, and which settings are in force (and from where)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypedDict

from .. import procs
from ..contract import ENV_PI_COMMAND
from ..errors import EXIT_FAILED, EXIT_OK, ContractError
from ..pitools import ALWAYS_PASSED_BEFORE, FD_FLAG, FD_FLAG_SINCE, SearchTool, search_tools
from ..piversion import node_for, parse_version, pi_info, supported, supported_range
from ..programs import pi_command
from ..settings import FIELDS, agent_dir, load_settings, resolve_state_dir
from ..strictjson import JSONObject
from .base import add_verb

if TYPE_CHECKING:
    from .base import Io, Verbs

__all__ = ["register"]


def register(sub: Verbs, epilog: str) -> None:
    doctor = add_verb(sub, "doctor", epilog)
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(handler=cmd_doctor)


def _version(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=15, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0][:80] if done.returncode == 0 and text else None


class Check(TypedDict):
    """One line of the report (``doctor --json`` writes them as they are)."""

    check: str
    ok: bool
    required: bool
    detail: str
    fix: str


def _check(name: str, ok: bool, detail: str, fix: str = "", *, required: bool = True) -> Check:
    return {"check": name, "ok": ok, "required": required, "detail": detail, "fix": "" if ok else fix}


def checks(state_flag: str | None) -> list[Check]:
    found: list[Check] = []
    tmux = shutil.which("tmux")
    version = _version([tmux, "-V"]) if tmux else None
    found.append(
        _check(
            "tmux",
            version is not None,
            version or "not found",
            "install tmux (without it: --backend subprocess)",
        )
    )
    me = procs.current()
    pidfd = procs.open_pidfd(me)
    if pidfd is not None:
        os.close(pidfd)
    found.append(
        _check(
            "pidfd",
            pidfd is not None,
            "parent death seen at once" if pidfd else "polling fallback",
            "a Linux kernel >= 5.3 sees parent death at once; polling still works",
            required=False,
        )
    )
    state = resolve_state_dir(state_flag)
    try:
        info = os.lstat(state)
        owner_ok = info.st_uid == os.geteuid() and stat.S_ISDIR(info.st_mode) and not info.st_mode & 0o077
        detail = f"{state} (mode {stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid})"
        found.append(
            _check("state dir", owner_ok, detail, f"chmod 700 {state}; it must be yours and a real directory")
        )
    except FileNotFoundError:
        found.append(_check("state dir", True, f"{state} (not created yet; the first agent makes it 0700)"))
    except OSError as exc:
        found.append(
            _check("state dir", False, f"{state}: {exc.strerror}", "fix its permissions or pick another")
        )
    node = shutil.which("node")
    node_version = _version([node, "--version"]) if node else None
    found.append(
        _check(
            "node",
            node_version is not None,
            node_version or "not found",
            "install Node.js (pi 1.6 needs 22.19+; 'bash scripts/install-pi' brings one)",
            required=False,
        )
    )
    found.extend(_pi_check())
    found.extend(_search_checks())
    return found


PI_PIN: Final = "1.6.0"  # the pi scripts/install-pi installs, and the tests run against
PINNED_BIN: Final = Path(".pi-cli") / "bin" / "pi"  # install-pi's wrapper: pi on the node it needs


def pinned_installs() -> list[Path]:
    """The pinned pi of ``scripts/install-pi`` (``.pi-cli/`` in a checkout), here or in the
    checkout this pi-matrix runs from, where one exists."""
    checkout = Path(__file__).resolve().parents[2]
    seen: list[Path] = []
    for root in (Path.cwd(), checkout):
        binary = root / PINNED_BIN
        if binary.is_file() and os.access(binary, os.X_OK) and binary not in seen:
            seen.append(binary)
    return seen


def _version_checks(command: list[str], answered: str) -> list[Check]:
    """pi's version against the supported range, and its node against what that pi needs
    (its package.json's engines.node)."""
    info = pi_info(command)
    version = info.version or parse_version(answered)
    shown = " ".join(command)
    found: list[Check] = []
    if info.version is not None and version is not None and answered.startswith("it did not"):
        found.append(
            _check(
                "pi",
                False,
                f"{shown}: pi {info.text}, but {answered}",
                "see the pi's node check below",
                required=False,
            )
        )
    elif version is None or not supported(version):
        what = ".".join(map(str, version)) if version else f"an unreadable version ({answered!r})"
        found.append(
            _check(
                "pi",
                False,
                f"{shown}: {what}, outside the supported range {supported_range()}",
                f"install a supported pi: 'bash scripts/install-pi' (pi {PI_PIN}, and node 22 when "
                f"needed) in a pi-matrix checkout, then "
                f"export {ENV_PI_COMMAND}='[\"/path/to/the/checkout/{PINNED_BIN}\"]'",
                required=False,
            )
        )
    else:
        detail = f"{shown}: {answered} (supported: {supported_range()})"
        found.append(_check("pi", True, detail, required=False))
    node = node_for(command)
    node_text = _version([node, "--version"]) if node else None
    node_version = parse_version(node_text or "")
    need = info.node_need
    if need is None:
        detail = f"{node or 'no node'} {node_text or ''}".rstrip() + " (pi's engines.node not found)"
        found.append(_check("pi's node", node_version is not None, detail, "install Node.js", required=False))
        return found
    wanted = ">=" + ".".join(map(str, need))
    ok = node_version is not None and node_version >= need
    found.append(
        _check(
            "pi's node",
            ok,
            f"{node} {node_text or '(no version)'}; pi {info.text} needs node {wanted}",
            f"'bash scripts/install-pi' installs node 22 next to pi when the system's is older, and "
            f"{PINNED_BIN} runs pi on it; or install Node.js {wanted}",
            required=False,
        )
    )
    return found


def _pi_check() -> list[Check]:
    """pi as the product starts it (``$PI_MATRIX_PI_COMMAND``, else ``pi`` on PATH), with its
    version and node checked; when that finds none, the pinned install of ``scripts/install-pi``
    is named with the line that uses it."""
    try:
        command = pi_command()
    except ContractError as exc:
        return [_check("pi", False, f"{ENV_PI_COMMAND}: {exc.problem}", exc.fix, required=False)]
    program = shutil.which(command[0])
    version = _version([*command, "--version"]) if program else None
    if version is not None:
        return _version_checks(command, version)
    if program is not None and pi_info(command).version is not None:
        # Its package.json is found but it does not run: most often a node older than it needs.
        return _version_checks(command, "it did not answer --version")
    # Found but silent is not "not found": the user's command runs, it only does not answer.
    shown = " ".join(command)
    missing = f"{command[0]!r} not found" if program is None else f"'{shown} --version' gave no version"
    for binary in pinned_installs():
        pinned = _version([str(binary), "--version"])
        if pinned is not None:
            where = f"{missing}; the pinned install {binary} ({pinned}) is not in use"
            use = f"export {ENV_PI_COMMAND}='{json.dumps([str(binary)])}'"
            return [_check("pi", False, where, f"use it: {use}", required=False)]
    return [
        _check(
            "pi",
            False,
            missing,
            f"install the pinned pi {PI_PIN}: 'bash scripts/install-pi' in a pi-matrix checkout (it installs "
            f"@earendil-works/pi-coding-agent@{PI_PIN} into .pi-cli/, with node 22 when the system's is "
            f"older), then export {ENV_PI_COMMAND}='[\"/path/to/the/checkout/{PINNED_BIN}\"]'",
            required=False,
        )
    ]


def _search_checks() -> list[Check]:
    """pi's fd (its find tool) and rg (its grep tool), as the pi pi-matrix starts would find them:
    ``<agent dir>/bin`` first, then PATH (the install-pi wrapper's ``tools/`` first on it)."""
    try:
        command: list[str] | None = pi_command()
    except ContractError:
        command = None
    fd, rg = search_tools(command, agent_dir())
    version = pi_info(command, ask=False).version if command else None
    return [_fd_check(fd, version), _rg_check(rg)]


def _where(tool: SearchTool) -> str:
    if tool.where == "agent dir":
        return "the agent dir's, which pi takes first"
    return "on PATH" + (" (first on the pi wrapper's)" if tool.where == "wrapper" else "")


def _fd_check(fd: SearchTool, pi_version: tuple[int, int, int] | None) -> Check:
    fix = (
        f"install fd {FD_FLAG_SINCE} or newer (it added {FD_FLAG}), or put one at "
        f"{agent_dir() / 'bin' / 'fd'} (pi looks there first), or start pi through the wrapper "
        f"'bash scripts/install-pi' writes ({PINNED_BIN}, set in {ENV_PI_COMMAND}): it puts an "
        f"adapter for an older fd first on PATH"
    )
    if fd.path is None:
        return _check(
            "pi's fd",
            False,
            "no fd or fdfind: pi's find tool fails (pi never downloads one offline)",
            fix.replace("install fd", "install fd (Debian: fd-find)", 1),
            required=False,
        )
    if fd.adapter and fd.takes_flag:
        detail = (
            f"{fd.path}: the adapter of scripts/install-pi (first on its wrapper's PATH) for "
            f"{fd.version or 'an fd'}; it drops {FD_FLAG} and applies the search root's "
            f".gitignore (not nested ones)"
        )
        return _check("pi's fd", True, detail, required=False)
    shown = f"{fd.path} ({fd.version or 'no version'}; {_where(fd)})"
    if fd.takes_flag:
        return _check("pi's fd", True, f"{shown}: takes {FD_FLAG}", required=False)
    always = ".".join(map(str, ALWAYS_PASSED_BEFORE))
    if pi_version is None:
        when = f"outside git repositories, and everywhere with pi before {always}"
    elif pi_version < ALWAYS_PASSED_BEFORE:
        when = f"everywhere: this pi ({'.'.join(map(str, pi_version))}) passes it on every find"
    else:
        when = f"outside git repositories (where pi {always}+ passes it)"
    detail = f"{shown} rejects {FD_FLAG}: pi's find fails {when}"
    return _check("pi's fd", False, detail, fix, required=False)


def _rg_check(rg: SearchTool) -> Check:
    if rg.path is None:
        return _check(
            "pi's rg",
            False,
            "no rg: pi's grep tool fails (pi never downloads one offline)",
            "install ripgrep (Debian: ripgrep)",
            required=False,
        )
    ok = rg.version is not None
    detail = f"{rg.path} ({rg.version or 'it did not answer --version'}; {_where(rg)})"
    return _check("pi's rg", ok, detail, "install ripgrep", required=False)


def cmd_doctor(args: argparse.Namespace, io: Io) -> int:
    settings = load_settings()
    # Every setting, named as in settings.json, from the one table in settings.py.
    fields = dict(FIELDS)
    values = {key: getattr(settings, field) for key, field in fields.items()}
    values = {k: dict(v) if k == "forkEnvironment" else v for k, v in values.items()}
    found = checks(args.state_dir)
    shown_settings = {
        k: {"value": v, "from": settings.sources.get(fields[k], "default")} for k, v in values.items()
    }
    report: JSONObject = {
        "checks": found,
        "agentDir": str(agent_dir()),
        "settings": shown_settings,
    }
    failed = [c for c in found if c["required"] and not c["ok"]]
    if args.json:
        io.out.write(json.dumps(report, indent=2) + "\n")
        return EXIT_FAILED if failed else EXIT_OK
    for check in found:
        mark = "ok  " if check["ok"] else ("FAIL" if check["required"] else "warn")
        io.out.write(f"{mark}  {check['check']:<10} {check['detail']}\n")
        if check["fix"]:
            io.out.write(f"      fix: {check['fix']}\n")
    io.out.write(f"\nsettings (agent dir {report['agentDir']}):\n")
    for key, item in shown_settings.items():
        # As settings.json spells it (true, null, {"K": "v"}), never Python's True or None.
        shown = json.dumps(item["value"], ensure_ascii=False)
        io.out.write(f"  {key:<20} {shown:<8} from {item['from']}\n")
    return EXIT_FAILED if failed else EXIT_OK
