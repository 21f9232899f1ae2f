"""The ``tree`` verb: masters with their workers, as a table (coloured on a terminal), JSON or NDJSON."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from .. import procs
from ..errors import EXIT_OK
from ..identity import Role
from ..matrix.model import Entry
from ..matrix.store import now_ms
from ..matrix.strays import unsupervised
from .base import add_verb, age, report_problems, store_of
from .render import Column, Row, print_table, status_cell, status_style, task_cell, tree_indent

if TYPE_CHECKING:
    from .base import Io, Verbs

__all__ = ["TREE_COLUMNS", "cmd_tree", "register"]

TREE_COLUMNS = (
    Column("KEY", 100, key=True),
    Column("NAME", 70, shrink=12, cut_first=True),
    Column("STATUS", 90, shrink=9),
    Column("ALIVE", 80, shrink=5),
    Column("LANE", 50, shrink=8),
    Column("TASK", 45, shrink=10),
    Column("AGE", 70, right=True),
    Column("HANDOFFS", 40, right=True),
)


def register(sub: Verbs, epilog: str) -> None:
    """Add the ``tree`` verb."""
    tree = add_verb(sub, "tree", epilog)
    shape = tree.add_mutually_exclusive_group()  # one output shape: both is a usage error (exit 2)
    shape.add_argument("--json", action="store_true")
    shape.add_argument("--ndjson", action="store_true", help="one entry per line, with its master")
    tree.set_defaults(handler=cmd_tree)


def _node(entry: Entry, now: int) -> dict[str, Any]:
    alive = procs.is_alive(entry.process)
    shown, _style = status_cell(entry, alive)
    return {
        "key": entry.key,
        "agentId": entry.identity.agent_id,
        "status": entry.status.value,
        "statusText": shown,  # what the views show: the record's words, or the truth when its host is gone
        "reason": entry.reason,
        "alive": alive,
        "childAlive": procs.is_alive(entry.child_process),
        "unsupervised": unsupervised(entry),  # the agent runs on while its host is gone
        "lane": entry.identity.lane,
        "taskRef": entry.task_ref,
        "task": task_cell(entry),
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
    def row(node: dict[str, Any], indent: str = "") -> Row:
        alive = "yes" if node["alive"] else (node["unsupervised"] or "no")
        cells = (
            node["key"],
            node["agentId"],
            node["statusText"],
            alive,
            node["lane"] or "-",
            node["task"],
            age(now_ms() - node["ageMs"]),
            str(node["pendingHandoffs"]),
        )
        styles = (
            "bold" if not indent else "",
            "",
            status_style(node["status"], node["statusText"]),
            "green" if node["alive"] else "red",
        )
        return Row(cells, styles, indent)

    def children(nodes: list[dict[str, Any]]) -> list[Row]:
        return [row(n, tree_indent(i == len(nodes) - 1)) for i, n in enumerate(nodes)]

    rows: list[Row] = []
    for node in tree:
        rows.append(row(node))
        rows.extend(children(node["workers"]))
    if unparented:
        rows.append(Row(("(no master)", *[""] * (len(TREE_COLUMNS) - 1)), ("dim",), label=True))
        rows.extend(children(unparented))
    if rows:
        print_table(io, TREE_COLUMNS, rows)
    else:
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
