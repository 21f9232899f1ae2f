"""The ``master`` verb: a master session's activation, its agent, and its workers' handoffs.

Owns the relauncher for exact orphans, the activation report (text, JSON), the bridged pi argv,
and how a worker's handoff reaches the master (posted to a bridged pi, printed otherwise)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

import attrs

from .. import procs
from ..contract import parse_env
from ..errors import EXIT_OK, Conflict, ContractError, PiMatrixError
from ..identity import AgentIdentityContract, Mode, Role, validate_id, validate_task_ref
from ..matrix import lifecycle
from ..matrix.model import Entry, Handoff, Status
from ..matrix.store import MatrixStore, now_ms
from ..piversion import program_length
from ..programs import agent_argv
from ..projecttrust import master_trust
from ..rehost import rehost
from ..settings import load_settings
from ..supervise.claim import check_claim, live_master, stray_agent, take_over
from ..supervise.feed import EntryFeed
from ..supervise.host import AgentHost, HostHooks, HostSpec
from ..supervise.master import TASK_STATES, ActivationReport, Decision, Master, TtyPrompter, one_shot
from ..supervise.relaunch import Relauncher
from .base import add_verb, settle_and_sweep, store_of
from .handoffs import handoff_message, print_handoff
from .host import ForkResults, abort_forks, become, provider_of

if TYPE_CHECKING:
    from ..contract import LaunchContract
    from .base import Io

__all__ = ["HANDOFF_REPOST_S", "cmd_master", "handoff_message", "register"]

HANDOFF_REPOST_S: Final = 15.0  # a handoff notice pi has not taken by then is posted again
# Threads that mark pi's taken handoffs delivered: their durable writes overlap (one journal commit
# serves several fsyncs), none holding back the next (docs/decisions.md#handoffs-are-pushed-not-polled).
ACK_THREADS: Final = 4
# --takeover: how long the old host gets to stop its agent (its own stop sequence: the request,
# then SIGTERM and SIGKILL a stop grace apart), and the grace of the stop by identity after that.
TAKEOVER_WAIT_S: Final = 10.0
TAKEOVER_GRACE_S: Final = 3.0
_BRIDGE_FLAG: Final = "-e"  # as the dispatcher loads it: the host then expects the bridge to report
_SESSION_FLAGS: Final = frozenset(
    {"--session", "--continue", "-c", "--resume", "-r", "--no-session", "--fork"}
)


def register(sub: Any, epilog: str) -> None:
    """Add the ``master`` verb."""
    master = add_verb(
        sub,
        "master",
        epilog,
        help="master activation: register, reconcile, scan for orphans, recover or ask, heartbeat",
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
    into a tmux pane on ``--socket`` or, by default, a detached headless host (print mode)."""
    from ..dispatch.model import SUBPROCESS, TMUX, Relaunch
    from ..dispatch.plugins import plugin_manager
    from .dispatch import default_socket

    backend = TMUX if args.relaunch == "tmux" else SUBPROCESS
    socket = args.socket or default_socket()
    plugins = plugin_manager()

    def relaunch(entry: Entry, parent: procs.ProcessIdentity, parent_session: str) -> int:
        request = Relaunch(
            entry=entry, parent=parent, parent_session=parent_session, state_dir=str(store.root),
            socket=socket, backend=backend,
        )  # fmt: skip
        pid: int | None = plugins.hook.relaunch(request=request)
        if pid is None:
            raise PiMatrixError(f"{entry.key}: no plugin relaunched it")
        return pid

    return relaunch


def _print_report(report: ActivationReport, io: Io) -> None:
    io.out.write(f"master {report.key} active\n")
    for key, action, reason in report.reconciled:
        io.out.write(f"reconcile {key}: {action} ({reason})\n")
    for d in report.orphans:
        kind = "exact" if d.exact else "foreign"
        state = "alive" if d.alive else "dead"
        detail = f": {d.detail}" if d.detail else ""
        who = f"{kind}, {state}, agent {d.agent_id}, lane {d.lane or '-'}"
        io.out.write(f"orphan {d.key} ({who}): {d.action}{detail}\n")
    # Delivered handoffs were already printed by the deliver callback, once each.
    io.out.flush()


