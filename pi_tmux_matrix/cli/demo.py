"""``pi-matrix demo``: the main job, end to end, on its own tmux socket, cleaned up after.

A master, three stand-in agents on two lanes of a scratch git repo; the master is killed and
the workers wind down to ``resumable``; one worker is then lost too; a new master of the same
session and task recovers them without asking (the live ones re-adopted, the dead one resumed
into its exact session file in a new pane); the tree is printed at every step. Everything it
started (processes by identity, its own tmux server, its scratch folder) is gone at the end.
With ``--agent pi`` the agents are real pi, on the user's model provider, or with ``--fake-model``
on the bundled fake model (docs/offline.md), whose answers end each round before the crash.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .. import gitcmd, procs
from ..errors import EXIT_OK, ContractError, LaneError, PiMatrixError, exit_code_for
from ..identity import ProcessIdentity, Role
from ..matrix.fsio import drop_fifos
from ..matrix.layout import PIPES
from ..matrix.model import Entry, Status
from ..matrix.store import MatrixStore
from ..programs import pi_command
from ..settings import agent_dir, load_settings
from ..strictjson import JSONObject
from .base import add_verb

if TYPE_CHECKING:
    from ..testing.fake_model import FakeModel
    from .base import Io, Verbs

__all__ = ["register"]

T = TypeVar("T")
SESSION = "demo-master"
TASK = "demo-goal"
STEP_TIMEOUT = 20.0
PI_ANSWER_TIMEOUT = 60.0  # three pis start (node, extensions) and ask the fake model


def register(sub: Verbs, epilog: str) -> None:
    demo = add_verb(sub, "demo", epilog)
    demo.add_argument(
        "--agent",
        choices=["stand-in", "pi"],
        help="the agents: the bundled stand-in (the default) or real pi",
    )
    demo.add_argument(
        "--fake-model",
        action="store_true",
        help="real pi against the bundled fake model on 127.0.0.1: offline, no key (implies --agent pi)",
    )
    demo.add_argument("--keep", action="store_true", help="keep the scratch folder (state, repo, logs)")
    demo.set_defaults(handler=cmd_demo)


PI_FILES = ("models.json", "auth.json")


def pi_provider(source: Path, env: Mapping[str, str]) -> tuple[list[Path], JSONObject]:
    """What ``demo --agent pi`` takes from the user's agent dir so its pi reaches a model: the
    ``models.json`` and ``auth.json`` there, and ``settings.json``'s own keys for pi
    (``processMatrix`` stays the demo's). Refused before anything starts when there is no provider
    at all (none of those files, no ``*_API_KEY`` variable): pi would never reach a model."""
    files = [source / name for name in PI_FILES if (source / name).is_file()]
    settings: JSONObject = {}
    try:
        loaded = json.loads((source / "settings.json").read_text())
    except (OSError, ValueError):
        loaded = None
    if isinstance(loaded, dict):
        settings = {k: v for k, v in loaded.items() if k != "processMatrix"}
    if not files and not any(k.endswith("_API_KEY") and v for k, v in env.items()):
        raise ContractError(
            "--agent pi",
            f"no model provider for pi in {source} (no models.json, no auth.json, no *_API_KEY variable)",
            "set one up as docs/real-provider.md shows, add --fake-model to run real pi offline against "
            "the bundled fake model (docs/offline.md), or run the demo with the stand-in (no --agent)",
        )
    return files, settings


class DemoFailed(PiMatrixError):
    """A step of the demo did not happen in time (the message says which)."""


class Demo:
    def __init__(self, io: Io, root: Path, agent: str, fake_model_url: str | None = None) -> None:
        self.io = io
        self.root = root
        self.agent = agent
        # The bundled fake model's base URL: its agents' pi asks it instead of the user's provider.
        self.fake_model_url = fake_model_url
        self.socket = f"pi-matrix-demo-{os.getpid()}"
        self.state = root / "state"
        self.agent_dir = root / "agent"
        self.repo = root / "repo"
        self.store = MatrixStore(self.state)
        self.started: list[ProcessIdentity] = []
        self.jobs: list[str] = []  # the ids of the jobs it fired
        self.tmux = shutil.which("tmux") is not None
        self.env = dict(os.environ)
        from ..contract import ENV_AGENT_DIR, ENV_OFFLINE, ENV_STATE_DIR, ENV_TMUX_SOCKET, NEVER_INHERITED
        from ..testing.standin import ENV_STEP_S, ENV_STEPS

        for name in NEVER_INHERITED:  # the demo's processes never inherit this shell's own contract
            self.env.pop(name, None)
        self.env.update(
            {
                ENV_AGENT_DIR: str(self.agent_dir),
                ENV_STATE_DIR: str(self.state),
                ENV_TMUX_SOCKET: self.socket,
                ENV_STEPS: "400",
                ENV_STEP_S: "0.25",
            }
        )
        if fake_model_url is not None:
            # Offline for real: no update check or model catalog, and no proxy between pi and
            # the fake on this machine's loopback.
            self.env[ENV_OFFLINE] = "1"
            others = self.env.get("NO_PROXY") or self.env.get("no_proxy")
            loopback = "127.0.0.1,localhost" + (f",{others}" if others else "")
            self.env["NO_PROXY"] = self.env["no_proxy"] = loopback

    # -- output ---------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.io.out.write(f"\n== {text}\n")
        self.io.out.flush()

    def tree(self) -> None:
        from .tree import cmd_tree

        cmd_tree(argparse.Namespace(state_dir=str(self.state), json=False, ndjson=False), self.io)
        self.io.out.flush()

    # -- set-up ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        self.agent_dir.mkdir(mode=0o700, parents=True)
        settings: JSONObject = {
            "processMatrix": {"heartbeatMs": 1000, "watcherPollMs": 1000, "adoptionGraceMs": 60000}
        }
        if self.fake_model_url is not None:
            from ..testing.fake_model import write_pi_agent_dir

            (self.agent_dir / "settings.json").write_text(json.dumps(settings))
            write_pi_agent_dir(self.agent_dir, self.fake_model_url)  # keeps processMatrix
            settings = json.loads((self.agent_dir / "settings.json").read_text())
        elif self.agent == "pi":
            # The demo's agent dir is a scratch one: real pi needs the user's provider in it.
            files, pi_settings = pi_provider(agent_dir(), os.environ)
            for path in files:
                (self.agent_dir / path.name).write_bytes(path.read_bytes())
                (self.agent_dir / path.name).chmod(0o600)
            settings.update(pi_settings)
        (self.agent_dir / "settings.json").write_text(json.dumps(settings))
        self.repo.mkdir()
        identity = ("user.name=pi-matrix demo", "user.email=demo@localhost")
        for args in (
            ["init", "-q"],
            ["commit", "-q", "--allow-empty", "-m", "scratch repo of pi-matrix demo"],
        ):
            done = gitcmd.run(str(self.repo), *args, config=identity)
            if done.returncode != 0:
                raise LaneError(
                    f"{self.repo}: git {args[0]} failed ({' '.join(done.stderr.split())[:300]}); "
                    "check that git works here ('git init' in a scratch folder), then retry"
                )

    def start_master(self) -> Entry:
        """A long-running master (headless; its own session is a stand-in that keeps working)."""
        argv = [
            sys.executable,
            "-m",
            "pi_tmux_matrix",
            "master",
            "--session-id",
            SESSION,
            "--task-ref",
            TASK,
            "--headless",
            "--mode",
            "print",
            "--relaunch",
            "tmux" if self.tmux else "detached",
            "--socket",
            self.socket,
            "--",
            sys.executable,
            "-m",
            "pi_tmux_matrix.testing.standin",
            "-p",
            "HANG orchestrating the demo",
        ]
        log = open(self.root / "master.log", "ab")  # noqa: SIM115 - handed to the child
        with log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.repo,
                env=self.env,
                start_new_session=True,
            )
        me = procs.identify(proc.pid)
        if me is not None:
            self.started.append(me)
        entry = self.wait(
            "the master to register and start its session",
            lambda: self._entry(
                f"master-{SESSION}",
                lambda e: e.pid == proc.pid and e.status is Status.RUNNING and bool(e.child_pid),
            ),
        )
        if entry.child_process is not None:
            self.started.append(entry.child_process)  # stopped by identity at the end, come what may
        return entry

    def fire(self, master: Entry, lane: str, *, profile: str | None = None, team: str | None = None) -> None:
        from ..dispatch.manager import Dispatcher
        from ..dispatch.request import FireRequest

        task = "HANG " + ("build the parser" if lane == "lane-a" else "write the docs")
        dispatcher = Dispatcher(self.store, load_settings(self.repo, self.env), env=self.env)
        request = FireRequest(
            task=task,
            lane=lane,
            path=str(self.repo),
            socket=self.socket,
            backend="tmux" if self.tmux else "subprocess",
            parent_pid=master.pid,
            parent_session=SESSION,
            profile=profile,
            team=team,
        )
        result = dispatcher.fire(request)
        self.jobs.append(result.job.id)
        for agent in result.job.agents:
            host = agent.host
            if host is not None:
                self.started.append(host)
            self.io.out.write(f"   fired {agent.agent_id} ({agent.key}) on {lane}: {agent.where}\n")

    # -- waiting --------------------------------------------------------------------------------------
    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = STEP_TIMEOUT) -> T:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            time.sleep(0.1)
        raise DemoFailed(f"demo: timed out after {timeout:.0f}s waiting for {what} (logs in {self.root})")

    def _entry(self, key: str, check: Callable[[Entry], bool]) -> Entry | None:
        entry = self.store.find(key)
        return entry if entry is not None and check(entry) else None

    def answered(self) -> list[str] | None:
        """Once every fired agent's round has its result: one line each."""
        from ..dispatch.manager import Dispatcher

        dispatcher = Dispatcher(self.store, load_settings(self.repo, self.env), env=self.env)
        agents = [a for job in self.jobs for a in dispatcher.view(dispatcher.jobs.get(job)).agents]
        if not agents or any(a.result is None for a in agents):
            return None
        return [
            f"   {a.agent.agent_id}: round {a.agent.round} {a.result.kind.value}" for a in agents if a.result
        ]

    def workers(self) -> list[Entry]:
        return [e for e in self.store.list().entries if e.role is Role.WORKER]

    def all_workers(self, check: Callable[[Entry], bool]) -> list[Entry] | None:
        workers = self.workers()
        return workers if len(workers) == 3 and all(check(w) for w in workers) else None

    # -- the story ------------------------------------------------------------------------------------
    def run(self) -> None:
        self.setup()
        self.say(f"a master (session {SESSION}, task {TASK}) and a scratch repo in {self.root}")
        master = self.start_master()
        where = f"panes on tmux -L {self.socket}" if self.tmux else "detached processes (no tmux)"
        self.say(f"fire three {self.agent} agents on two lanes (git worktrees), {where}")
        profile = "stand-in" if self.agent == "stand-in" else "pi-worker"
        team = "stand-in-pair" if self.agent == "stand-in" else "impl-review"
        self.fire(master, "lane-a", team=team)
        self.fire(master, "lane-b", profile=profile)
        self.wait("three running workers", lambda: self.all_workers(lambda w: w.status is Status.RUNNING))
        self.tree()
        if self.fake_model_url is not None:
            # With the fake model every pi answers at once: its round's end is part of the story
            # (a real model may work on the task for long; the demo does not wait for that).
            self.say("each pi asks the fake model and ends its round with the marker it was given")
            lines = self.wait("every pi's round to end", self.answered, timeout=PI_ANSWER_TIMEOUT)
            self.io.out.write("".join(line + "\n" for line in lines))

        self.say(f"kill -9 the master (pid {master.pid}): its workers notice at once and wind down")
        self.kill(master)
        self.wait(
            "every worker to be resumable",
            lambda: self.all_workers(lambda w: w.status is Status.RESUMABLE and w.reason == "parent_lost"),
        )
        self.tree()

        lost = max(self.workers(), key=lambda w: w.identity.agent_id)
        self.say(f"a worker is lost too: kill -9 {lost.identity.agent_id}'s host and agent")
        self.kill(lost)
        self.tree()

        self.say(
            f"a new master of session {SESSION} and task {TASK} recovers its exact orphans, no questions"
        )
        second = self.start_master()
        self.wait(
            "the live workers re-adopted and the lost one resumed into its session",
            lambda: self.all_workers(
                lambda w: (
                    w.status is Status.RUNNING and w.parent_pid == second.pid and procs.is_alive(w.process)
                )
            ),
        )
        resumed = self.store.get(lost.key)
        self.io.out.write(
            f"   {lost.key}: same key, same session file {resumed.identity.session_file}, new host pid "
            f"{resumed.pid} (was {lost.pid})\n"
        )
        self.tree()

    def kill(self, entry: Entry) -> None:
        for identity in (entry.process, entry.child_process):  # the host first: it must not record the end
            if identity is not None:
                procs.send_signal(identity, signal.SIGKILL)
                procs.wait_for_exit(identity, 5)

    # -- clean-up -------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Stop everything the demo started: every host and agent of its matrix by identity, the
        processes it spawned, then its own tmux server."""
        targets: list[ProcessIdentity] = list(self.started)
        with suppress(PiMatrixError, OSError):
            for entry in self.store.list().entries:
                targets += [i for i in (entry.process, entry.child_process) if i is not None]
        procs.stop(targets, 5.0, kill_wait_s=5.0)
        if self.tmux:
            from ..dispatch.tmux import TmuxServer

            with suppress(PiMatrixError, OSError):
                TmuxServer(self.socket).kill_server()
        # The pane pipes' helpers (started by tmux's pipe-pane, so not our children) end once
        # their pane is gone, but one still opening its FIFO waits for a reader: the FIFOs go
        # with that reader's open first (fsio). Wait for them, and stop any that does not end.
        with suppress(PiMatrixError, OSError):
            drop_fifos(self.state / PIPES)
        deadline = time.monotonic() + 5
        while (strays := procs.with_argument(str(self.state))) and time.monotonic() < deadline:
            time.sleep(0.05)
        for identity in strays:
            procs.send_signal(identity, signal.SIGTERM)


@contextmanager
def _fake_model(wanted: bool) -> Iterator[FakeModel | None]:
    """The bundled fake model, serving for the demo's length (None when not ``wanted``)."""
    if not wanted:
        yield None
        return
    from ..testing.fake_model import FakeModel

    with FakeModel() as model:
        yield model


@contextmanager
def _scratch(keep: list[bool]) -> Iterator[Path]:
    """A scratch folder, removed at the end unless ``keep[0]`` is true by then (``--keep``, or a
    failed step whose logs are the evidence)."""
    root = Path(tempfile.mkdtemp(prefix="pi-matrix-demo-"))
    try:
        yield root
    finally:
        if not keep[0]:
            shutil.rmtree(root, ignore_errors=True)


def cmd_demo(args: argparse.Namespace, io: Io) -> int:
    if args.fake_model and args.agent == "stand-in":
        raise ContractError(
            "--fake-model", "is for real pi: the stand-in asks no model", "drop --agent stand-in"
        )
    # Asked for by name, never a fallback: a demo of real pi that quietly talked to a fake would
    # not be the demo asked for (docs/decisions.md#a-fake-model-is-asked-for-by-name).
    args.agent = "pi" if args.fake_model else args.agent or "stand-in"
    if args.agent == "pi" and shutil.which(pi_command()[0]) is None:
        raise ContractError(
            "--agent pi", "no pi on PATH", "install it, set PI_MATRIX_PI_COMMAND, or drop --agent"
        )
    if shutil.which("git") is None:
        raise ContractError("git", "not found on PATH", "install git: the demo's lanes are git worktrees")
    if args.agent == "pi" and not args.fake_model:
        pi_provider(agent_dir(), os.environ)  # what is missing is said before anything starts
    started = time.monotonic()
    keep = [bool(args.keep)]
    with _scratch(keep) as root, _fake_model(args.fake_model) as fake:
        demo = Demo(io, root, args.agent, fake.base_url if fake is not None else None)
        if not demo.tmux:
            io.out.write("(tmux is not installed: the agents run detached, --backend subprocess)\n")
        if fake is not None:
            io.out.write(
                f"(real pi answered by the bundled fake model at {fake.base_url}: offline, no key; "
                "it answers a task with its marker, anything else with 'ok')\n"
            )
        try:
            demo.run()
        except PiMatrixError as exc:
            keep[0] = True
            io.err.write(f"pi-matrix: error: {exc}\n")
            return exit_code_for(exc)
        finally:
            demo.cleanup()
            if fake is not None:
                answered = len(fake.requests)
                io.out.write(f"\n== the fake model answered {answered} request(s) from the demo's pi\n")
            io.out.write(
                f"\n== done in {time.monotonic() - started:.1f}s; every process it started is stopped"
                + (f" and its tmux server (-L {demo.socket}) is gone" if demo.tmux else "")
                + (f"; kept {root}" if keep[0] else "")
                + "\n"
            )
    return EXIT_OK
