"""``pi-matrix doctor``: is this machine ready, and which settings are in force (and from where)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .. import procs
from ..contract import ENV_PI_COMMAND
from ..errors import EXIT_FAILED, EXIT_OK, ContractError
from ..programs import pi_command
from ..settings import FIELDS, agent_dir, load_settings, resolve_state_dir

if TYPE_CHECKING:
    from .base import Io

__all__ = ["register"]


def register(sub: Any, epilog: str) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check tmux, pidfd, the state dir, node and pi, and show the settings in force",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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


def _check(name: str, ok: bool, detail: str, fix: str = "", *, required: bool = True) -> dict[str, Any]:
    return {"check": name, "ok": ok, "required": required, "detail": detail, "fix": "" if ok else fix}


def checks(state_flag: str | None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
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
        _check("pidfd", pidfd is not None, "parent death seen at once" if pidfd else "polling fallback",
               "a Linux kernel >= 5.3 sees parent death at once; polling still works", required=False)
    )  # fmt: skip
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
            "install Node.js 20+",
            required=False,
        )
    )
    found.append(_pi_check())
    return found


PI_PIN: Final = "0.73.1"  # the pi scripts/install-pi installs, and the tests run against
PINNED_BIN: Final = Path(".pi-cli") / "node_modules" / ".bin" / "pi"


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


def _pi_check() -> dict[str, Any]:
    """pi as the product starts it (``$PI_MATRIX_PI_COMMAND``, else ``pi`` on PATH); when that
    finds none, the pinned install of ``scripts/install-pi`` is named with the line that uses it."""
    try:
        command = pi_command()
    except ContractError as exc:
        return _check("pi", False, f"{ENV_PI_COMMAND}: {exc.problem}", exc.fix, required=False)
    program = shutil.which(command[0])
    version = _version([*command, "--version"]) if program else None
    if version is not None:
        return _check("pi", True, f"{' '.join(command)}: {version}", required=False)
    # Found but silent is not "not found": the user's command runs, it only does not answer.
    shown = " ".join(command)
    missing = f"{command[0]!r} not found" if program is None else f"'{shown} --version' gave no version"
    for binary in pinned_installs():
        pinned = _version([str(binary), "--version"])
        if pinned is not None:
            where = f"{missing}; the pinned install {binary} ({pinned}) is not in use"
            use = f"export {ENV_PI_COMMAND}='{json.dumps([str(binary)])}'"
            return _check("pi", False, where, f"use it: {use}", required=False)
    return _check(
        "pi", False, missing,
        f"install the pinned pi {PI_PIN}: 'bash scripts/install-pi' in a pi-matrix checkout (it runs "
        f"'npm install --prefix .pi-cli @mariozechner/pi-coding-agent@{PI_PIN}'), then "
        f"export {ENV_PI_COMMAND}='[\"/path/to/the/checkout/{PINNED_BIN}\"]'",
        required=False,
    )  # fmt: skip


def cmd_doctor(args: argparse.Namespace, io: Io) -> int:
    settings = load_settings()
    # Every setting, named as in settings.json, from the one table in settings.py.
    fields = dict(FIELDS)
    values = {key: getattr(settings, field) for key, field in fields.items()}
    values = {k: dict(v) if k == "forkEnvironment" else v for k, v in values.items()}
    report: dict[str, Any] = {
        "checks": checks(args.state_dir),
        "agentDir": str(agent_dir()),
        "settings": {
            k: {"value": v, "from": settings.sources.get(fields[k], "default")} for k, v in values.items()
        },
    }
    failed = [c for c in report["checks"] if c["required"] and not c["ok"]]
    if args.json:
        io.out.write(json.dumps(report, indent=2) + "\n")
        return EXIT_FAILED if failed else EXIT_OK
    for check in report["checks"]:
        mark = "ok  " if check["ok"] else ("FAIL" if check["required"] else "warn")
        io.out.write(f"{mark}  {check['check']:<10} {check['detail']}\n")
        if check["fix"]:
            io.out.write(f"      fix: {check['fix']}\n")
    io.out.write(f"\nsettings (agent dir {report['agentDir']}):\n")
    for key, item in report["settings"].items():
        # As settings.json spells it (true, null, {"K": "v"}), never Python's True or None.
        shown = json.dumps(item["value"], ensure_ascii=False)
        io.out.write(f"  {key:<20} {shown:<8} from {item['from']}\n")
    return EXIT_FAILED if failed else EXIT_OK
