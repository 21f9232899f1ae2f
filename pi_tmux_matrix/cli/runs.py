"""Fork runs: ``pi-matrix fork`` and ``pi-matrix runs``
(docs/decisions.md#a-fork-runs-from-a-snapshot-beside-its-caller)."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_FAILED, EXIT_OK, ContractError
from ..settings import FORK_FIELDS, load_settings
from .base import add_verb, age, require_matrix, store_of

if TYPE_CHECKING:
    from ..fork import ForkRun, ForkUsage, RunStore, StopRequest
    from ..identity import ProcessIdentity
    from ..matrix.store import MatrixStore
    from .base import Io, Verbs

__all__ = ["fork_result_payload", "register"]

NOTIFY_CHARS = 6000  # of a background fork's answer sent to its parent: fits the mailbox's 64 KiB


def register(sub: Verbs, epilog: str) -> None:
    fork = add_verb(
        sub,
        "fork",
        epilog,
        usage="pi-matrix fork --session FILE [--wait | --background] [options] -- TASK...",
    )
    fork.add_argument("--session", metavar="FILE", required=True, help="the pi session file to fork")
    how = fork.add_mutually_exclusive_group()
    how.add_argument("--wait", action="store_true", help="wait for the result and print it (default)")
    how.add_argument(
        "--background", action="store_true", help="print the run id and return; the result is recorded"
    )
    fork.add_argument("--model", metavar="M", help="the child's model (default: the parent's)")
    fork.add_argument("--thinking", metavar="LEVEL", help="the child's thinking level")
    fork.add_argument("--provider", metavar="P", help="the child's provider")
    fork.add_argument(
        "--extension", "-e", action="append", default=[], metavar="FILE", help="one more extension"
    )
    fork.add_argument("--skill", action="append", default=[], metavar="S", help="one more skill")
    fork.add_argument(
        "--socket", metavar="NAME", help="outside tmux: a window on this tmux -L socket (default pi-matrix)"
    )
    fork.add_argument("--timeout", type=float, metavar="SECONDS", help="--wait: stop the fork after this")
    fork.add_argument("--json", action="store_true", help="the run record as JSON")
    fork.set_defaults(handler=cmd_fork, takes_argv=True)

    runs = add_verb(sub, "runs", epilog)
    runs.add_argument("run_id", nargs="?", metavar="RUN", help="one run (default: all)")
    runs.add_argument("--wait", action="store_true", help="wait for RUN to end")
    runs.add_argument("--timeout", type=float, metavar="SECONDS", help="--wait: stop the fork after this")
    runs.add_argument("--keep-pane", action="store_true", help="--wait: leave the pane open")
    runs.add_argument("--notify", action="store_true", help="--wait: send the result to the parent agent")
    runs.add_argument("--abort", action="store_true", help="stop RUN (or --parent-session's forks)")
    runs.add_argument("--parent-session", metavar="FILE", help="only forks of this session file")
    runs.add_argument(
        "--fork-settings",
        action="store_true",
        help="the pi-fork settings in force in this folder (footer, defaults, extensions, variable names)",
    )
    runs.add_argument("--json", action="store_true")
    # A waited fork's finisher watches its waiter (PID:START_TICKS): internal, not for people.
    runs.add_argument("--watch", metavar="PID:TICKS", help=argparse.SUPPRESS)
    runs.set_defaults(handler=cmd_runs)


def _timeout(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ContractError("--timeout", f"{value:g} is not a number of seconds", "give a positive number")
    return value


def _watched(value: str | None) -> ProcessIdentity | None:
    from .. import procs
    from ..identity import ProcessIdentity

    if value is None:
        return None
    pid, _, ticks = value.partition(":")
    if not (pid.isdigit() and ticks.isdigit()):
        raise ContractError("--watch", f"{value!r} is not PID:START_TICKS", "leave --watch to pi-matrix fork")
    return ProcessIdentity(int(pid), int(ticks), procs.boot_id())


def _print_run(io: Io, run: ForkRun) -> None:
    cost = f"${run.usage.cost:.4f} {run.usage.total_tokens} tok" if run.usage else "-"
    where = f"{run.socket_path or run.socket}:{run.pane_id}" if run.pane_id else "-"
    task = run.task.replace("\n", " ")
    io.out.write(
        f"{run.id}  {run.status.value:<9}  {age(run.created_at_ms):>4}  {cost}  {where}  {task[:60]}\n"
    )
    if run.error:
        io.out.write(f"    error: {run.error}\n")


def _report(io: Io, run: ForkRun, as_json: bool, answer: str | None = None) -> int:
    """The run as it ended; ``answer``, the whole final text (the record keeps an excerpt), goes
    into the JSON as ``answer``: what the fork tool returns to the model."""
    from ..fork import RunStatus

    if as_json:
        shown = run.to_json()
        if answer is not None:
            shown["answer"] = answer
        io.out.write(json.dumps(shown, indent=2) + "\n")
    elif run.status is RunStatus.RUNNING:
        io.out.write(f"fork {run.id} running in {run.socket_path or run.socket}:{run.pane_id}\n")
        io.out.write(f"  pi-matrix runs {run.id} --wait   # its result, when it ends\n")
    else:
        io.out.write(f"fork {run.id} {run.status.value}" + (f": {run.error}" if run.error else "") + "\n")
        if run.text:
            io.out.write(run.text.rstrip() + "\n")
    return EXIT_FAILED if run.status is RunStatus.FAILED else EXIT_OK


@contextmanager
def _stop_on_signals() -> Iterator[StopRequest]:
    """A stop request that SIGTERM and SIGHUP (the caller, the parent session, going away) and
    SIGINT (a person's Ctrl-C) make while this is active, instead of ending the process: a waiter
    must stop its fork before it goes, and a launch must not be cut between making the pane and
    recording it. The handlers are this program's to install (main thread only), never the
    library's; the previous ones come back after."""
    from ..fork import StopRequest

    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT:
            stop.interrupt()
        else:
            stop.parent_shutdown()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _requested_flags(args: argparse.Namespace) -> list[str]:
    """The pi flags ``fork`` was given for the child, as pi spells them."""
    flags: list[str] = []
    for flag, value in (
        ("--model", args.model),
        ("--thinking", args.thinking),
        ("--provider", args.provider),
    ):
        if value:
            flags += [flag, value]
    for extension in args.extension:
        flags += ["--extension", extension]
    for skill in args.skill:
        flags += ["--skill", skill]
    return flags


def cmd_fork(args: argparse.Namespace, io: Io) -> int:
    from .. import procs
    from ..bridge import bridge_path
    from ..contract import ENV_TMUX, ENV_TMUX_PANE, ENV_TMUX_SOCKET
    from ..fork import ForkRequest, RunMode, RunStore, abort_run, start_fork, wait_run
    from ..programs import finisher_argv, pi_command, spawn_detached

    if not args.argv:
        raise ContractError(
            "TASK", "missing", "give the task after --, e.g. pi-matrix fork --session F -- check X"
        )
    require_matrix("fork")
    mode = RunMode.BACKGROUND if args.background else RunMode.WAIT
    timeout = _timeout(args.timeout)
    request = ForkRequest(
        session_file=args.session,
        task=" ".join(args.argv),
        mode=mode,
        flags=tuple(_requested_flags(args)),
        socket=args.socket or os.environ.get(ENV_TMUX_SOCKET) or None,
        tmux_env=os.environ.get(ENV_TMUX) or None,
        tmux_pane=os.environ.get(ENV_TMUX_PANE) or None,
    )
    store = store_of(args)
    settings = load_settings()
    waiter = procs.current()

    def started(run: ForkRun) -> None:
        # Before pi starts: a background run's finisher records its end and tells the parent; a
        # waited run's watches this waiter, which pi's bash tool may SIGKILL with its group.
        background = mode is RunMode.BACKGROUND
        watch = None if background else (waiter.pid, waiter.start_ticks)
        argv = finisher_argv(store.root, run.id, watch=watch, notify=background)
        spawn_detached(argv, RunStore(store).folder(run.id) / "finisher.log", cwd=run.cwd)

    with _stop_on_signals() as stop:
        run = start_fork(
            store, settings, request, pi_argv=pi_command(), bridge=str(bridge_path()), on_started=started
        )
        if mode is RunMode.BACKGROUND:
            why = stop.reason()
            if why is not None:  # told to stop while it was being launched
                run = abort_run(RunStore(store), run.id, why)
            return _report(io, run, args.json)
        with _progress(io) as progress:
            ended = wait_run(store, run.id, timeout_s=timeout, stop=stop, on_poll=progress)
        return _report(io, ended, args.json, RunStore(store).answer(ended) if args.json else None)


@contextmanager
def _progress(io: Io) -> Iterator[Callable[[ForkRun, float], None] | None]:
    """A waited fork's one progress line on a terminal (its run, where it runs, the seconds
    waited), rewritten in place and erased at the end; nothing at all on a pipe."""
    if not io.err.isatty():
        yield None
        return
    shown = [-1]

    def line(run: ForkRun, waited: float) -> None:
        if int(waited) == shown[0]:
            return
        shown[0] = int(waited)
        where = f" in {run.pane_id}" if run.pane_id else ""
        io.err.write(f"\r\x1b[2Kfork {run.id} running{where}: {int(waited)}s (Ctrl-C stops it)")
        io.err.flush()

    try:
        yield line
    finally:
        if shown[0] >= 0:
            io.err.write("\r\x1b[2K")
            io.err.flush()


def _fork_settings(io: Io, as_json: bool) -> int:
    """``runs --fork-settings``: the ``pi-fork`` settings in force here (the bridge reads its
    ``costFooter`` from this), the environment's names only (its values may be secrets)."""
    fork = load_settings().fork
    sources = {key: fork.sources.get(field, "default") for key, field in FORK_FIELDS.items()}
    shown: dict[str, Any] = {
        "costFooter": fork.cost_footer,
        "defaultModel": fork.default_model,
        "defaultThinking": fork.default_thinking,
        "extensions": list(fork.extensions),
        "environment": sorted(fork.environment),
        "sources": sources,
    }
    if as_json:
        io.out.write(json.dumps(shown, indent=2) + "\n")
        return EXIT_OK
    for key, value in shown.items():
        if key != "sources":
            io.out.write(f"pi-fork.{key} = {json.dumps(value)}  ({sources[key]})\n")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, io: Io) -> int:
    # Every pi start with the bridge asks for its fork settings: that answer imports no store,
    # tmux or fork code (0.14 -> 0.07 CPU-s a call).
    if args.fork_settings:
        return _fork_settings(io, args.json)
    from ..fork import RunStore, abort_run, refresh
    from .names import Kind, resolve

    require_matrix("runs")
    store = store_of(args)
    runs = RunStore(store)
    if args.run_id is None:
        return _all_runs(args, io, store, runs)
    if args.abort and args.wait:
        raise ContractError("--abort", "cannot be combined with --wait", "use one")
    waits_only = args.keep_pane or args.notify or args.timeout is not None or args.watch is not None
    if waits_only and not args.wait:
        raise ContractError("--keep-pane/--notify/--timeout", "given without --wait", "they go with --wait")
    if args.watch is None:  # a person's word (a finisher names its run whole)
        args.run_id = resolve(store, args.run_id, (Kind.RUN,), "RUN").name
    if args.abort:
        return _report(io, abort_run(runs, args.run_id, "aborted by pi-matrix runs --abort"), args.json)
    if args.wait:
        return _wait_for(args, io, store)
    run = refresh(runs, args.run_id)  # as it stands now, not as last recorded
    if args.json:
        io.out.write(json.dumps(run.to_json(), indent=2) + "\n")
        return EXIT_OK
    _print_run(io, run)
    return EXIT_OK


