"""The host's one agent child: started from its argv without a shell, signalled the way its mode
allows, stopped by the one stop sequence, and classified when it ends.

``StopSequence`` is the only way the host ever stops its child (an owner's ``stop``, the
deadline, a cleanup request, the grace window's end): ask the agent, wait the stop grace,
SIGTERM, wait again, SIGKILL. Why it was stopped decides how its end is recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import IO, Any

import attrs

from .. import procs
from ..contract import ENV_CLI, ENV_HOST_PID, ENV_KEY, ENV_MAILBOX, ENV_STATE_DIR, ENV_TMUX
from ..identity import Mode, ProcessIdentity
from ..matrix import lifecycle
from ..matrix.model import Entry, ExitKind, ExitRecord, Status
from ..programs import agent_argv, cli_argv
from .record import OwnRecord
from .rpc import RpcPipe, Tell, command_for

__all__ = [
    "AgentChild",
    "StopSequence",
    "child_env",
    "exit_code_of",
    "reachable",
    "signal_child",
    "spawn",
]


def exit_code_of(returncode: int | None) -> int:
    """A child's return code as a process exit status (signals as 128+n, like a shell); 0 for an
    agent that was not our child (its code cannot be known)."""
    if returncode is None:
        return 0
    return returncode if returncode >= 0 else 128 - returncode


def child_env(*, key: str, state_dir: str, mailbox: str, host_pid: int) -> dict[str, str]:
    """The host's environment plus what the agent (and the pi bridge in it) needs to find it."""
    env = dict(os.environ)
    env.update(
        {
            ENV_KEY: key,
            ENV_STATE_DIR: state_dir,
            ENV_MAILBOX: mailbox,
            ENV_HOST_PID: str(host_pid),
            # How the bridge runs this same pi-matrix (a master's tmux_agent_manager tool).
            ENV_CLI: json.dumps(cli_argv(None)),
        }
    )
    return env


