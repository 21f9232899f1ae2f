"""What ``ls``, ``show`` and ``repair`` do once there is something to read (the model, the store,
liveness and the table renderer load here, on first use: see :mod:`.entries`)."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, TypedDict

import attrs

from .. import procs
from ..errors import EXIT_OK, ContractError
from ..matrix.model import Entry
from ..matrix.store import MatrixStore, now_ms
from ..matrix.strays import unsupervised
from ..safetext import printable
from ..settings import load_settings
from .base import STOP_WORD, age, report_problems, store_of
from .names import resolve_key
from .render import Column, Row, print_table, status_cell, task_cell

if TYPE_CHECKING:
    from .base import Io

__all__ = ["cmd_ls", "cmd_repair", "cmd_show", "describe", "tool_blocks"]


class _Liveness:
    """Cached identity checks: one /proc read per pid per command."""

    def __init__(self, *, many: bool = False) -> None:
        self._cache: dict[tuple[int, int, str], bool] = {}
        # Many entries (ls): one listing of /proc, taken at the first check (after the entries
        # were read), spares the failed /proc read of every pid that is gone.
        self._many = many
        self._running: frozenset[int] | None = None

    def __call__(self, entry: Entry) -> bool:
        process = entry.process
        if process is None:
            return False
        if self._many:
            if self._running is None:
                self._running = procs.running_pids()
            if process.pid not in self._running:
                return False
        key = (process.pid, process.start_ticks, process.boot_id)
        if key not in self._cache:
            self._cache[key] = procs.is_alive(process)
        return self._cache[key]


LS_COLUMNS = (
    Column("KEY", 100, key=True),
    Column("NAME", 70, shrink=12, cut_first=True),
    Column("ROLE", 60),
    Column("STATUS", 90, shrink=9),
    Column("ALIVE", 80, shrink=5),
    Column("PID", 55, right=True),
    Column("PARENT", 30, right=True),
    Column("LANE", 50, shrink=8),
    Column("TASK", 45, shrink=10),
    Column("AGE", 70, right=True),
    Column("BEAT", 40, right=True),
)


def cmd_ls(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix ls [--json]`` over a state dir that holds something."""
    result = store_of(args).list()
    alive = _Liveness(many=True)
    if args.json or args.ndjson:
        rows = [{**raw, "alive": alive(entry)} for entry, raw in zip(result.entries, result.raw, strict=True)]
        if args.ndjson:
            io.out.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        else:
            io.out.write(json.dumps(rows, ensure_ascii=False) + "\n")
        report_problems(result.problems, io)
        return EXIT_OK
    now = now_ms()
    table: list[Row] = []
    for entry in result.entries:
        live = alive(entry)
        table.append(
            Row(
                (
                    entry.key,
                    entry.identity.agent_id,
                    entry.role.value,
                    status_cell(entry, live)[0],
                    "yes" if live else (unsupervised(entry) or "no"),
                    str(entry.pid or "-"),
                    str(entry.parent_pid or "-"),
                    entry.identity.lane or "-",
                    task_cell(entry),
                    age(entry.created_at, now),
                    age(entry.heartbeat_at, now),
                ),
                ("", "", "", status_cell(entry, live)[1], "green" if live else "red"),
            )
        )
    if table:
        print_table(io, LS_COLUMNS, table)
    else:
        io.out.write(f"no entries in {store_of(args).root}\n")
    report_problems(result.problems, io)
    return EXIT_OK