def _print_reclaimed(decisions: list[Decision], io: Io) -> None:
    """What a master that came back took back (its workers had counted it hung or lost)."""
    for d in decisions:
        detail = f": {d.detail}" if d.detail else ""
        who = f"exact, {'alive' if d.alive else 'dead'}, agent {d.agent_id}, lane {d.lane or '-'}"
        io.out.write(f"orphan {d.key} ({who}): {d.action}{detail}\n")
    if decisions:
        io.out.flush()


def _report_json(report: ActivationReport) -> dict[str, Any]:
    from ..matrix.codec import conv

    return {
        "key": report.key,
        "sessionId": report.session_id,
        "reconciled": [{"key": k, "action": a, "reason": r} for k, a, r in report.reconciled],
        "orphans": [attrs.asdict(d) for d in report.orphans],
        "delivered": [{"key": k, "handoff": conv().unstructure(h)} for k, h in report.delivered],
    }


def _session_of(session_id: str, cwd: str, previous: Entry | None) -> tuple[str, str]:
    """The pi session file of ``session_id`` and the cwd it runs in: the one file already holding
    that session (recorded by its last master, else found by its name) is continued, never a
    second file with the same header id; a new one goes where pi keeps ``cwd``'s sessions."""
    from ..pisession import new_session_file, read_header, session_file_of

    recorded = []
    if previous is not None:
        recorded.append(previous.identity.session_file)
        if previous.resumable is not None:
            recorded.append(previous.resumable.identity.session_file)
    found = session_file_of(session_id, recorded)
    if found is None:
        return new_session_file(cwd, session_id), cwd
    # pi runs a session in the cwd of its header, and stops at a prompt when that folder is gone.
    header_cwd = read_header(found, field="--session-id").cwd
    if not os.path.isdir(header_cwd):
        raise ContractError(
            "--session-id",
            f"session {session_id} is in {found}, whose folder {header_cwd} (its header's cwd) is gone",
            "restore that folder, or give pi another session (--session FILE after --) or another "
            "--session-id",
        )
    return found, header_cwd


def _bridged_pi(
    argv: list[str], session_id: str, cwd: str, previous: Entry | None
) -> tuple[list[str], str | None, str]:
    """A pi master's argv with the bridge (master mode) and, unless the argv names its own
    session, ``--session`` with the session's one file (so pi's session id is the master's and a
    restarted master continues its conversation); and the cwd pi runs it in."""
    from ..bridge import bridge_path

    # pi's flags go after the program: `pi`, or `node …/cli.js`.
    at = program_length(argv)
    head, rest = argv[:at], argv[at:]
    added = [_BRIDGE_FLAG, str(bridge_path())]
    session_file = None
    if not any(word.split("=", 1)[0] in _SESSION_FLAGS for word in rest):
        session_file, cwd = _session_of(session_id, cwd, previous)
        added += ["--session", session_file]
    return [*head, *added, *rest], session_file, cwd


