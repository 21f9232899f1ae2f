"""The owner's verbs on the matrix: scan, reconcile, adopt, cleanup, send and stop.

Each either reports (scan, a dry-run reconcile) or writes one guarded change an owner asked for:
a reconciliation plan under CAS, an adoption grant or a cleanup request by handshake, or a
message in a live host's mailbox.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from .. import procs
from ..errors import EXIT_OK, ContractError, NotConfirmed, PiMatrixError
from ..identity import Mode, Role, parse_key
from ..matrix import lifecycle
from ..matrix.mailbox import EventLog, Inbox, encode_message
from ..matrix.model import Entry, Status
from ..matrix.owners import calling_master, owning_master, require_master
from ..matrix.reconcile import reconcile
from ..matrix.store import MatrixStore, Problem, now_ms
from ..settings import load_settings
from ..supervise.bridge_reports import bridge_silent
from ..supervise.child import reachable
from ..supervise.claim import stop_stray, stray_agent
from ..supervise.master import apply_plan, gather_facts, grant, handshake
from .base import (
    STOP_WORD,
    add_verb,
    confirmed,
    report_problems,
    require_matrix,
    stop_target,
    store_of,
    sweep_history,
)
from .names import Kind, resolve, resolve_key

if TYPE_CHECKING:
    from .base import Io, Verbs

STRAY_GRACE_S = 3.0  # as a host's default --stop-grace: SIGTERM, this long, then SIGKILL

__all__ = ["cmd_adopt", "cmd_cleanup", "cmd_reconcile", "cmd_scan", "cmd_send", "cmd_stop", "register"]


def register(sub: Verbs, epilog: str) -> None:
    """Add scan, reconcile, adopt, cleanup, send and stop."""
    scan = add_verb(sub, "scan", epilog)
    scan.add_argument("--json", action="store_true")
    scan.set_defaults(handler=cmd_scan)

    rec = add_verb(sub, "reconcile", epilog)
    rec.add_argument("--dry-run", action="store_true")
    rec.add_argument("--json", action="store_true")
    rec.set_defaults(handler=cmd_reconcile)

    adopt = add_verb(sub, "adopt", epilog)
    adopt.add_argument("key", metavar="KEY")
    adopt.add_argument("--parent-pid", type=int, metavar="PID", help="the adopting master's pid")
    adopt.add_argument("--parent-session", metavar="ID", help="the adopting master's session id")
    adopt.set_defaults(handler=cmd_adopt)

    cleanup = add_verb(sub, "cleanup", epilog)
    cleanup.add_argument("key", metavar="KEY")
    cleanup.set_defaults(handler=cmd_cleanup)

    send = add_verb(sub, "send", epilog)
    send.add_argument("key", metavar="KEY")
    what = send.add_mutually_exclusive_group(required=True)
    what.add_argument("--steer", metavar="TEXT")
    what.add_argument("--prompt", metavar="TEXT")
    what.add_argument("--abort", action="store_true")
    send.set_defaults(handler=cmd_send)

    stop = add_verb(
        sub,
        "stop",
        epilog,
    )
    stop.add_argument("key", nargs="?", metavar="KEY|ID", help="an entry key (worker-…) or a job id (job-…)")
    stop.add_argument(
        "--confirm",
        nargs="?",
        const=True,
        metavar="WORD",
        help="really stop it with the word yes-tmux-stop (alone: asks y/N on a terminal); else a preview",
    )
    stop.add_argument("--json", action="store_true", help="a job stop: print the job afterwards")
    stop.set_defaults(handler=cmd_stop)


def _orphan_rows(store: MatrixStore) -> tuple[list[dict[str, Any]], tuple[Problem, ...]]:
    listing = store.list()
    facts = gather_facts(listing.entries)
    plan = reconcile(listing.entries, facts)
    by_key = {e.key: e for e in listing.entries}
    rows = []
    for key in plan.orphans:
        entry = by_key[key]
        rows.append(
            {
                "key": key,
                "agentId": entry.identity.agent_id,
                "lane": entry.identity.lane,
                "status": entry.status.value,
                "alive": facts.alive.get(key, False) or facts.child_alive.get(key, False),
                "parentPid": entry.parent_pid,
                "parentSessionId": entry.parent_session_id,
                "taskRef": entry.task_ref,
                "resumable": entry.identity.resume_complete,
            }
        )
    return rows, listing.problems


def cmd_scan(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix scan [--json]``: report only."""
    rows, problems = _orphan_rows(store_of(args))
    report_problems(problems, io)
    if args.json:
        io.out.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    if not rows:
        io.out.write("no orphans\n")
    for row in rows:
        io.out.write(
            f"orphan {row['key']} agent {row['agentId']} lane {row['lane'] or '-'} {row['status']} "
            f"{'alive' if row['alive'] else 'dead'} (parent pid {row['parentPid']}, "
            f"session {row['parentSessionId'] or '-'}, task {row['taskRef'] or '-'})\n"
        )
    return EXIT_OK