def _all_runs(args: argparse.Namespace, io: Io, store: MatrixStore, runs: RunStore) -> int:
    """``runs`` without a RUN: abort a parent session's forks, or list them all."""
    if args.wait:
        raise ContractError("--wait", "needs a RUN", "name the run: pi-matrix runs RUN --wait")
    if args.abort:
        return _abort_parent_forks(args, io, store)
    return _list_runs(args, io, store, runs)


def _abort_parent_forks(args: argparse.Namespace, io: Io, store: MatrixStore) -> int:
    """``runs --abort --parent-session FILE``: stop that session's running forks."""
    from ..fork import abort_runs

    if not args.parent_session:
        raise ContractError(
            "--abort",
            "needs a RUN or --parent-session",
            "name what to stop: pi-matrix runs RUN --abort",
        )
    stopped = abort_runs(store, parent_session_file=args.parent_session)
    if args.json:
        io.out.write(json.dumps([r.to_json() for r in stopped], indent=2) + "\n")
    else:
        io.out.write(f"stopped {len(stopped)} fork(s) of {args.parent_session}\n")
    return EXIT_OK


def _list_runs(args: argparse.Namespace, io: Io, store: MatrixStore, runs: RunStore) -> int:
    """Every run (of ``--parent-session``) as it stands now, with the cost and usage total."""
    from ..fork import reap, usage_total

    listed = reap(runs) if store.exists() else []
    for problem in runs.list()[1] if store.exists() else []:
        # Never deleted here: the file is evidence. Listed so the user can move it aside.
        io.err.write(f"pi-matrix: warning: {problem.line()} (left in place, not a run)\n")
    if args.parent_session:
        wanted = os.path.realpath(args.parent_session)
        listed = [r for r in listed if r.parent_session_file == wanted]
    total = usage_total(listed)
    if args.json:
        body = {"runs": [r.to_json() for r in listed], "total": {"runs": len(listed), **_total(total)}}
        io.out.write(json.dumps(body, indent=2) + "\n")
        return EXIT_OK
    for run in listed:
        _print_run(io, run)
    io.out.write(
        f"{len(listed)} run(s); tokens {total.total_tokens} (in {total.input}, out {total.output}); "
        f"cost ${total.cost:.4f}\n"
    )
    return EXIT_OK