def spawn(
    argv: tuple[str, ...], mode: Mode, *, cwd: str | None, env: dict[str, str], die_with_host: bool = False
) -> subprocess.Popen[bytes]:
    """Start the agent: an interactive one keeps the host's terminal; a print or rpc one leads a
    session of its own (so a stop reaches everything it started) and never reads the terminal.

    ``die_with_host``: the kernel hangs the agent up when this host dies, even by SIGKILL (a
    master's own agent: nobody would supervise it, and it would go on drawing over the user's
    shell and writing its session file beside the next master's agent). SIGHUP, as when a
    terminal goes: pi and a shell end on it; an agent that ignores hangups on purpose lives on,
    and its record still names it (views say it runs unsupervised; ``stop`` reaches it)."""
    kwargs: dict[str, Any] = {"env": env, "cwd": cwd, "close_fds": True}
    if die_with_host:
        kwargs["preexec_fn"] = procs.die_with_parent(signal.SIGHUP)
    if mode is Mode.PRINT:
        kwargs.update(stdin=subprocess.DEVNULL, start_new_session=True)
    elif mode is Mode.RPC:
        kwargs.update(stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    return subprocess.Popen(agent_argv(argv, env), **kwargs)  # argv list, never a shell


def signal_child(identity: ProcessIdentity | None, mode: Mode, sig: int) -> None:
    """Signal the child by its identity (never a recycled pid): an interactive child alone (it
    shares the terminal's group with the host), a print or rpc child with its whole group."""
    if identity is None:
        return
    if mode is Mode.INTERACTIVE:
        procs.send_signal(identity, sig)
    else:
        procs.send_signal(identity, sig, group=True)


@attrs.define
class StopSequence:
    """The one stop path: request -> grace -> SIGTERM -> grace -> SIGKILL, and what it means for
    how the child's end is recorded."""

    outcome: ExitKind | None = None  # set once: the first reason to stop wins
    reason: str | None = None  # "stop", "deadline", "cleanup", "grace_expired", "signal"
    steps: list[tuple[float, int]] = attrs.field(factory=list)  # (monotonic time, signal), in order
    forwarded: int | None = None  # a signal the host passed on to the child (it was asked to stop)
    hangup: bool = False  # the host's terminal hung up (its tmux pane or server went away)

    @property
    def requested(self) -> bool:
        return self.outcome is not None

    def begin(self, outcome: ExitKind, reason: str) -> bool:
        """Take the stop request; False when one was already taken (it is not restarted)."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        self.reason = reason
        return True

    def schedule(self, *, asked: bool, grace_s: float, now: float) -> None:
        """The signals to come: an agent that was asked to stop gets the grace before SIGTERM."""
        first = now + grace_s if asked else now
        self.steps = [(first, signal.SIGTERM), (first + grace_s, signal.SIGKILL)]

    def next_at(self) -> float | None:
        return self.steps[0][0] if self.steps else None

    def due(self, now: float) -> list[int]:
        """The signals whose time has come, taken off the sequence."""
        signals: list[int] = []
        while self.steps and self.steps[0][0] <= now:
            signals.append(self.steps.pop(0)[1])
        return signals

    def classify(self, returncode: int | None, now: int) -> ExitRecord:
        """How the child ended: as its stop asked, killed by a forwarded signal, crashed, or exited
        (``returncode`` None: an agent taken over from a dead host, whose code nobody can read)."""
        code = returncode if returncode is not None and returncode >= 0 else None
        sig = -returncode if returncode is not None and returncode < 0 else None
        if self.outcome is not None:
            return ExitRecord(kind=self.outcome, at=now, code=code, signal=sig)
        if self.forwarded is not None:
            return ExitRecord(kind=ExitKind.KILLED, at=now, code=code, signal=sig)
        if sig is not None:
            return ExitRecord(kind=ExitKind.CRASHED, at=now, code=None, signal=sig)
        return ExitRecord(kind=ExitKind.EXITED, at=now, code=code)

    def end_step(
        self,
        record: ExitRecord,
        now: int,
        *,
        summary: str,
        result_pointer: str,
        lost: bool = False,
        handoff: bool = True,
    ) -> Callable[[Entry], Entry | None]:
        """The write that records the child's end in the entry, by why it stopped (``lost``: its
        terminal went away under it, see :meth:`AgentChild.terminal_lost`; ``handoff=False``: its
        last round already handed off, see :mod:`.rounds`)."""
        if lost:
            return self.lost_step(record, now)
        if self.reason == "grace_expired":
            # Expiry leaves the entry resumable for a future session; only the exit is noted.
            return lambda e: attrs.evolve(e, exit=record) if e.status is Status.RESUMABLE else None
        if self.reason == "cleanup":
            return lambda e: lifecycle.close(attrs.evolve(e, exit=record), "cleanup", now)

        def finish(entry: Entry) -> Entry | None:
            if not entry.can_move_to(Status.TERMINAL):
                return None
            return lifecycle.record_terminal(
                entry, record, now, summary=summary, result_pointer=result_pointer, handoff=handoff
            )

        return finish

    def lost_step(self, record: ExitRecord, now: int) -> Callable[[Entry], Entry | None]:
        """The write for an agent whose terminal went away under it: resumable, the exit noted."""
        return lambda e: (
            lifecycle.make_resumable(attrs.evolve(e, exit=record), now, reason=lifecycle.TMUX_LOST)
            if e.can_move_to(Status.RESUMABLE)
            else None
        )


def tmux_server() -> ProcessIdentity | None:
    """The tmux server of the pane this process runs in (``$TMUX``), or None outside tmux."""
    parts = os.environ.get(ENV_TMUX, "").split(",")
    return procs.identify(int(parts[1])) if len(parts) >= 3 and parts[1].isdigit() else None


def terminal_gone() -> bool:
    """Whether this process's controlling terminal has hung up (a tmux pane or server gone):
    ``/dev/tty`` cannot be opened any more."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return True
    os.close(fd)
    return False


def reachable(mode: Mode | None, is_pi: bool) -> bool:
    """Whether a host can tell its agent anything: over the rpc pipe, or through the bridge's
    mailbox in an interactive pi. Anything else is only recorded (``pi-matrix send`` refuses it)."""
    return mode is Mode.RPC or (mode is Mode.INTERACTIVE and is_pi)


