"""The ``host`` verb: one agent run as the host's only child, supervised and recorded.

Also owns what the ``master`` verb shares with it: the off switch that just becomes the agent
(:func:`become`), the provider named by an argv (:func:`provider_of`), the end-of-session
hook that stops the agent's forks (:func:`abort_forks`) and the tick that offers the agent's
session its background fork results until it has taken them (:class:`ForkResults`).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

import attrs

from .. import procs
from ..bridge import bridge_path
from ..contract import ENV_ALLOWED_PATHS, ENV_DONE_MARKER, ENV_TMUX_PANE
from ..errors import ContractError, JobNotFound, PiMatrixError
from ..identity import ID_PATTERN, AgentIdentityContract, Mode, Role, validate_id
from ..launch_contract import add_contract_arguments, contract_from_args, parse_allowed_paths
from ..matrix.tickets import LaunchTickets, Taken
from ..piversion import is_pi_program
from ..programs import agent_argv
from ..settings import load_settings
from ..supervise.host import AgentHost, HostHooks
from ..supervise.hostspec import HostSpec
from .base import add_verb, store_of
from .host_rounds import job_agent_of, rounds_for, run_unregistered, run_with_rounds

if TYPE_CHECKING:
    from ..matrix.store import MatrixStore
    from .base import Io, Verbs

__all__ = ["ForkResults", "abort_forks", "become", "cmd_host", "provider_of", "register"]

MAX_FORK_RESULT_TELLS = 10  # a session that never acknowledges (no bridge) is not told forever
FULL_LOOK_BEATS = 10  # beats between listings of the run records when nothing seemed to change


def register(sub: Verbs, epilog: str) -> None:
    """Add the ``host`` verb."""
    host = add_verb(
        sub,
        "host",
        epilog,
        usage="pi-matrix host [options] -- ARGV...",
    )
    add_contract_arguments(host)
    _identity_arguments(host)
    host.add_argument("--deadline", type=float, metavar="SECONDS", help="stop the child after this long")
    host.add_argument(
        "--stop-grace",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="grace between the stop request, SIGTERM and SIGKILL (default 3)",
    )
    host.add_argument("--rpc-prompt", metavar="TEXT", help="rpc mode: the first prompt to send")
    host.add_argument(
        "--rehost",
        metavar="KEY",
        help="take over the live agent of KEY, whose host died (started by a master; no ARGV)",
    )
    host.add_argument("--rehost-claim", metavar="GEN", help="the launcher's claim on KEY (its generation)")
    host.add_argument(
        "--job",
        metavar="ID",
        help="watch this job agent's marker rounds (set by fire; its record is waited for up to 30 s, and "
        "without it nothing starts)",
    )
    host.add_argument("--job-agent", metavar="A", help="the job's agent id (with --job)")
    host.add_argument(
        "--launch-ticket",
        metavar="TICKET",
        help="the launcher's ticket: taken before anything starts; nothing starts if the launcher gave up",
    )
    host.set_defaults(handler=cmd_host, takes_argv=True)


def _identity_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("identity")
    group.add_argument("--session-id", metavar="ID", help="the agent's session id (default: a new one)")
    group.add_argument(
        "--session-file",
        metavar="FILE",
        help="the agent's exact session file (a new one of pi gets its header first)",
    )
    group.add_argument("--cwd", metavar="DIR", help="the agent's working directory")
    group.add_argument("--worktree", metavar="DIR", help="the lane's worktree")
    group.add_argument("--resource", action="append", default=[], metavar="PATH", help="a resource pointer")
    group.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.INTERACTIVE.value,
        help="interactive (TTY passed through), print (stdin /dev/null) or rpc (JSON lines)",
    )
    group.add_argument("--profile", metavar="NAME", help="the launch profile name")
    group.add_argument("--provider", metavar="NAME", help="the agent CLI (default: ARGV[0]'s name)")
    group.add_argument("--task-summary", default="", metavar="TEXT", help="a bounded summary of the task")


def _abs(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def provider_of(argv: list[str], named: str | None = None) -> str | None:
    """The agent CLI: ``named`` (``--provider``) if given; ``pi`` when ARGV starts pi whatever its
    name (``node …/pi-coding-agent/dist/cli.js``, a link to it, a wrapper script naming it);
    else ARGV[0]'s name when it is an id. A name that looks like a pi's but is not ``pi``
    (``pi-1.6.0``) is refused: whether it gets the bridge must not be a guess."""
    if named:
        return validate_id(named, "--provider")
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name == "pi" or is_pi_program(argv):
        return "pi"
    if name.startswith(("pi-", "pi_", "pi.")) and name != "pi-matrix":
        raise ContractError(
            "--provider",
            f"missing: ARGV[0] {name!r} may be pi under another name, and only a pi started as pi "
            "gets the bridge (handoffs, the tmux_agent_manager tool, the envelope)",
            "give --provider pi to run it as pi with the bridge, or --provider <its name> to run it "
            "as another CLI",
        )
    if ID_PATTERN.fullmatch(name):
        return name
    return None


# pi's flags that set a tool ceiling (the profile's ``tools``), and that load an extension.
_CEILING_FLAGS = frozenset({"--tools", "--no-tools", "-nt", "--no-builtin-tools", "-nbt"})
_EXTENSION_FLAGS = frozenset({"-e", "--extension"})


def require_bridge(argv: list[str], provider: str | None, allowed: tuple[str, ...]) -> None:
    """Fail closed: a pi child confined by allowed paths or a tool ceiling never starts without
    the bridge, which is what enforces the envelope inside pi, whoever launched it."""
    if provider != "pi":
        return
    ceiling = any(w in _CEILING_FLAGS or w.startswith("--tools=") for w in argv)
    if not allowed and not ceiling:
        return
    bridge = bridge_path()
    real = os.path.realpath(bridge)
    loaded = any(
        word in _EXTENSION_FLAGS and i + 1 < len(argv) and os.path.realpath(argv[i + 1]) == real
        for i, word in enumerate(argv)
    )
    why = "allowed paths" if allowed else "a tool ceiling"
    if not loaded:
        raise ContractError(
            "-e <bridge>",
            f"missing: this pi worker is confined by {why} and only the pi-matrix bridge ({bridge}) "
            "enforces that inside pi",
            "launch it with 'pi-matrix fire' or 'pi-matrix resume', or add -e to the argv",
        )
    if not os.access(bridge, os.R_OK):
        raise ContractError("bridge", f"{bridge} is not readable", "reinstall pi_tmux_matrix")


def become(argv: list[str], io: Io) -> int:
    """The hard off switch: this process becomes the agent and writes nothing. Returns only when
    the agent cannot start (127, as a shell says "command not found")."""
    argv = agent_argv(argv)
    try:
        os.execvp(argv[0], argv)  # argv list, never a shell
    except OSError as exc:
        io.err.write(f"pi-matrix: error: cannot start {argv[0]!r}: {exc.strerror}\n")
    return 127


def cmd_host(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix host [flags] -- ARGV…``."""
    argv: list[str] = args.argv
    if args.rehost:
        return _rehost(args, io)
    if not argv:
        raise ContractError("ARGV", "no command given", "put the agent command after --, e.g. -- pi")
    agent_argv(argv)  # a bad $PI_MATRIX_PI_COMMAND is refused before anything is written
    settings = load_settings(args.cwd)
    # A malformed envelope is refused, and a confined pi never starts without its bridge: neither
    # ever reaches the agent, matrix on or off.
    allowed = parse_allowed_paths(os.environ.get(ENV_ALLOWED_PATHS))
    require_bridge(argv, provider_of(argv, args.provider), allowed)
    if not settings.enabled:
        pane = os.environ.get(ENV_TMUX_PANE)
        rounds = rounds_for(store_of(args), args.job, args.job_agent, key=None, role=Role.WORKER, pane=pane)
        return become(argv, io) if rounds is None else run_unregistered(argv, rounds, io)
    contract = contract_from_args(args)
    # os.urandom as uuid4 does, without importing uuid (platform, ~10 ms of a host's start).
    session_id = validate_id(args.session_id, "--session-id") if args.session_id else os.urandom(16).hex()
    identity = AgentIdentityContract(
        agent_id=contract.agent_id or f"agent-{session_id[:12]}",
        session_id=session_id,
        session_file=_abs(args.session_file),
        cwd=_abs(args.cwd) or os.getcwd(),
        worktree=_abs(args.worktree),
        lane=contract.worktree_lane,
        profile=validate_id(args.profile, "--profile") if args.profile else None,
        provider=provider_of(argv, args.provider),
        mode=Mode(args.mode),
        resource_pointers=tuple(os.path.abspath(p) for p in args.resource),
    )
    spec = HostSpec(
        argv=tuple(argv),
        identity=identity,
        contract=contract,
        mode=Mode(args.mode),
        task_summary=args.task_summary,
        deadline_s=args.deadline,
        stop_grace_s=args.stop_grace,
        rpc_prompt=args.rpc_prompt,
        # The dispatcher set a marker: a job's watcher reports this agent's rounds.
        rounds_watched=bool(os.environ.get(ENV_DONE_MARKER)),
    )
    store = store_of(args)
    if args.launch_ticket:
        # Before registering or starting anything: a launcher that gave up on this launch (a
        # stalled tmux made the pane after its timeout) took the ticket first, and then no
        # agent may run here unseen, without its tags, watcher and deadline.
        taken = LaunchTickets(store).take(args.launch_ticket, Taken(procs.current()))
        if taken is not None:
            why = (
                f"launch abandoned by its launcher ({taken.reason})"
                if taken.abandoned
                else (f"the launch ticket is held by host pid {taken.host.pid if taken.host else '?'}")
            )
            io.err.write(f"pi-matrix host: {why}; nothing started\n")
            return 1
    if identity.is_pi and identity.session_file is not None:
        # As a fire does (and a master): a new session file gets its header with this host's
        # session id before pi starts, so pi keeps that id. Else pi writes its own, and its
        # first identity report would close this entry as a session switch
        # (docs/decisions.md#a-session-file-gets-its-header-before-pi-starts).
        from ..pisession import write_header

        write_header(identity.session_file, session_id, identity.cwd or os.getcwd())
    host = AgentHost(spec, store, settings, out=io.out)
    try:
        rounds = rounds_for(
            store, args.job, args.job_agent, key=host.key, role=host.role, pane=os.environ.get(ENV_TMUX_PANE)
        )
    except JobNotFound as exc:
        # The fire writes the job beside its tmux call and returns only once it is written: a
        # job still missing now was never recorded, and no agent may run unseen by its job.
        io.err.write(f"pi-matrix host: {exc}: its fire failed before recording it; nothing started\n")
        return 1
    return run_with_rounds(host, rounds, HostHooks(on_agent_end=abort_forks, on_tick=ForkResults()))


