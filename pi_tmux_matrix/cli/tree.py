"""The ``tree`` verb: masters with their workers, as text (coloured on a terminal), JSON or NDJSON.

Also owns the status colours (:data:`STATUS_COLOURS`, :func:`colour_for`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import procs
from ..errors import EXIT_OK
from ..identity import Role
from ..matrix.model import Entry
from ..matrix.store import now_ms
from ..supervise.claim import unsupervised
from .base import add_verb, report_problems, store_of

if TYPE_CHECKING:
    from .base import Io

__all__ = ["STATUS_COLOURS", "cmd_tree", "colour_for", "register"]

STATUS_COLOURS: dict[str, str] = {
    "running": "32", "launching": "36", "adopted": "36", "winding_down": "33", "resumable": "33",
    "terminal": "35", "closed": "2",
}  # fmt: skip


def register(sub: Any, epilog: str) -> None:
    """Add the ``tree`` verb."""
    tree = add_verb(sub, "tree", epilog, help="masters with their workers: status, age, lane, task")
    shape = tree.add_mutually_exclusive_group()  # one output shape: both is a usage error (exit 2)
    shape.add_argument("--json", action="store_true")
    shape.add_argument("--ndjson", action="store_true", help="one entry per line, with its master")
    tree.set_defaults(handler=cmd_tree)


def colour_for(stream: Any) -> Callable[[str, str], str]:
    """ANSI colours only on a terminal, and never with ``NO_COLOR`` set (no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    if os.environ.get("NO_COLOR") or not (callable(isatty) and isatty()):
        return lambda text, _code: text
    return lambda text, code: f"\x1b[{code}m{text}\x1b[0m" if code else text


def _node(entry: Entry, now: int) -> dict[str, Any]:
    return {
        "key": entry.key,
        "agentId": entry.identity.agent_id,
        "status": entry.status.value,
        "reason": entry.reason,
        "alive": procs.is_alive(entry.process),
        "childAlive": procs.is_alive(entry.child_process),
        "unsupervised": unsupervised(entry),  # the agent runs on while its host is gone
        "lane": entry.identity.lane,
        "taskRef": entry.task_ref,
        "ageMs": now - entry.created_at,
        "pendingHandoffs": len(entry.undelivered),
    }


def _write_ndjson(io: Io, tree: list[dict[str, Any]], unparented: list[dict[str, Any]]) -> None:
    """One entry a line, each naming its master (``null`` for a master or an unparented worker)."""
    for node in tree:
        workers = node.pop("workers")
        io.out.write(json.dumps({**node, "master": None}) + "\n")
        for worker in workers:
            io.out.write(json.dumps({**worker, "master": node["key"]}) + "\n")
    for orphan in unparented:
        io.out.write(json.dumps({**orphan, "master": None}) + "\n")


def _write_text(io: Io, tree: list[dict[str, Any]], unparented: list[dict[str, Any]]) -> None:
    paint = colour_for(io.out)

    def line(node: dict[str, Any], indent: str) -> str:
        alive = "alive" if node["alive"] else (node["unsupervised"] or "dead")
        age = max(0, node["ageMs"] // 1000)
        extra = f" handoffs {node['pendingHandoffs']}" if node["pendingHandoffs"] else ""
        status = paint(node["status"], STATUS_COLOURS.get(node["status"], ""))
        alive = paint(alive, "32" if node["alive"] else "31")
        return (
            f"{indent}{node['key']}  {status}{' (' + node['reason'] + ')' if node['reason'] else ''}"
            f"  {alive}  lane {node['lane'] or '-'}  task {node['taskRef'] or '-'}  age {age}s{extra}\n"
        )

    for node in tree:
        io.out.write(line(node, ""))
        for child in node["workers"]:
            io.out.write(line(child, "  └─ "))
    if unparented:
        io.out.write("(no registered master)\n")
        for orphan in unparented:
            io.out.write(line(orphan, "  └─ "))
    if not tree and not unparented:
        io.out.write("no entries\n")


def cmd_tree(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix tree [--json]``."""
    store = store_of(args)
    listing = store.list()
    now = now_ms()
    masters = [e for e in listing.entries if e.role is Role.MASTER]
    workers = [e for e in listing.entries if e.role is Role.WORKER]
    by_session: dict[str, list[Entry]] = {}
    for worker in workers:
        by_session.setdefault(worker.parent_session_id or "", []).append(worker)
    tree = []
    for master in masters:
        node = _node(master, now)
        node["workers"] = [_node(w, now) for w in by_session.pop(master.identity.session_id, [])]
        tree.append(node)
    unparented = [_node(w, now) for ws in by_session.values() for w in ws]
    report_problems(listing.problems, io)
    if args.json:
        io.out.write(json.dumps({"masters": tree, "unparented": unparented}, indent=2) + "\n")
    elif args.ndjson:
        _write_ndjson(io, tree, unparented)
    else:
        _write_text(io, tree, unparented)
    return EXIT_OK