@attrs.define
class _MasterSession:
    """One master run: what its host hooks share (the host once registered, the Master once
    activated) and when each handoff notice was last posted to a bridged pi."""

    args: argparse.Namespace
    store: MatrixStore
    io: Io
    session_id: str
    task_ref: str | None
    prompter: TtyPrompter | None
    bridged: bool
    identity: AgentIdentityContract
    host: AgentHost | None = None
    master: Master | None = None
    posted: dict[str, float] = attrs.field(factory=dict)
    awaiting: dict[str, str] = attrs.field(factory=dict)  # handoff id -> entry key, posted to pi
    replaced: Entry | None = None  # the record this master's registration replaced
    acks: ThreadPoolExecutor | None = None  # the running host's (see ACK_THREADS); none for --once
    ready: bool = False  # the bridge has reported: handoffs held until then were posted

    def claim(self, previous: Entry | None) -> None:
        """Under the entry's lock, as this master registers: one master per session (--takeover
        overrides), and the record it replaces kept for the takeover."""
        check_claim(previous, takeover=self.args.takeover)
        self.replaced = previous

    def start_session(self) -> None:
        """Registered: an old master of the session yields (--takeover), then the pi session file
        gets its header if it is new (so pi's session id is ours), before any agent starts."""
        from ..pisession import write_header

        old = self.replaced
        if self.args.takeover and old is not None and (live_master(old) or stray_agent(old)):
            self.io.err.write(f"pi-matrix: taking over {old.key} from pid {old.pid}...\n")
            self.io.err.flush()
            done = take_over(
                self.store, old, sender=self.key, wait_s=TAKEOVER_WAIT_S, grace_s=TAKEOVER_GRACE_S
            )
            self.io.out.write(done + "\n")
        session_file = self.identity.session_file
        if session_file is not None:  # only a file this master chose for pi (none if argv names one)
            write_header(session_file, self.session_id, self.identity.cwd or os.getcwd())

    @property
    def key(self) -> str:
        return self.identity.key(Role.MASTER)

    def master_at(self, me: procs.ProcessIdentity, *, deliver: bool) -> Master:
        return Master(
            self.store, self.session_id, me, _relauncher(self.args, self.store), task_ref=self.task_ref,
            task_state=self.args.task_state, prompter=self.prompter, rehoster=rehost,
            deliver=self.deliver if deliver else None, acks=self.acks, housekeeping=settle_and_sweep,
        )  # fmt: skip

    def deliver(self, entry: Entry, handoff: Handoff) -> bool:
        """Hand one handoff to the master; True once it may be marked delivered."""
        host = self.host
        if not self.bridged or host is None:
            print_handoff(self.io, entry, handoff)
            return True
        if handoff.id in host.reports.handoffs_accepted:
            self.awaiting.pop(handoff.id, None)
            return True  # pi took it: now the handoff may be marked delivered
        if host.reports.seen:
            last = self.posted.get(handoff.id)
            if last is None or time.monotonic() - last > HANDOFF_REPOST_S:
                body = {"id": handoff.id, "parentSessionId": handoff.parent_session_id}
                host.notices.notify("handoff", json.dumps({**body, "text": handoff_message(entry, handoff)}))
                self.posted[handoff.id] = time.monotonic()
                self.awaiting[handoff.id] = entry.key
            return False
        if host.child is None or (host.reports.expected_by or 0) > time.monotonic():
            return False  # pi and its bridge are still starting
        print_handoff(self.io, entry, handoff)  # the bridge never reported: printed instead
        return True

    def once(self, identity: AgentIdentityContract) -> int:
        """``--once``: register this process as the master, activate, report, return."""
        me = procs.current()
        registered = self.store.register(
            lifecycle.new_entry(
                role=Role.MASTER, identity=identity, process=me, now=now_ms(), task_ref=self.task_ref
            ),
            check=self.claim,
        )
        try:
            self.start_session()
            report = one_shot(self.master_at(me, deliver=not self.args.json).activate())
        finally:
            # This process ends here: its record must not stay `running` under a dead pid (every
            # view would show a master that is not there). Closed as a host closes its own record;
            # a newer registration of the session meanwhile is left alone.
            with contextlib.suppress(Conflict):
                self.store.update(
                    registered.key,
                    lambda e: lifecycle.close(e, "once", now_ms()) if e.can_move_to(Status.CLOSED) else None,
                    registration=registered.registration,
                )
        if self.args.json:
            self.io.out.write(json.dumps(_report_json(report), indent=2) + "\n")
        else:
            _print_report(report, self.io)
        return EXIT_OK

    def on_registered(self, host: AgentHost) -> None:
        self.host = host
        self.start_session()
        self.acks = ThreadPoolExecutor(ACK_THREADS, thread_name_prefix="handoff-ack")
        self.master = self.master_at(host.me, deliver=True)
        _print_report(self.master.activate(), self.io)
        # A worker's handoff is seen as it is written, not at the heartbeat: on the host's own
        # inotify instance (a master holds one, like every agent).
        EntryFeed(str(self.store.root), host.key, host.record.watches, self._deliver)

    def on_wake(self, host: AgentHost) -> None:
        # pi took some handoffs (its bridge's report came in): acknowledge them now. At the first
        # report (pi is ready) what was held is posted (docs/decisions.md#handoffs-go-in-when-pi-is-ready).
        keys: set[str] | None = {k for h, k in self.awaiting.items() if h in host.reports.handoffs_accepted}
        if host.reports.seen and not self.ready:
            self.ready, keys = True, None
        self._deliver(keys)

    def _deliver(self, keys: set[str] | None) -> None:
        if self.master is not None and keys != set():
            self.master.deliver_handoffs(keys)

    def on_tick(self, _host: AgentHost) -> None:
        if self.master is not None:
            self.master.deliver_handoffs()
            _print_reclaimed(self.master.reclaim(), self.io)

    def close(self) -> None:
        """The host is done: the marks already queued are written before the process ends."""
        if self.acks is not None:
            self.acks.shutdown(wait=True)

    def on_switch(self, host: AgentHost, _old_key: str) -> None:
        # Identity, notices and the orphan scan follow the active session.
        if self.master is not None:
            self.master.session_id = host.spec.identity.session_id
            self.master.task_ref = host.spec.contract.task_ref
            _print_report(self.master.activate(), self.io)