def _wait_for(args: argparse.Namespace, io: Io, store: MatrixStore) -> int:
    """``runs RUN --wait`` (a person, or the run's finisher): wait for the end, record it, and
    with ``--notify`` tell the parent agent."""
    from ..fork import wait_run

    with _stop_on_signals() as stop, _progress(io) as progress:
        run = wait_run(
            store,
            args.run_id,
            timeout_s=_timeout(args.timeout),
            close_pane=not args.keep_pane,
            watch=_watched(args.watch),
            stop=stop,
            on_poll=progress,
        )
    if args.notify and run.parent_key:
        _notify(store, run.parent_key, run)
    return _report(io, run, args.json)


def _total(total: ForkUsage) -> dict[str, Any]:
    return {
        "input": total.input,
        "output": total.output,
        "cacheRead": total.cache_read,
        "cacheWrite": total.cache_write,
        "totalTokens": total.total_tokens,
        "cost": total.cost,
    }


def fork_result_payload(store: MatrixStore, run: ForkRun) -> str:
    """A finished background run's ``fork_result`` notice for its parent's session: the run's id,
    status, model, usage (the parent's ``forks +$…`` footer counts it) and its labelled answer,
    whole up to :data:`NOTIFY_CHARS`, else the record's excerpt if the mailbox would not take it
    (64 KiB once escaped twice; wide characters)."""
    from ..fork import RunStore, summary
    from ..matrix.mailbox import encode_message

    answer = RunStore(store).answer(run)
    payload = ""
    for text in (summary(run, answer, limit=NOTIFY_CHARS), summary(run)):
        payload = json.dumps(
            {
                "runId": run.id,
                "status": run.status.value,
                "text": text,
                "model": run.model,
                "usage": _total(run.usage) if run.usage is not None else None,
            }
        )
        try:
            encode_message("fork_result", payload, "pi-matrix fork", to="x" * 200)
        except ContractError:
            continue
        break
    return payload


def _notify(store: MatrixStore, key: str, run: ForkRun) -> None:
    """The finished fork's report, to the parent agent's session through its host: a
    ``fork_result`` notice, which the bridge injects once (as a handoff); the parent's host posts
    it again until the bridge acknowledges it (:class:`pi_tmux_matrix.cli.host.ForkResults`)."""
    from .. import procs
    from ..matrix.mailbox import Inbox

    entry = store.find(key)
    if entry is None or not procs.is_alive(entry.process):
        return
    payload = fork_result_payload(store, run)
    Inbox(store, key).post("fork_result", payload, sender="pi-matrix fork", to=entry.registration)
