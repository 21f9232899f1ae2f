"""The ``master`` verb: its flags, its wiring, and what a person sees of a master run.

Owns the relauncher for exact orphans (the dispatcher's relaunch hook), the activation report
(text, JSON) and the printed handoff line. The session itself (the claim and takeover, the
bridged pi's argv, the host's hooks, how a handoff reaches the master) is
supervise/master_session.py's."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Final

import attrs

from .. import procs
from ..contract import ENV_TMUX, ENV_TMUX_PANE
from ..errors import EXIT_OK, PiMatrixError
from ..identity import AgentIdentityContract, Mode, Role, validate_id, validate_task_ref
from ..launch_contract import parse_env
from ..matrix.model import Entry, Handoff
from ..matrix.store import MatrixStore
from ..programs import agent_argv
from ..projecttrust import master_trust
from ..rehost import rehost
from ..settings import load_settings
from ..supervise.claim import check_claim
from ..supervise.handoff_text import handoff_line
from ..supervise.host import AgentHost
from ..supervise.hostspec import HostSpec
from ..supervise.master import TASK_STATES, ActivationReport, Decision, TtyPrompter
from ..supervise.master_session import BRIDGE_FLAG, MasterSession, MasterTerms, bridged_pi
from ..supervise.relaunch import Relauncher
from .base import add_verb, settle_and_sweep, store_of
from .host import ForkResults, abort_forks, become, provider_of

if TYPE_CHECKING:
    import pluggy

    from ..launch_contract import LaunchContract
    from .base import Io, Verbs

__all__ = ["cmd_master", "register"]


def register(sub: Verbs, epilog: str) -> None:
    """Add the ``master`` verb."""
    master = add_verb(
        sub,
        "master",
        epilog,
        usage="pi-matrix master [options] [-- ARGV...]",
    )
    master.add_argument("--session-id", metavar="ID", help="this master's session id (default: a new one)")
    master.add_argument("--task-ref", metavar="REF", help="the active goal/task (fences exact recovery)")
    master.add_argument(
        "--task-state",
        choices=TASK_STATES,
        default="active",
        help="a blocked or terminal task disables automatic recovery (default active)",
    )
    how = master.add_mutually_exclusive_group()
    how.add_argument(
        "--interactive", action="store_true", help="ask about foreign orphans (default with a TTY)"
    )
    how.add_argument(
        "--headless", action="store_true", help="only report foreign orphans; write nothing for them"
    )
    master.add_argument("--provider", metavar="NAME", help="the agent CLI (default: ARGV[0]'s name)")
    master.add_argument("--once", action="store_true", help="return after activation")
    master.add_argument(
        "--json", action="store_true", help="with --once: print the activation report as JSON"
    )
    master.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.INTERACTIVE.value,
        help="how ARGV runs (print and rpc masters are headless)",
    )
    master.add_argument(
        "--relaunch",
        choices=["detached", "tmux"],
        default="detached",
        help="how exact orphans that died are relaunched: a detached headless host (print mode), or "
        "a tmux pane on --socket through the dispatcher's relaunch hook",
    )
    master.add_argument("--socket", metavar="NAME", help="tmux -L socket for --relaunch tmux")
    master.add_argument(
        "--takeover",
        action="store_true",
        help="become the session's master although another one lives (its agent is stopped), or "
        "although its last master's agent runs on without a host (stopped too)",
    )
    master.set_defaults(handler=cmd_master, takes_argv=True)


def _relauncher(args: argparse.Namespace, store: MatrixStore) -> Relauncher:
    """The master's relauncher: the dispatcher's ``relaunch`` hook (the matrix's is ``recovery.relaunch``),
    into a tmux pane on ``--socket`` or, by default, a detached headless host (print mode).

    The plugins are loaded at the first relaunch, not at the master's start: most masters never
    relaunch, and loading them (the entry points, pluggy, the matrix plugin) was ~30 % of a
    master's start (0.20 CPU-s). A plugin that cannot load fails that relaunch, reported with
    the entry like any other failed one."""
    loaded: list[pluggy.PluginManager] = []

    def relaunch(entry: Entry, parent: procs.ProcessIdentity, parent_session: str) -> int:
        from ..dispatch.model import SUBPROCESS, TMUX, Relaunch
        from ..dispatch.plugins import plugin_manager
        from .dispatch import default_socket

        if not loaded:
            loaded.append(plugin_manager())
        request = Relaunch(
            entry=entry,
            parent=parent,
            parent_session=parent_session,
            state_dir=str(store.root),
            socket=args.socket or default_socket(),
            backend=TMUX if args.relaunch == "tmux" else SUBPROCESS,
        )
        pid: int | None = loaded[0].hook.relaunch(request=request)
        if pid is None:
            raise PiMatrixError(f"{entry.key}: no plugin relaunched it")
        return pid

    return relaunch


@attrs.frozen
class _Shown:
    """The master run as a person sees it (supervise/master_session.py's ``MasterView``): the
    reports and printed handoffs on stdout, the takeover's progress on stderr."""

    io: Io

    def activated(self, report: ActivationReport) -> None:
        out = self.io.out
        out.write(f"master {report.key} active\n")
        for key, action, reason in report.reconciled:
            out.write(f"reconcile {key}: {action} ({reason})\n")
        for d in report.orphans:
            kind = "exact" if d.exact else "foreign"
            state = "alive" if d.alive else "dead"
            detail = f": {d.detail}" if d.detail else ""
            who = f"{kind}, {state}, agent {d.agent_id}, lane {d.lane or '-'}"
            out.write(f"orphan {d.key} ({who}): {d.action}{detail}\n")
        # Delivered handoffs were already printed by the deliver callback, once each.
        out.flush()

    def reclaimed(self, decisions: list[Decision]) -> None:
        for d in decisions:
            detail = f": {d.detail}" if d.detail else ""
            who = f"exact, {'alive' if d.alive else 'dead'}, agent {d.agent_id}, lane {d.lane or '-'}"
            self.io.out.write(f"orphan {d.key} ({who}): {d.action}{detail}\n")
        if decisions:
            self.io.out.flush()

    def died(self, entries: list[Entry]) -> None:
        for entry in entries:
            self.io.out.write(
                f"worker {entry.key} (agent {entry.identity.agent_id}): its host and agent are gone; "
                f"resumable: pi-matrix resume {entry.key}\n"
            )
        if entries:
            self.io.out.flush()

    def handoff(self, entry: Entry, handoff: Handoff) -> None:
        line = handoff_line(entry, handoff)
        if self.io.out.isatty() and _on_status_line(line):
            return  # the line a person is typing in the pane stays intact; the text is in jobs/show
        # On a terminal the agent's prompt (a shell's "$ ") may hold the cursor mid-line: the
        # handoff starts a line of its own rather than continuing the prompt.
        start = "\r\n" if self.io.out.isatty() else ""
        self.io.out.write(f"{start}{line}\n")
        self.io.out.flush()

    def taking_over(self, old: Entry) -> None:
        self.io.err.write(f"pi-matrix: taking over {old.key} from pid {old.pid}...\n")
        self.io.err.flush()

    def took_over(self, done: str) -> None:
        self.io.out.write(done + "\n")


MAX_STATUS_CHARS: Final = 1000  # tmux's own notices take at most 1024 characters


def _on_status_line(line: str) -> bool:
    """A master in a tmux pane: the handoff on its clients' status line, not printed into the
    middle of what a person types at a shell there
    (docs/decisions.md#a-handoff-never-breaks-the-line-being-typed). False when not in tmux or
    tmux would not show it (then it is printed)."""
    tmux_env, pane = os.environ.get(ENV_TMUX), os.environ.get(ENV_TMUX_PANE)
    if not tmux_env or not pane:
        return False
    from ..dispatch.tmux import TmuxServer

    shown = line if len(line) <= MAX_STATUS_CHARS else line[: MAX_STATUS_CHARS - 1] + "…"
    try:
        return TmuxServer.of_client(tmux_env).notify_pane(pane, shown)
    except PiMatrixError:
        return False


def _report_json(report: ActivationReport) -> dict[str, Any]:
    from ..matrix.codec import conv

    return {
        "key": report.key,
        "sessionId": report.session_id,
        "reconciled": [{"key": k, "action": a, "reason": r} for k, a, r in report.reconciled],
        "orphans": [attrs.asdict(d) for d in report.orphans],
        "delivered": [{"key": k, "handoff": conv().unstructure(h)} for k, h in report.delivered],
    }


def _master_contract(args: argparse.Namespace) -> LaunchContract:
    """The env's contract as a master's: no parent (a master is nobody's worker), --task-ref first."""
    env_contract = parse_env()
    task_ref = args.task_ref or env_contract.task_ref
    contract = attrs.evolve(env_contract, parent_pid=None, parent_session=None, task_ref=task_ref)
    if task_ref is not None:
        validate_task_ref(task_ref, "--task-ref")
    return contract


def _master_identity(  # noqa: PLR0917 (one call site; each argument is a different thing)
    args: argparse.Namespace,
    argv: list[str],
    contract: LaunchContract,
    session_id: str,
    mode: Mode,
    previous: Entry | None,
    io: Io,
) -> tuple[list[str], AgentIdentityContract]:
    """The agent's argv (a pi gets the bridge, its session's one file and its project-trust
    decision) and the master's identity."""
    provider = provider_of(argv, args.provider)
    session_file: str | None = None
    cwd = os.getcwd()
    if provider == "pi":
        argv, session_file, cwd = bridged_pi(argv, session_id, cwd, previous)
        # pi >= 0.79's "Trust project folder?": decided (or left to pi), and said, before pi starts.
        argv, said = master_trust(argv, cwd, mode is Mode.INTERACTIVE)
        if said is not None:
            io.err.write(f"pi-matrix: project trust: {said}\n")
    identity = AgentIdentityContract(
        agent_id=contract.agent_id or f"master-{session_id[:12]}",
        session_id=session_id,
        cwd=cwd,
        provider=provider,
        mode=mode,
        session_file=session_file,
    )
    return argv, identity


def _prompter(args: argparse.Namespace, mode: Mode, bridged: bool, io: Io) -> TtyPrompter | None:
    """Who is asked about foreign orphans: the terminal, when there is one to ask."""
    interactive = args.interactive or (
        not args.headless and mode is Mode.INTERACTIVE and sys.stdin.isatty() and sys.stdout.isatty()
    )
    # A bridged pi asks the owner about foreign orphans in its own UI: not here as well.
    return TtyPrompter(sys.stdin, io.err) if interactive and not bridged else None


def cmd_master(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix master [flags] [-- ARGV…]``."""
    argv: list[str] = args.argv or []
    agent_argv(argv)  # a bad $PI_MATRIX_PI_COMMAND is refused before anything is written
    settings = load_settings()
    if not settings.enabled:
        return become(argv, io) if argv else EXIT_OK
    store = store_of(args)
    contract = _master_contract(args)
    if args.session_id:
        session_id = validate_id(args.session_id, "--session-id")
    else:
        import uuid  # here: most masters are given their session (uuid brings platform, ~3 ms)

        session_id = uuid.uuid4().hex
    mode = Mode(args.mode)
    # One master per session, one agent per session file: refused before anything is written
    # (and again under the entry's lock as the master registers).
    previous = store.find(f"{Role.MASTER.value}-{session_id}")
    check_claim(previous, takeover=args.takeover)
    argv, identity = _master_identity(args, argv, contract, session_id, mode, previous, io)
    # A print-mode pi ends after one run: a handoff cannot wake it, so it is printed instead.
    bridged = identity.provider == "pi" and mode is not Mode.PRINT and BRIDGE_FLAG in argv
    terms = MasterTerms(
        store=store,
        identity=identity,
        task_ref=contract.task_ref,
        task_state=args.task_state,
        takeover=args.takeover,
        bridged=bridged,
        relauncher=_relauncher(args, store),
        rehoster=rehost,
        prompter=_prompter(args, mode, bridged, io),
        housekeeping=settle_and_sweep,
    )
    shown = _Shown(io)
    session = MasterSession(terms, shown)
    if args.once:
        report = session.once(deliver=not args.json)
        if args.json:
            io.out.write(json.dumps(_report_json(report), indent=2) + "\n")
        else:
            shown.activated(report)
        return EXIT_OK
    spec = HostSpec(argv=tuple(argv), identity=identity, contract=contract, mode=mode, role=Role.MASTER)
    hooks = session.hooks(on_tick=ForkResults(), on_agent_end=abort_forks)
    try:
        return AgentHost(spec, store, settings, hooks=hooks, out=io.out, err=io.err).run()
    finally:
        session.close()