def cmd_reconcile(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix reconcile [--dry-run] [--json]``."""
    store = store_of(args)
    listing = store.list()
    plan = reconcile(listing.entries, gather_facts(listing.entries))
    if args.dry_run:
        rows = [
            {"key": a.key, "action": a.kind.value, "reason": a.reason, "generation": a.generation}
            for a in plan.actions
        ]
    else:
        if not load_settings().enabled:
            raise ContractError(
                "processMatrix.enabled", "is false, so nothing may be written", "use --dry-run"
            )
        rows = [{"key": k, "action": a, "reason": r} for k, a, r in apply_plan(store, plan)]
        rows += _settled_rounds(store)
    swept = None if args.dry_run else sweep_history(store)
    if args.json:
        io.out.write(json.dumps(rows, indent=2) + "\n")
    else:
        for row in rows:
            io.out.write(f"{row['key']}: {row['action']} ({row['reason']})\n")
        if not rows:
            io.out.write("nothing to reconcile\n")
        if swept is not None and swept.removed:
            io.out.write(
                f"gc: removed {sum(f.files for f in swept.removed)} file(s) of history past "
                f"{swept.plan.days:g} day(s) and of removed entries ('pi-matrix gc' shows what is kept)\n"
            )
    return EXIT_OK


def _settled_rounds(store: MatrixStore) -> list[dict[str, Any]]:
    """Job rounds whose host and agent ended unseen get their result
    (docs/decisions.md#a-hostless-round-stays-open-until-its-agent-ends)."""
    from ..dispatch.hostless import settle_all

    return [
        {"key": r.key, "action": "round_exited", "reason": f"job {r.job_id} round {r.round}: {r.detail}"}
        for r in settle_all(store)
    ]


def _worker(store: MatrixStore, args: argparse.Namespace) -> Entry:
    key = args.key = resolve_key(store, args.key)
    role, _ = parse_key(key)
    entry = store.get(key)
    if role is not Role.WORKER:
        raise ContractError("KEY", f"{key} is a master", "name a worker entry (worker-<sessionId>)")
    return entry


def cmd_adopt(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix adopt KEY [--parent-pid P --parent-session S]``."""
    require_matrix("adopt")
    store = store_of(args)
    entry = _worker(store, args)
    master, session = require_master(owning_master(store, args.parent_pid, args.parent_session), "adopt")
    if entry.status in (Status.TERMINAL, Status.CLOSED):
        raise ContractError(
            "KEY", f"{args.key} is {entry.status.value}", "only a live or resumable worker can be adopted"
        )
    # One grant wins: a refusal (another master's grant won) is raised naming the winner.
    grant(store, entry, master, session, "pi-matrix adopt")
    io.out.write(f"adoption granted: {args.key} -> master session {session} (pid {master.pid})\n")
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix cleanup KEY``."""
    require_matrix("cleanup")
    store = store_of(args)
    entry = _worker(store, args)
    found = calling_master(store)
    session = found[1] if found else None
    handshake(store, entry, lambda e: lifecycle.request_cleanup(e, session, now_ms()), "pi-matrix cleanup")
    io.out.write(f"cleanup requested: {args.key} (the worker stops its own agent and exits)\n")
    return EXIT_OK


def _live_host(store: MatrixStore, key: str) -> Entry:
    parse_key(key)
    entry = store.get(key)
    if not procs.is_alive(entry.process):
        raise PiMatrixError(
            f"{key}: its host (pid {entry.pid}) is not alive; nothing can receive the message"
        )
    return entry


def _check_listening(store: MatrixStore, entry: Entry) -> None:
    """Refuse a message nobody would take: the agent's process is gone (its host lives on, e.g.
    waiting out its grace window), or the pi bridge that reads its mailbox never reported."""
    if entry.child_process is not None and not procs.is_alive(entry.child_process):
        raise PiMatrixError(
            f"{entry.key}: its agent (pid {entry.child_pid}) is not running; nothing was sent. "
            f"See 'pi-matrix show {entry.key}'"
        )
    if entry.identity.mode is not Mode.RPC and bridge_silent(EventLog(store, entry.key)):
        raise PiMatrixError(
            f"{entry.key}: its pi bridge is silent (it never reported after pi started), so nothing "
            f"reads the agent's mailbox; nothing was sent. See 'pi-matrix show {entry.key}' and pi's "
            "own output in its pane, or stop it with 'pi-matrix stop KEY --confirm yes-tmux-stop'"
        )


def cmd_send(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix send KEY (--steer T | --prompt T | --abort)``."""
    store = store_of(args)
    args.key = resolve_key(store, args.key)
    entry = _live_host(store, args.key)
    mode, provider = entry.identity.mode, entry.identity.provider
    # Anything the host cannot pass on would only be recorded, and "sent" would be a lie.
    if not reachable(mode, entry.identity.is_pi):
        how = f"{mode.value if mode else 'unknown'} mode" + (f" ({provider})" if provider else "")
        raise PiMatrixError(
            f"{args.key}: its agent runs in {how} and takes no message from its host; nothing was "
            "sent. Fire a new job for more work, or stop it with 'pi-matrix stop KEY --confirm yes-tmux-stop'"
        )
    _check_listening(store, entry)
    if args.abort:
        kind, text = "abort", ""
    elif args.steer is not None:
        kind, text = "steer", args.steer
    else:
        kind, text = "prompt", args.prompt
    encode_message(kind, text, "pi-matrix send", field=f"--{kind}")
    Inbox(store, args.key).post(kind, text, sender="pi-matrix send", to=entry.registration)
    io.out.write(f"sent {kind} to {args.key}\n")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix stop KEY|JOB --confirm yes-tmux-stop`` (a preview, exit 2, without the word)."""
    store = store_of(args)
    named = resolve(store, stop_target(args), (Kind.ENTRY, Kind.JOB), "KEY|ID")
    args.key = named.name
    if named.kind is Kind.JOB:
        from .dispatch import stop_job

        return stop_job(args, io)
    if stray_agent(current := store.get(args.key)) is not None:
        return _stop_stray(args, io, store, current)
    entry = _live_host(store, args.key)
    what = f"{args.key} (agent {entry.identity.agent_id}, host pid {entry.pid}, child pid {entry.child_pid})"
    if not confirmed(args, io, what):
        io.out.write(f"would stop {what}: request -> grace -> SIGTERM -> SIGKILL, recorded as killed\n")
        raise NotConfirmed(STOP_WORD)
    Inbox(store, args.key).post("stop", sender="pi-matrix stop", to=entry.registration)
    io.out.write(f"stop requested: {what}\n")
    return EXIT_OK


def _stop_stray(args: argparse.Namespace, io: Io, store: MatrixStore, entry: Entry) -> int:
    """``stop KEY`` for an agent whose host is gone: nobody else can stop it, so this command
    does, by the agent's recorded identity (pid and start time), and records its end."""
    what = (
        f"{args.key} (agent {entry.identity.agent_id}, pid {entry.child_pid}, unsupervised: its host "
        f"pid {entry.pid} is gone)"
    )
    if not confirmed(args, io, what):
        io.out.write(f"would stop {what}: SIGTERM -> {STRAY_GRACE_S:.0f}s -> SIGKILL, recorded as killed\n")
        raise NotConfirmed(STOP_WORD)
    written = stop_stray(store, entry, grace_s=STRAY_GRACE_S)
    recorded = f", recorded {written.status.value} (killed)" if written is not None else ""
    io.out.write(f"stopped {what}{recorded}\n")
    return EXIT_OK
