"""``pi-matrix fake-model``: the bundled fake model on 127.0.0.1, and a pi agent dir that uses it,
so anyone can try real pi and the real flow offline, with no key (docs/offline.md)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final

from ..contract import ENV_AGENT_DIR, ENV_OFFLINE
from ..errors import EXIT_OK, ContractError
from .base import add_verb

if TYPE_CHECKING:
    from ..testing.fake_model import Reply, Request
    from .base import Io, Verbs

__all__ = ["default_agent_dir", "parse_port", "register"]

# A folder of its own, never pi's ~/.pi/agent: pointing that at a fake would take the user's
# provider away from every pi they run.
DEFAULT_AGENT_DIR: Final = "~/.pi/fake-model-agent"
PROXY_VARIABLES: Final = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def register(sub: Verbs, epilog: str) -> None:
    verb = add_verb(sub, "fake-model", epilog)
    verb.add_argument(
        "--port", metavar="N", default="0", help="the port on 127.0.0.1 (default: 0, any free one)"
    )
    verb.add_argument(
        "--agent-dir",
        metavar="DIR",
        help=f"the pi agent dir to point at it (default: {DEFAULT_AGENT_DIR}, never pi's own ~/.pi/agent)",
    )
    verb.add_argument(
        "--force",
        action="store_true",
        help="replace a models.json or default provider in DIR that is not the fake's (kept beside)",
    )
    verb.set_defaults(handler=cmd_fake_model)


def parse_port(word: str) -> int:
    """``--port``: 0 (any free port) or 1-65535."""
    try:
        port = int(word, 10)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ContractError("--port", f"{word!r} is not a port number", "give 1-65535, or 0 for any free one")
    return port


def default_agent_dir() -> Path:
    return Path(os.path.expanduser(DEFAULT_AGENT_DIR))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:120]


def cmd_fake_model(args: argparse.Namespace, io: Io) -> int:
    from ..testing.fake_model import (
        BACKUP_SUFFIX,
        MODEL,
        PROVIDER,
        FakeModel,
        check_agent_dir,
        write_pi_agent_dir,
    )

    port = parse_port(args.port)
    folder = (
        Path(os.path.abspath(os.path.expanduser(args.agent_dir))) if args.agent_dir else default_agent_dir()
    )
    check_agent_dir(folder, force=args.force)  # a refusal comes before the port is taken
    lock = threading.Lock()
    answered = [0]

    def log_reply(request: Request, reply: Reply) -> None:
        with lock:
            answered[0] += 1
            said = f"a call of {reply.tool}" if reply.tool else repr(_one_line(reply.text))
            io.out.write(f"answer {answered[0]}: {said}\n")
            io.out.flush()

    model = FakeModel(port=port, on_reply=log_reply)
    try:
        model.start()
    except OSError as exc:
        raise ContractError(
            "--port",
            f"cannot listen on 127.0.0.1:{port} ({exc.strerror or exc})",
            "pick another port, or 0 for any free one",
        ) from exc
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    try:
        # Written once the port is ours: a port that cannot be had leaves the folder as it was.
        for kept in write_pi_agent_dir(folder, model.base_url, force=args.force):
            io.out.write(f"kept the replaced {kept.name.removesuffix(BACKUP_SUFFIX)} as {kept}\n")
        for sig in previous:
            signal.signal(sig, on_signal)
        lines = [
            f"fake model serving at {model.base_url} (provider {PROVIDER}, model {MODEL}; no key needed)",
            f"pi's agent dir {folder} now uses it. In another shell:",
            "",
            f"  export {ENV_AGENT_DIR}={folder}",
            f"  export {ENV_OFFLINE}=1",
        ]
        if any(os.environ.get(name) for name in PROXY_VARIABLES):
            # pi sends through a configured proxy, which cannot reach this machine's 127.0.0.1.
            others = os.environ.get("NO_PROXY") or os.environ.get("no_proxy")
            lines.append(f"  export NO_PROXY=127.0.0.1,localhost{',' + others if others else ''}")
        lines += [
            '  pi -p "hi"                        # answers: ok',
            "",
            (
                "A prompt holding a dispatcher's marker instruction is answered with its marker "
                "(DONE:<code>); anything else with 'ok'. Ctrl-C stops it."
            ),
        ]
        io.out.write("".join(line + "\n" for line in lines))
        io.out.flush()
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        model.close()
    io.out.write(f"fake model stopped after {answered[0]} answer(s)\n")
    return EXIT_OK
