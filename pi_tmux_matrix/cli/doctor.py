"""``pi-matrix doctor``: is this machine ready, and which settings are in force (and from where)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
from typing import TYPE_CHECKING, Any

from .. import procs
from ..errors import EXIT_FAILED, EXIT_OK
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
    pi_argv = (
        json.loads(os.environ["PI_MATRIX_PI_COMMAND"]) if os.environ.get("PI_MATRIX_PI_COMMAND") else None
    )
    pi = pi_argv[0] if pi_argv else shutil.which("pi")
    pi_version = _version([pi, "--version"]) if pi else None
    found.append(
        _check("pi", pi_version is not None, f"{pi}: {pi_version}" if pi_version else "not found",
               "npm install -g @mariozechner/pi-coding-agent (or bash scripts/install-pi in a checkout)",
               required=False)
    )  # fmt: skip
    return found


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
        io.out.write(f"  {key:<20} {item['value']!s:<8} from {item['from']}\n")
    return EXIT_FAILED if failed else EXIT_OK
