"""The job verbs a person uses beside ``fire``, the origin's tool's actions as verbs
(docs/decisions.md#the-tool-keeps-the-origins-words): a job's variables (``var``), the team
templates (``templates``), a template's agents as the panes of a fresh tmux session
(``workspace``) and a whole tmux session's stop (``stop-session``)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ..contract import DEFAULT_SOCKET, ENV_TMUX_SOCKET
from ..errors import EXIT_FAILED, EXIT_OK, ContractError, NoSuch, NotConfirmed, PiMatrixError
from ..identity import validate_id
from ..safetext import printable
from .base import STOP_WORD, add_verb, confirmed
from .dispatch import default_socket, dispatcher_of, dump_json
from .names import resolve_job

if TYPE_CHECKING:
    from ..dispatch.tmux import TmuxServer
    from .base import Io, Verbs

__all__ = ["register"]

SOCKET_HELP = f"tmux -L socket (default: ${ENV_TMUX_SOCKET} or {DEFAULT_SOCKET})"


def register(sub: Verbs, epilog: str) -> None:
    """Add ``var``, ``templates``, ``workspace``, ``stop-session``, ``notify`` and ``set-status``."""
    _register_workspace(sub, epilog)
    var = add_verb(
        sub,
        "var",
        epilog,
        usage="pi-matrix var ID [NAME [VALUE]] [--json]",
    )
    var.add_argument("job_id", metavar="ID")
    var.add_argument("name", nargs="?", metavar="NAME", help="1-80 letters, digits, _ . -")
    var.add_argument("value", nargs="?", metavar="VALUE", help="set NAME to this (at most 16 KiB)")
    var.add_argument("--json", action="store_true")
    var.set_defaults(handler=cmd_var)

    stop_session = add_verb(
        sub,
        "stop-session",
        epilog,
        usage=f"pi-matrix stop-session NAME [--socket S] [--confirm {STOP_WORD}]",
    )
    stop_session.add_argument("name", metavar="NAME", help="the tmux session (a fire's --workspace)")
    stop_session.add_argument("--socket", metavar="S", help=SOCKET_HELP)
    stop_session.add_argument(
        "--confirm", nargs="?", const=True, metavar="WORD", help=f"{STOP_WORD} to really stop"
    )
    stop_session.add_argument("--json", action="store_true")
    stop_session.set_defaults(handler=cmd_stop_session)

    notify = add_verb(
        sub,
        "notify",
        epilog,
        usage="pi-matrix notify SESSION [--socket S] -- TEXT...",
    )
    notify.add_argument("session", metavar="SESSION")
    notify.add_argument("--socket", metavar="S", help=SOCKET_HELP)
    notify.set_defaults(handler=cmd_notify, takes_argv=True)

    status = add_verb(
        sub,
        "set-status",
        epilog,
        usage="pi-matrix set-status SESSION KEY [VALUE] [--socket S]",
    )
    status.add_argument("session", metavar="SESSION")
    status.add_argument("key", metavar="KEY", help="1-64 of A-Z a-z 0-9 _ - (the option is @pi_KEY)")
    status.add_argument("value", nargs="?", metavar="VALUE", help="one printable line; none clears it")
    status.add_argument("--socket", metavar="S", help=SOCKET_HELP)
    status.set_defaults(handler=cmd_set_status)

    templates = add_verb(sub, "templates", epilog)
    templates.add_argument("name", nargs="?", metavar="NAME", help="the template to show")
    templates.add_argument("--json", action="store_true")
    templates.set_defaults(handler=cmd_templates)


def cmd_var(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix var ID [NAME [VALUE]]``: list, read or set a job's variables."""
    from ..dispatch.variables import Variables, check_name

    dispatcher = dispatcher_of(args)
    if args.value is not None and not dispatcher.settings.enabled:
        raise ContractError("VALUE", "processMatrix.enabled is false: nothing may be written", "enable it")
    job = dispatcher.jobs.get(resolve_job(dispatcher.store, args.job_id))
    variables = Variables(dispatcher.store)
    if args.value is not None:
        values = variables.set(job.id, args.name, args.value)
    else:
        values = variables.of(job.id)
        if args.name is not None:
            check_name(args.name)
            if args.name not in values:
                raise NoSuch(f"job {job.id} has no variable {args.name!r}")
            values = {args.name: values[args.name]}
    if args.json:
        dump_json(io, {"jobId": job.id, "file": str(variables.path(job.id)), "values": values})
        return EXIT_OK
    for name, value in sorted(values.items()):
        io.out.write(f"{name}={printable(value)}\n")
    return EXIT_OK