def _rehost(args: argparse.Namespace, io: Io) -> int:
    """``host --rehost KEY --rehost-claim GEN``: the live agent of a dead host, supervised again."""
    if args.argv:
        raise ContractError("ARGV", "given with --rehost", "a rehost takes over the running agent; drop ARGV")
    if not args.rehost_claim:
        raise ContractError("--rehost-claim", "missing", "a rehost runs only over its launcher's claim")
    store = store_of(args)
    entry = store.get(args.rehost)
    agent = entry.child_process
    if entry.generation != args.rehost_claim or agent is None or not procs.is_alive(agent):
        io.err.write(f"pi-matrix host: {entry.key}: its claim is gone or its agent ended; nothing done\n")
        return 1
    identity = entry.identity
    spec = HostSpec(
        argv=(),
        identity=identity,
        contract=contract_from_args(args),
        mode=identity.mode or Mode.INTERACTIVE,
        task_summary=entry.task_summary,
        # The round's deadline is its round thread's (below), as for a fired agent.
        deadline_s=None,
        stop_grace_s=args.stop_grace,
        take_over=agent,
        claim=args.rehost_claim,
    )
    settings = load_settings(identity.cwd)
    log_file = str(store.root / "logs" / f"{entry.key}.rehost.log")

    def follow(host: AgentHost) -> None:
        # The agent stays the agent of its job: jobs, followup and stop JOB reach the new host.
        from ..recovery import follow_job

        follow_job(store, host.key, host.me, log_file=log_file)

    # Its round goes on under the new host: the agent's pane piped again, or its log followed.
    found = job_agent_of(store, entry.key)
    rounds = None
    if found is not None:
        rounds = rounds_for(store, found[0], found[1], key=None, role=Role.WORKER, pane=None)
    if rounds is not None:
        spec = attrs.evolve(spec, rounds_watched=True)
    host = AgentHost(spec, store, settings, out=io.out)
    hooks = HostHooks(on_agent_end=abort_forks, on_registered=follow, on_tick=ForkResults())
    return run_with_rounds(host, rounds, hooks)


