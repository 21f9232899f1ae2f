"""Dispatcher verbs: fire, jobs, job, followup, dismiss, resume, profiles (and job stops)."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from .. import procs, strictjson
from ..contract import DEFAULT_SOCKET, ENV_TMUX_SOCKET
from ..dispatch import BACKEND_NAMES, TMUX
from ..dispatch.confirm import CONFIRM_S
from ..dispatch.ready import READY_S
from ..dispatch.usage import UsageTotal
from ..errors import EXIT_OK, ContractError, DispatchError, NotConfirmed, ResumeRefused
from ..matrix.codec import MAX_ENTRY_BYTES as INPUT_MAX_BYTES
from ..settings import load_settings
from .base import STOP_WORD, add_verb, age, confirmed, store_of
from .fire_report import check_wait_ready, report_fire
from .names import resolve_job, resolve_key
from .render import Column, Row, print_table, tree_indent
from .usage import job_usage_lines, spend_cell, write_usage

if TYPE_CHECKING:
    from ..dispatch.adhoc import AdHocAgent
    from ..dispatch.manager import Dispatcher
    from ..dispatch.views import ListedJob
    from .base import Io, Verbs

__all__ = ["STOP_WORD", "default_socket", "register", "stop_job"]


def default_socket() -> str:
    """``$PI_MATRIX_TMUX_SOCKET``, else ``pi-matrix`` (the dispatcher's own tmux server)."""
    return os.environ.get(ENV_TMUX_SOCKET) or DEFAULT_SOCKET


def register(sub: Verbs, epilog: str) -> None:
    fire = add_verb(
        sub,
        "fire",
        epilog,
        usage="pi-matrix fire (--profile NAME | --team NAME | --agent JSON... | --agents-file FILE) "
        "[options] -- TASK...",
    )
    who = fire.add_mutually_exclusive_group(required=True)
    who.add_argument("--profile", metavar="NAME", help="a launch profile ('pi-matrix profiles' lists them)")
    who.add_argument("--team", metavar="NAME", help="a team template: several agents on one task")
    who.add_argument(
        "--agent",
        action="append",
        metavar="JSON",
        help='an ad-hoc agent without a profile file, e.g. \'{"provider": "claude", "name": "rev"}\' '
        "(repeat for more; keys: provider, name, command, path, tools, resourceProfile, thinkingLevel, "
        "worktreeLane)",
    )
    who.add_argument("--agents-file", metavar="FILE", help="ad-hoc agents: a JSON list of --agent objects")
    fire.add_argument("--lane", metavar="L", help="run in the git worktree of lane L (created or reused)")
    fire.add_argument("--goal-id", metavar="G", help="goal-bound launch: PI_TASK_REF is G")
    fire.add_argument("--path", metavar="DIR", help="the agents' working directory (default: here)")
    fire.add_argument(
        "--socket", metavar="NAME", help=f"tmux -L socket (default: ${ENV_TMUX_SOCKET} or {DEFAULT_SOCKET})"
    )
    fire.add_argument("--backend", choices=BACKEND_NAMES, default=TMUX, help="tmux panes, or detached")
    fire.add_argument("--deadline", type=float, metavar="SECONDS", help="per agent (default: the profile's)")
    fire.add_argument("--agent-id", metavar="ID", help="the logical agent id (team members add a suffix)")
    fire.add_argument(
        "--parent-pid", type=int, metavar="PID", help="the firing master (default: the caller's)"
    )
    fire.add_argument("--parent-session", metavar="ID", help="the firing master's session id")
    fire.add_argument("--dry-run", action="store_true", help="show what would run; start nothing")
    fire.add_argument(
        "--launch-key", metavar="KEY", help="a stable job id of your own (4-80 of A-Z a-z 0-9 _ . : -)"
    )
    fire.add_argument(
        "--force", action="store_true", help="with --launch-key: archive an earlier job of that key first"
    )
    fire.add_argument("--workspace", metavar="NAME", help="a fresh tmux session for the agents' windows")
    fire.add_argument(
        "--json", action="store_true", help="print the job id and each agent's key, target, pid"
    )
    fire.add_argument(
        "--confirm-start",
        type=float,
        nargs="?",
        const=CONFIRM_S,
        metavar="SECONDS",
        help=f"wait until each agent's host has started it, at most SECONDS (default {CONFIRM_S:g}); "
        "exit 1 naming any agent that could not start (without it, fire returns once the panes are "
        "made, and 'pi-matrix jobs' and 'show' report a failed start)",
    )
    fire.add_argument(
        "--wait-ready",
        type=float,
        nargs="?",
        const=READY_S,
        metavar="SECONDS",
        help=f"then wait until each agent is ready (pi: its bridge reported in; others: running), "
        f"at most SECONDS (default {READY_S:g}); exit 1 naming any agent that is not",
    )
    fire.set_defaults(handler=cmd_fire, takes_argv=True)

    jobs = add_verb(sub, "jobs", epilog)
    jobs.add_argument("--all", action="store_true", help="include dismissed jobs")
    jobs.add_argument(
        "--socket",
        metavar="NAME",
        help="also list panes tagged by a dispatcher on this socket with no job record",
    )
    shape = jobs.add_mutually_exclusive_group()  # one output shape: both is a usage error (exit 2)
    shape.add_argument("--json", action="store_true")
    shape.add_argument("--ndjson", action="store_true", help="one job per line")
    jobs.add_argument(
        "--usage",
        action="store_true",
        help="the usage workers claimed (advisory): a total per job and per master session",
    )
    jobs.set_defaults(handler=cmd_jobs)

    job = add_verb(sub, "job", epilog)
    job.add_argument("job_id", metavar="ID")
    job.add_argument("--json", action="store_true")
    job.set_defaults(handler=cmd_job)

    followup = add_verb(
        sub,
        "followup",
        epilog,
        usage="pi-matrix followup ID [--agent A] -- TEXT...",
    )
    followup.add_argument("job_id", metavar="ID")
    followup.add_argument("--agent", metavar="A", help="only this agent of the job")
    followup.add_argument("--json", action="store_true")
    followup.set_defaults(handler=cmd_followup, takes_argv=True)

    dismiss = add_verb(sub, "dismiss", epilog)
    dismiss.add_argument("job_id", metavar="ID")
    dismiss.add_argument("--json", action="store_true")
    dismiss.set_defaults(handler=cmd_dismiss)

    resume = add_verb(sub, "resume", epilog)
    resume.add_argument("key", metavar="KEY")
    resume.add_argument("--dry-run", action="store_true", help="print argv, env and cwd; start nothing")
    resume.add_argument("--json", action="store_true")
    resume.add_argument(
        "--socket", metavar="NAME", help=f"tmux -L socket (default: ${ENV_TMUX_SOCKET} or {DEFAULT_SOCKET})"
    )
    resume.add_argument(
        "--backend", choices=BACKEND_NAMES, help="where its new host runs (default: where its job ran; tmux)"
    )
    resume.add_argument(
        "--parent-pid", type=int, metavar="PID", help="the resuming master (default: the caller's)"
    )
    resume.add_argument("--parent-session", metavar="ID")
    resume.set_defaults(handler=cmd_resume)

    profiles = add_verb(sub, "profiles", epilog)
    profiles.add_argument("--json", action="store_true")
    profiles.set_defaults(handler=cmd_profiles)


def dispatcher_of(args: argparse.Namespace, cwd: str | None = None) -> Dispatcher:
    from ..dispatch.manager import Dispatcher
    from ..dispatch.plugins import plugin_manager

    settings = load_settings(cwd)
    # The program builds the plugin manager and hands it in (the dispatcher never picks its own).
    return Dispatcher(store_of(args), settings, plugins=plugin_manager(matrix=settings.enabled))


def dump_json(io: Io, value: object) -> None:
    io.out.write(json.dumps(value, indent=2) + "\n")


def cmd_fire(args: argparse.Namespace, io: Io) -> int:
    from ..dispatch.request import FireRequest

    task = " ".join(args.argv)
    if not args.argv:
        raise ContractError(
            "TASK",
            "missing",
            "give the task after --, e.g. pi-matrix fire --profile pi-worker -- fix the bug",
        )
    request = FireRequest(
        task=task,
        profile=args.profile,
        team=args.team,
        agents=_adhoc_agents(args),
        lane=args.lane,
        goal_id=args.goal_id,
        path=args.path,
        socket=args.socket or default_socket(),
        deadline_s=args.deadline,
        backend=args.backend,
        dry_run=args.dry_run,
        parent_pid=args.parent_pid,
        parent_session=args.parent_session,
        agent_id=args.agent_id,
        launch_key=args.launch_key,
        force=args.force,
        workspace=args.workspace,
        confirm_s=_confirm_s(args),
    )
    if args.force and args.launch_key is None:
        raise ContractError("--force", "given without --launch-key", "force replaces a job named by its key")
    dispatcher = dispatcher_of(args, args.path)
    check_wait_ready(args.wait_ready, enabled=dispatcher.settings.enabled)
    result = dispatcher.fire(request)
    return report_fire(io, args, dispatcher.store, result)


def _confirm_s(args: argparse.Namespace) -> float:
    """How long this fire waits for its hosts' starts: not at all unless asked (a series of fires
    waits on no start in turn); ``--wait-ready`` waits for more than the start anyway."""
    if args.confirm_start is not None:
        if not args.confirm_start > 0:
            raise ContractError(
                "--confirm-start", f"{args.confirm_start:g} seconds", "give a positive number of seconds"
            )
        return float(args.confirm_start)
    return CONFIRM_S if args.wait_ready is not None else 0.0


def _adhoc_agents(args: argparse.Namespace) -> tuple[AdHocAgent, ...]:
    """``--agent JSON`` (each one object) or ``--agents-file FILE`` (one JSON list), checked."""
    from ..dispatch.adhoc import parse_agents

    if args.agents_file is not None:
        try:
            # A pipe stays welcome (--agents-file <(...)); one byte past the cap is read so that
            # a larger file is refused as such, never parsed cut short.
            with open(args.agents_file, "rb") as file:
                text = file.read(INPUT_MAX_BYTES + 1)
        except OSError as exc:
            raise ContractError(
                "--agents-file", f"cannot be read ({exc.strerror})", "give a JSON file"
            ) from None
        return parse_agents(_json(text, "--agents-file"))
    if not args.agent:
        return ()
    return parse_agents([_json(text, f"--agent #{n}") for n, text in enumerate(args.agent, start=1)])


def _json(text: str | bytes, field: str) -> object:
    """``text`` parsed with the bounds entries are read with (:mod:`~pi_tmux_matrix.strictjson`:
    at most 1 MiB, nested at most 32 deep, no duplicate keys, no NaN); a usage error naming
    ``field`` otherwise (exit 2, one line, never a traceback)."""
    try:
        return strictjson.loads(text, max_bytes=INPUT_MAX_BYTES)
    except strictjson.StrictJSONError as exc:
        fix = "quote the JSON as one argument (at most 1 MiB, nested at most 32 deep)"
        raise ContractError(field, f"is not JSON ({exc})", fix) from None


# At 80 columns: the job (its agents' names under it), the state and the tmux target stay
# (docs/decisions.md#a-table-keeps-what-a-person-acts-on).
JOB_COLUMNS = (
    Column("JOB", 100),
    Column("STATE", 90, shrink=12),
    Column("KEY", 80, key=True),
    Column("HOST", 60),
    Column("TMUX", 50, shrink=8),
    Column("TARGET", 95, shrink=12),
    Column("TEAM", 45, shrink=8),
    Column("TASK", 55, shrink=10),
    Column("SPEND", 42, right=True),
    Column("AGE", 70, right=True),
)


def _job_rows(io: Io, view: ListedJob) -> list[Row]:
    """A job's row and one row per agent under it (a corrupt record is a warning instead)."""
    if view.state == "corrupt":
        io.err.write(f"pi-matrix: warning: {view.path}: {view.problem} (job record unreadable)\n")
        return []
    if view.state == "untracked":
        pane = view.pane
        host = f"pid {pane.host_pid} {'alive' if pane.host_alive else 'gone'}"
        socket = f"({pane.socket})"
        untracked = (view.job_id, "untracked (tmux tags only)", pane.key or "", host, socket, pane.target)
        return [Row((*untracked, "", "", "", ""))]
    job = view.job
    rows = [
        Row(
            (
                job.id,
                view.state,
                "",
                "",
                "",
                "",
                job.team or job.profile or "ad-hoc",
                job.task_ref or "-",
                spend_cell(UsageTotal.of([r.usage for r in a.results] for a in view.agents)),
                age(job.created_at),
            ),
            ("bold",),
        )
    ]
    for i, shown in enumerate(view.agents):
        agent, result = shown.agent, shown.result
        outcome = "working" if result is None else result.kind.value
        if result is None and shown.unsupervised is not None:
            outcome = f"working ({shown.unsupervised})"  # its agent runs on; its end is not seen yet
        elif result is None and shown.readiness is not None:
            # A pi agent's process runs a second before pi has loaded: its bridge says when.
            outcome = "starting (pi loading)" if shown.readiness == "loading" else "working (ready)"
        if result is not None and result.detail:
            outcome += f" ({result.detail})"
        cells = (
            agent.agent_id,
            f"round {agent.round}: {outcome}",
            agent.key,
            "alive" if shown.host_alive else "gone",
            _tmux_cell(shown.tmux, agent.tmux_socket),
            agent.target or "-",
            "",
            "",
            spend_cell(UsageTotal.of([[r.usage for r in shown.results]])),
            "",
        )
        styles = ("", "", "", "green" if shown.host_alive else "red")
        rows.append(Row(cells, styles, tree_indent(i == len(view.agents) - 1)))
    return rows


def _tmux_cell(state: str, socket: str | None) -> str:
    """Whether tmux has the pane, and on which server (the target alone could be on any)."""
    return state if socket is None else f"{state} ({socket})"


def _all_keys(args: argparse.Namespace, rows: list[Row]) -> list[str]:
    """Every key a shortened one must tell apart: the matrix's and the jobs' (``show`` takes both)."""
    at = next(i for i, column in enumerate(JOB_COLUMNS) if column.key)
    shown = {row.cells[at] for row in rows if row.cells[at]}
    return sorted(shown | {e.key for e in store_of(args).list().entries})


def cmd_jobs(args: argparse.Namespace, io: Io) -> int:
    views = dispatcher_of(args).reconcile(sockets={args.socket or default_socket()})
    if not args.all:
        views = [v for v in views if v.state != "dismissed"]
    if args.usage:
        if args.ndjson:
            raise ContractError("--ndjson", "not a shape of --usage", "use --usage, or --usage --json")
        write_usage(io, views, as_json=args.json)
        return EXIT_OK
    if args.json:
        dump_json(io, [view.to_json() for view in views])
        return EXIT_OK
    if args.ndjson:
        io.out.write("".join(json.dumps(view.to_json()) + "\n" for view in views))
        return EXIT_OK
    rows = [row for view in views for row in _job_rows(io, view)]
    if rows:
        print_table(io, JOB_COLUMNS, rows, keys=_all_keys(args, rows))
    elif not views:
        io.out.write("no jobs\n")
    return EXIT_OK


def cmd_job(args: argparse.Namespace, io: Io) -> int:
    dispatcher = dispatcher_of(args)
    job = dispatcher.jobs.get(resolve_job(dispatcher.store, args.job_id))
    view = dispatcher.settled_view(job, tmux_state=dispatcher.tmux_states(job))
    if args.json:
        dump_json(io, view.to_json())
    else:
        rows = _job_rows(io, view)
        if rows:
            print_table(io, JOB_COLUMNS, rows, keys=_all_keys(args, rows))
        for shown in view.agents:  # where each one is, as a command to paste
            if shown.agent.tmux_socket is not None and shown.agent.target is not None:
                agent = shown.agent
                io.out.write(f"attach {agent.agent_id}: {agent.where} (or: pi-matrix attach {agent.key})\n")
        io.out.write("".join(f"usage of {line}\n" for line in job_usage_lines(io, view)))
    return EXIT_OK


def cmd_followup(args: argparse.Namespace, io: Io) -> int:
    if not args.argv:
        raise ContractError("TEXT", "missing", "give the follow-up after --")
    dispatcher = dispatcher_of(args)
    job = dispatcher.followup(resolve_job(dispatcher.store, args.job_id), " ".join(args.argv), args.agent)
    if args.json:
        dump_json(io, dispatcher.view(job).to_json())
    else:
        rearmed = [a.agent_id for a in job.agents if args.agent in (None, a.agent_id)]
        io.out.write(f"follow-up sent to {', '.join(rearmed)} of {job.id}\n")
    return EXIT_OK


def cmd_dismiss(args: argparse.Namespace, io: Io) -> int:
    dispatcher = dispatcher_of(args)
    job = dispatcher.dismiss(resolve_job(dispatcher.store, args.job_id))
    if args.json:
        dump_json(io, dispatcher.view(job).to_json())
    else:
        io.out.write(f"dismissed {job.id}\n")
    return EXIT_OK


def stop_job(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix stop JOB --confirm yes-tmux-stop`` (a preview without the word)."""
    dispatcher = dispatcher_of(args)
    job = dispatcher.jobs.get(resolve_job(dispatcher.store, args.key))
    view = dispatcher.view(job, tmux_state=dispatcher.tmux_states(job))
    if not confirmed(args, io, f"job {job.id}"):
        io.out.write(
            f"would stop job {job.id}: for each agent its host's stop sequence, then its own pane:\n"
        )
        for shown in view.agents:
            alive = "alive" if shown.host_alive else "gone"
            io.out.write(
                f"  {shown.agent.agent_id}  host pid {shown.agent.host_pid} ({alive})  "
                f"pane {shown.agent.pane_id or '-'} ({shown.tmux})\n"
            )
        raise NotConfirmed(STOP_WORD)
    job, written = dispatcher.stop(job.id)
    if getattr(args, "json", False):
        dump_json(io, dispatcher.view(job).to_json())
    else:
        io.out.write(f"stopped job {job.id} ({len(written)} agent(s) had not finished)\n")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace, io: Io) -> int:
    from ..dispatch.model import Relaunch
    from ..matrix.owners import owning_master, require_master
    from ..recovery import plan_resume

    store = store_of(args)
    args.key = resolve_key(store, args.key)
    entry = store.get(args.key)
    parent, session = require_master(
        owning_master(store, args.parent_pid, args.parent_session, registered=not args.dry_run), "resume"
    )
    if procs.is_alive(entry.process):
        raise ResumeRefused(f"{args.key}'s host (pid {entry.pid}) is alive; adopt it instead")
    if args.dry_run:
        plan = plan_resume(store, entry, parent, session)
        if args.json:
            dump_json(io, plan.to_json())
        else:
            io.out.write(f"would resume {args.key} in {plan.cwd}:\n  argv {json.dumps(list(plan.argv))}\n")
        return EXIT_OK
    if procs.is_alive(entry.child_process):
        raise ResumeRefused(
            f"{args.key}'s agent (pid {entry.child_pid}) still runs without its host; "
            f"stop it first ('pi-matrix stop {args.key}')"
        )
    request = Relaunch(
        entry=entry,
        parent=parent,
        parent_session=session,
        state_dir=str(store.root),
        socket=args.socket or default_socket(),
        backend=args.backend,
    )
    from ..dispatch.plugins import plugin_manager

    # Through the hook, like a master's recovery: a plugin's relauncher is honoured in both paths.
    pid = plugin_manager(matrix=load_settings().enabled).hook.relaunch(request=request)
    if pid is None:
        raise DispatchError(f"no plugin relaunched {args.key} (is the matrix plugin disabled?)")
    if args.json:
        dump_json(io, {"key": args.key, "hostPid": pid})
    else:
        io.out.write(f"resumed {args.key}: new host pid {pid}\n")
    return EXIT_OK


def cmd_profiles(args: argparse.Namespace, io: Io) -> int:
    from ..dispatch.profile import load_profiles
    from ..settings import agent_dir

    found = load_profiles(agent_dir())
    rows = [
        {
            "name": name,
            "provider": found.profile(name).provider,
            "mode": found.profile(name).mode.value,
            "source": found.profile(name).source,
            "description": found.profile(name).description,
            "confined": found.profile(name).confinement,
        }
        for name in found.names()
    ]
    teams = [
        {
            "name": name,
            "members": [m.profile for m in found.team(name).members],
            "source": found.team(name).source,
        }
        for name in found.team_names()
    ]
    if args.json:
        dump_json(io, {"profiles": rows, "teams": teams})
        return EXIT_OK
    for row in rows:
        name, provider, mode, confined = row["name"], row["provider"], row["mode"], row["confined"]
        io.out.write(f"{name:<16} {provider:<9} {mode:<12} {confined:<36} {row['description']}\n")
    for team in teams:
        io.out.write(f"team {team['name']:<11} {' + '.join(team['members'])}\n")
    return EXIT_OK