def cmd_show(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix show KEY [--json]``."""
    store = store_of(args)
    entry = store.get(resolve_key(store, args.key))
    alive = _Liveness()(entry)
    from ..matrix.codec import unstructure_entry

    blocked, start_failure = tool_blocks(store, entry.key)
    raw = {**unstructure_entry(entry), "alive": alive, "toolBlocks": blocked, "startFailure": start_failure}
    if args.json:
        io.out.write(json.dumps(raw, ensure_ascii=False, indent=2) + "\n")
        return EXIT_OK
    lines = describe(entry, alive, blocked, start_failure)
    from ..dispatch.jobs import JobStore

    agent = JobStore(store).agent_of(entry.key)
    if agent is not None and agent.where != "-":
        lines.insert(1, f"  place        {printable(agent.where)} (or: pi-matrix attach {entry.key})")
    io.out.write("\n".join(lines) + "\n")
    return EXIT_OK


def _ready_text(entry: Entry, now: int) -> str:
    """When the agent was ready: its bridge's report (pi loaded), or why there is none."""
    if entry.ready_at is not None:
        after = max(0, entry.ready_at - entry.created_at) / 1000
        return f"{age(entry.ready_at, now)} ago ({after:.1f}s after it registered)"
    if not entry.identity.is_pi:
        return f"- ({entry.identity.provider} has no bridge to report it: ready once running)"
    if entry.readiness == "loading":
        return "not yet (pi loading)"
    return "- (pi's bridge never reported in)"


def describe(entry: Entry, alive: bool, blocked: list[ToolBlock], start_failure: str | None) -> list[str]:
    """``show``'s text for an entry, each line safe for a terminal (``top``'s detail pane too)."""
    now = now_ms()
    lines = [
        (
            f"{entry.key}  {entry.role.value}  {entry.status.value}"
            + (f" ({entry.reason})" if entry.reason else "")
        ),
        f"  alive        {'yes' if alive else 'no'} (pid {entry.pid}, start {entry.proc_start})",
        *_unsupervised_lines(entry),
        f"  generation   {entry.generation} (registered as {entry.registration})",
        (
            f"  created      {age(entry.created_at, now)} ago; updated {age(entry.updated_at, now)} ago;"
            f" heartbeat {age(entry.heartbeat_at, now)} ago"
        ),
    ]
    if entry.parent_pid is not None:
        lines.append(f"  parent       pid {entry.parent_pid} session {entry.parent_session_id or '-'}")
    if entry.child_pid is not None:
        lines.append(f"  child        pid {entry.child_pid} start {entry.child_proc_start}")
    if entry.task_ref or entry.task_summary:
        lines.append(f"  task         {entry.task_ref or '-'}: {task_cell(entry)}")
    if entry.agent_version is not None:
        lines.append(f"  version      {entry.identity.provider or 'agent'} {entry.agent_version}")
    lines.append(f"  ready        {_ready_text(entry, now)}")
    for name, value in attrs.asdict(entry.identity).items():
        if value not in (None, (), []):
            shown = value.value if hasattr(value, "value") else value
            lines.append(f"  identity.{name:<18} {shown}")
    if entry.directive is not None:
        d = entry.directive
        lines.append(f"  directive    {d.kind.value} by pid {d.parent_pid} session {d.parent_session_id}")
    if entry.resumable is not None:
        r = entry.resumable
        lines.append(f"  resumable    {r.reason} {age(r.at, now)} ago; task {r.task_ref or '-'}")
        if r.task_summary:
            lines.append(f"    summary    {r.task_summary[:200]}")
    for handoff in entry.handoffs:
        state = "delivered" if handoff.delivered_at else "UNDELIVERED"
        lines.append(f"  handoff      {handoff.id} {handoff.outcome.value} {state}")
    if entry.exit is not None:
        ended = entry.exit
        lines.append(f"  exit         {ended.kind.value} code {ended.code} signal {ended.signal}")
    if start_failure is not None:
        lines.append(f"  start        the agent could not start: {start_failure[:300]}")
    for block in blocked:
        lines.append(f"  blocked      {age(block['at'], now)} ago {block['tool']} {block['path'] or '-'}")
        lines.append(f"    reason     {str(block['reason'] or '-')[:300]}")
    return [printable(line) for line in lines]


def _unsupervised_lines(entry: Entry) -> list[str]:
    note = unsupervised(entry)
    if note is None:
        return []
    stop = f"pi-matrix stop {entry.key} --confirm {STOP_WORD}"
    return [f"  agent        {note}: its host is gone; stop it with '{stop}'"]


SHOWN_BLOCKS = 5


class ToolBlock(TypedDict):
    """A tool call the worker's envelope blocked, as its host's event recorded it."""

    at: int | None
    tool: str
    path: str | None
    reason: str | None


def tool_blocks(store: MatrixStore, key: str) -> tuple[list[ToolBlock], str | None]:
    """The last few tool calls the worker's envelope blocked (its host records each one), and why
    its agent could not start, if it could not."""
    from ..matrix.mailbox import EventLog

    found: list[ToolBlock] = []
    start_failure: str | None = None
    for event in EventLog(store, key).tail(2000):
        if event.get("event") == "registered":
            start_failure = None  # a later host of the key: an earlier start's failure is history
        if event.get("event") == "spawn_failed":
            start_failure = str(event.get("error") or "unknown error")
        if event.get("event") != "tool_blocked":
            continue
        at = event.get("at")
        found.append(
            {
                "at": at if isinstance(at, int) else None,
                "tool": str(event.get("tool") or "?"),
                "path": path if isinstance(path := event.get("path"), str) else None,
                "reason": reason if isinstance(reason := event.get("reason"), str) else None,
            }
        )
    return found[-SHOWN_BLOCKS:], start_failure


def cmd_repair(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix repair [--dry-run] [--json]``."""
    settings = load_settings()
    if not settings.enabled and not args.dry_run:
        raise ContractError(
            "processMatrix.enabled",
            "is false, so nothing may be written",
            "use --dry-run to see what repair would do, or enable the matrix in settings.json",
        )
    actions = store_of(args).repair(dry_run=args.dry_run)
    if args.json:
        io.out.write(json.dumps([attrs.asdict(a) for a in actions], indent=2) + "\n")
        return EXIT_OK
    verb = "would " if args.dry_run else ""
    for action in actions:
        if action.action == "quarantine":
            line = f"{verb}quarantine {action.path}: {action.reason} -> {action.target}"
            io.out.write(printable(line) + "\n")
            key = os.path.basename(action.path).removesuffix(".json")
            if action.resumable is not None:
                back = f"  {verb}keep {key} resumable from its session file {action.resumable}"
                back += f": pi-matrix resume {key}"
                io.out.write(printable(back) + "\n")
            elif key.startswith("worker-"):
                lost = f"  {key} cannot be resumed afterwards: its bytes name no session file that is there"
                io.out.write(printable(lost) + "\n")
        elif action.action == "remove-temp":
            io.out.write(printable(f"{verb}remove {action.path}: {action.reason}") + "\n")
        else:
            io.out.write(printable(f"skip {action.path}: {action.reason}") + "\n")
    if not actions:
        io.out.write("nothing to repair\n")
    return EXIT_OK