def abort_forks(host: AgentHost) -> None:
    """The agent's session shut down: its running fork runs are stopped and failed
    (docs/decisions.md#a-fork-stops-with-its-parent-session)."""
    if not fork_records(host.store):
        return  # nothing to stop, and no fork package to import (~30 ms of CPU at every agent's end)
    from ..fork.wait import abort_runs

    entry = host.entry
    session_file = entry.identity.session_file if entry is not None else None
    try:
        stopped = abort_runs(host.store, parent_session_file=session_file, parent_key=host.key)
    except PiMatrixError as exc:
        host.events.write("fork_abort_failed", error=str(exc))
        return
    for run in stopped:
        host.events.write("fork_aborted", run=run.id, status=run.status.value)


def fork_records(store: MatrixStore) -> bool:
    """Whether the state dir holds any fork run record (``runs/<id>.json``), by its names only."""
    try:
        with os.scandir(store.root / "runs") as found:
            return any(item.name.endswith(".json") for item in found)
    except OSError:
        return False  # no runs folder: no fork ever ran here


def _no_runs(store: MatrixStore) -> bool:
    """The state dir holds no fork run record (no ``runs`` folder, or an empty one)."""
    try:
        with os.scandir(store.root / "runs") as found:
            return next(found, None) is None
    except FileNotFoundError:
        return True
    except OSError:
        return False  # unreadable: the full look says so