def _master_contract(args: argparse.Namespace) -> LaunchContract:
    """The env's contract as a master's: no parent (a master is nobody's worker), --task-ref first."""
    env_contract = parse_env()
    task_ref = args.task_ref or env_contract.task_ref
    contract = attrs.evolve(env_contract, parent_pid=None, parent_session=None, task_ref=task_ref)
    if task_ref is not None:
        validate_task_ref(task_ref, "--task-ref")
    return contract


def _master_identity(  # noqa: PLR0917 (one call site; each argument is a different thing)
    args: argparse.Namespace, argv: list[str], contract: LaunchContract, session_id: str, mode: Mode,
    previous: Entry | None, io: Io,
) -> tuple[list[str], AgentIdentityContract]:  # fmt: skip
    """The agent's argv (a pi gets the bridge, its session's one file and its project-trust
    decision) and the master's identity."""
    provider = provider_of(argv, args.provider)
    session_file: str | None = None
    cwd = os.getcwd()
    if provider == "pi":
        argv, session_file, cwd = _bridged_pi(argv, session_id, cwd, previous)
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
    session_id = validate_id(args.session_id, "--session-id") if args.session_id else uuid.uuid4().hex
    mode = Mode(args.mode)
    # One master per session, one agent per session file: refused before anything is written
    # (and again under the entry's lock as the master registers).
    previous = store.find(f"{Role.MASTER.value}-{session_id}")
    check_claim(previous, takeover=args.takeover)
    argv, identity = _master_identity(args, argv, contract, session_id, mode, previous, io)
    # A print-mode pi ends after one run: a handoff cannot wake it, so it is printed instead.
    bridged = identity.provider == "pi" and mode is not Mode.PRINT and _BRIDGE_FLAG in argv
    session = _MasterSession(
        args, store, io, session_id, contract.task_ref, _prompter(args, mode, bridged, io), bridged,
        identity,
    )  # fmt: skip
    if args.once:
        return session.once(identity)
    spec = HostSpec(argv=tuple(argv), identity=identity, contract=contract, mode=mode, role=Role.MASTER)
    fork_results = ForkResults()

    def on_tick(host: AgentHost) -> None:
        session.on_tick(host)
        fork_results(host)

    hooks = HostHooks(
        session.on_registered,
        on_tick,
        session.on_switch,
        abort_forks,
        may_register=session.claim,
        on_wake=session.on_wake,
    )
    try:
        return AgentHost(spec, store, settings, hooks=hooks, out=io.out, err=io.err).run()
    finally:
        session.close()