def cmd_templates(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix templates [NAME] [--json]``: the team templates in force (shipped, or the agent
    dir's own of the same name), or one with each member's profile, suffix and instructions."""
    from ..dispatch.profile import load_profiles
    from ..settings import agent_dir

    found = load_profiles(agent_dir())
    names = [args.name] if args.name else found.team_names()
    shown: list[dict[str, Any]] = []
    for name in names:
        team = found.team(validate_id(name, "NAME"))
        members = [
            {"profile": m.profile, "suffix": m.suffix, "instructions": m.instructions} for m in team.members
        ]
        shown.append(
            {"name": team.name, "description": team.description, "source": team.source, "members": members}
        )
    if args.json:
        dump_json(io, shown[0] if args.name else shown)
        return EXIT_OK
    for row in shown:
        who = " + ".join(m["profile"] for m in row["members"])
        io.out.write(f"{row['name']:<22} {who}  {row['description']}\n")
        if args.name:
            io.out.write(f"  source {row['source']}\n")
            for m in row["members"]:
                io.out.write(f"  {m['suffix']:<10} {m['profile']:<12} {printable(m['instructions'])}\n")
    return EXIT_OK


def cmd_stop_session(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix stop-session NAME --confirm yes-tmux-stop``: every unfinished job with an agent in
    tmux session NAME is stopped the way ``stop JOB`` stops one (through its hosts first)."""
    from ..dispatch.tmux_model import check_session

    name = check_session(args.name, "NAME")
    socket = args.socket or default_socket()
    dispatcher = dispatcher_of(args)
    jobs, _problems = dispatcher.jobs.list_jobs()
    held = [
        job
        for job in jobs
        if job.stopped_at is None
        and job.dismissed_at is None
        and any(a.socket == socket and (a.target or "").startswith(f"{name}:") for a in job.agents)
    ]
    if not held:
        raise NoSuch(f"no job has agents in tmux session {name!r} on socket {socket!r}")
    if not confirmed(args, io, f"tmux session {name} ({len(held)} job(s))"):
        io.out.write(
            f"would stop {len(held)} job(s) in tmux session {name}: " + ", ".join(j.id for j in held) + "\n"
        )
        raise NotConfirmed(STOP_WORD)
    stopped, failed = [], []
    for job in held:
        try:
            dispatcher.stop(job.id)
            stopped.append(job.id)
        except PiMatrixError as exc:
            failed.append(f"{job.id}: {exc}")
    if args.json:
        dump_json(io, {"session": name, "socket": socket, "stopped": stopped, "failed": failed})
    else:
        io.out.write(f"stopped {len(stopped)} job(s) in tmux session {name}: {', '.join(stopped) or '-'}\n")
    for line in failed:
        io.err.write(f"pi-matrix: error: {line}\n")
    return EXIT_FAILED if failed else EXIT_OK


def _server(args: argparse.Namespace) -> TmuxServer:
    from ..dispatch.tmux import TmuxServer

    return TmuxServer(validate_id(args.socket or default_socket(), "--socket"))


def cmd_notify(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix notify SESSION -- TEXT``: the origin's ``notify``."""
    text = " ".join(args.argv)
    _server(args).notify(args.session, text)
    io.out.write(f"notified session {args.session}\n")
    return EXIT_OK


def cmd_set_status(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix set-status SESSION KEY [VALUE]``: the origin's ``set_status`` / ``clear_status``."""
    _server(args).set_status(args.session, args.key, args.value)
    io.out.write(
        f"{'set' if args.value is not None else 'cleared'} @pi_{args.key} on session {args.session}\n"
    )
    return EXIT_OK


def _register_workspace(sub: Verbs, epilog: str) -> None:
    ws = add_verb(
        sub,
        "workspace",
        epilog,
        usage="pi-matrix workspace TEMPLATE --name SESSION [--path DIR] [--lane L] [--goal-id G] "
        "[--socket S] "
        "[--launch-key K [--force]] [--dry-run] [--json] [-- TASK...]",
    )
    ws.add_argument("template", metavar="TEMPLATE", help="a team template ('pi-matrix templates' lists them)")
    ws.add_argument("--name", metavar="SESSION", help="the tmux session to open (it must not exist yet)")
    ws.add_argument("--path", metavar="DIR", help="the agents' working directory (default: here)")
    ws.add_argument("--lane", metavar="L", help="run in the git worktree of lane L (created or reused)")
    ws.add_argument("--goal-id", metavar="G", help="goal-bound launch: PI_TASK_REF is G")
    ws.add_argument("--socket", metavar="S", help=SOCKET_HELP)
    ws.add_argument(
        "--launch-key", metavar="KEY", help="a stable job id of your own (4-80 of A-Z a-z 0-9 _ . : -)"
    )
    ws.add_argument(
        "--force", action="store_true", help="with --launch-key: archive an earlier job of that key"
    )
    ws.add_argument(
        "--parent-pid", type=int, metavar="PID", help="the launching master (default: the caller's)"
    )
    ws.add_argument("--parent-session", metavar="ID", help="the launching master's session id")
    ws.add_argument(
        "--dry-run", action="store_true", help="show the panes, argv and cwd; start and write nothing"
    )
    ws.add_argument("--json", action="store_true")
    ws.set_defaults(handler=cmd_workspace, takes_argv=True)


def cmd_workspace(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix workspace TEMPLATE --name SESSION [-- TASK]``: the origin's ``launch_workspace``
    (``--dry-run``: its ``workspace_plan``). One job records the agents, so ``stop-session`` stops
    them through their hosts; nothing watches them and no deadline runs."""
    from ..dispatch.request import FireRequest

    if args.force and args.launch_key is None:
        raise ContractError("--force", "given without --launch-key", "force replaces a job named by its key")
    socket = args.socket or default_socket()
    request = FireRequest(
        task=" ".join(args.argv),
        team=validate_id(args.template, "TEMPLATE"),
        workspace=args.name,
        watched=False,
        lane=args.lane,
        goal_id=args.goal_id,
        path=args.path,
        socket=socket,
        dry_run=args.dry_run,
        parent_pid=args.parent_pid,
        parent_session=args.parent_session,
        launch_key=args.launch_key,
        force=args.force,
    )
    result = dispatcher_of(args, args.path).fire(request)
    attach = f"tmux -L {socket} attach -t {args.name}"
    if args.json:
        dump_json(io, {**result.to_json(), "socket": socket, "attach": attach})
        return EXIT_OK
    verb = "would open" if result.dry_run else "opened"
    job = result.job
    io.out.write(
        f"workspace {args.name} (job {job.id}): {verb} {len(job.agents)} pane(s), interactive, unwatched\n"
    )
    for planned, agent in zip(result.planned, job.agents, strict=True):
        io.out.write(f"  {agent.agent_id}  {agent.key}  {agent.profile}  lane {agent.lane or '-'}\n")
        if result.dry_run:
            io.out.write(f"    cwd  {planned.cwd}\n    argv {json.dumps(list(planned.argv))}\n")
    io.out.write(f"{'attach with' if not result.dry_run else 'then attach with'}: {attach}\n")
    return EXIT_OK