class ForkResults:
    """On the host's beat: background fork results the agent's session has not taken yet are told
    to it again (the finisher told it once; a pi that was restarting, or started after, reads only
    newer notices), and the runs whose result the bridge acknowledged are marked delivered. The
    bridge never injects one run's result twice. Not for an rpc agent: nothing acknowledges
    there, so the finisher's one prompt is all it gets."""

    def __init__(self) -> None:
        self.marked: set[str] = set()
        self.told: dict[str, int] = {}
        self.stamp: int | None = None  # the runs folder when nothing was pending (no new listing)
        self.pending = True
        self.beats = 0

    def __call__(self, host: AgentHost) -> None:
        accepted = host.reports.fork_results_accepted - self.marked
        if not accepted and _no_runs(host.store):
            # No fork run recorded here (most hosts): nothing to tell or mark, and the fork
            # modules stay unloaded (~4 MiB of each host: docs/decisions.md#a-host-loads-only-what-it-uses).
            return
        from ..fork.deliver import due, mark_delivered, runs_stamp, undelivered
        from ..matrix.store import now_ms
        from .runs import fork_result_payload

        try:
            if accepted:
                mark_delivered(host.store, accepted)
                self.marked |= accepted
            if host.agent.mode is Mode.RPC:
                return
            stamp = runs_stamp(host.store)
            self.beats += 1
            # Nothing pending and no run record changed since: no listing (but now and then anyway,
            # as a coarse clock may give two changes one stamp).
            if not self.pending and stamp == self.stamp and self.beats % FULL_LOOK_BEATS:
                return
            self.stamp = stamp
            entry = host.entry
            session_file = entry.identity.session_file if entry is not None else None
            pending = [
                run
                for run in undelivered(host.store, host.key, session_file)
                if run.id not in self.marked and self.told.get(run.id, 0) < MAX_FORK_RESULT_TELLS
            ]
            self.pending = bool(pending)
            now = now_ms()
            for run in pending:
                if due(run, now):
                    self.told[run.id] = self.told.get(run.id, 0) + 1
                    host.agent.tell("fork_result", fork_result_payload(host.store, run))
        except PiMatrixError as exc:
            host.events.write("fork_results_failed", error=str(exc)[:400])