class AgentChild:
    """The one agent child: started, told things the way its mode allows, stopped, signalled."""

    def __init__(
        self,
        record: OwnRecord,
        *,
        mode: Mode,
        is_pi: bool,
        stop_grace_s: float,
        out: IO[str],
        die_with_host: bool = False,
    ) -> None:
        self.record = record
        self.mode = mode
        self.is_pi = is_pi  # a bridged interactive pi reads notices from its mailbox
        self.die_with_host = die_with_host
        self.stop_grace_s = stop_grace_s
        self.popen: subprocess.Popen[bytes] | None = None
        self.identity: ProcessIdentity | None = None
        self.taken_over = False  # an agent started by a host that died, watched here by identity
        self.stop = StopSequence()
        # A host in a tmux pane has the pane as its terminal; one without a terminal never loses one.
        self.had_terminal = os.isatty(0) and not terminal_gone()
        self.tmux_server = tmux_server() if self.had_terminal else None
        # The events log is looked up per event: a session switch re-keys the record.
        self.rpc = RpcPipe(out, lambda event: record.events.write("rpc", data=event))

    @property
    def running(self) -> bool:
        """There is an agent to supervise: our child, or one taken over."""
        return self.popen is not None or self.taken_over

    def take_over(self, identity: ProcessIdentity) -> None:
        """Supervise a live agent that another (dead) host started: watched by a pidfd, told
        through its mailbox, stopped by identity-checked signals; its exit code stays unknown."""
        self.identity = identity
        self.taken_over = True
        self.record.events.write("taken_over", pid=identity.pid)

    def end_code(self) -> int | None:
        """The ended agent's return code (reaped), or None for one that was not our child."""
        return self.popen.wait() if self.popen is not None else None

    def start(
        self, argv: tuple[str, ...], *, cwd: str | None, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        self.popen = spawn(argv, self.mode, cwd=cwd, env=env, die_with_host=self.die_with_host)
        self.rpc.attach(self.popen)
        self.identity = procs.identify(self.popen.pid)
        return self.popen

    def tell(self, kind: Tell, text: str) -> str:
        """Tell the agent the way its mode allows; returns the channel it went by (``rpc``, or
        ``lost`` when the pipe is gone; ``mailbox`` for a bridged interactive pi; ``recorded``
        when no channel reaches the agent)."""
        if self.mode is Mode.RPC:
            return "rpc" if self.rpc.send(command_for(kind, text)) else "lost"
        if reachable(self.mode, self.is_pi):
            self.record.notices.notify(kind, text)
            return "mailbox"
        return "recorded"

    def steer(self, text: str, *, notice: bool = False) -> None:
        """Deliver a steering message to the child the way its mode allows."""
        channel = self.tell("steer", text)
        self.record.events.write("steer_notice" if notice else "steer", channel=channel, message=text)

    def terminal_lost(self, returncode: int | None) -> bool:
        """The agent ended because its terminal hung up (a pane or tmux server gone), not
        because anyone asked it to stop."""
        if self.stop.requested or not self.had_terminal:
            return False
        if not (self.stop.hangup or returncode == -signal.SIGHUP or terminal_gone()):
            return False
        if self.tmux_server is not None and not procs.wait_for_exit(self.tmux_server, 2.0):
            # Its tmux server lives on: someone closed the pane or window (kill-pane, a closed
            # terminal of its own): that ends the agent, as asked.
            return False
        self.record.events.write("terminal_lost", code=returncode)
        return True

    def request_stop(self, outcome: ExitKind, reason: str) -> None:
        """The one stop path: request -> grace -> SIGTERM -> grace -> SIGKILL."""
        if not self.stop.begin(outcome, reason):
            return
        self.record.events.write("stop_requested", outcome=outcome.value, reason=reason)
        now = time.monotonic()
        asked = self.tell("shutdown", f"stop requested: {reason}") in ("rpc", "mailbox")
        if self.mode is Mode.RPC and self.rpc.close():
            asked = True  # closing stdin asks as well (pi --mode rpc exits on EOF)
        self.stop.schedule(asked=asked, grace_s=self.stop_grace_s, now=now)

    def run_stop_steps(self) -> None:
        for sig in self.stop.due(time.monotonic()):
            self.record.events.write("stop_signal", signal=int(sig))
            signal_child(self.identity, self.mode, sig)

    def forward(self, sig: int) -> None:
        """The host was asked to stop by a signal: the child gets it, and its end counts as killed."""
        self.stop.forwarded = sig
        self.stop.hangup = self.stop.hangup or sig == signal.SIGHUP
        self.record.events.write("signal_forwarded", signal=sig)
        signal_child(self.identity, self.mode, sig)
