"""Adoption races with real processes (issue 30.7): one grant wins, the losers are told, and a
host always watches the parent its entry names.

A real ``pi-matrix host`` runs the stand-in agent as a worker. Each round its recorded parent is
SIGKILLed (the host winds down to ``resumable``) and three real masters contend for the orphan
(``tests/adoption_contender.py``, each running ``Master.activate``): one exact (the dead
parent's session and task: it re-adopts without asking) and two foreign ones whose owners answer
``y`` to "adopt ...?" at one gate, opened in the same instant the exact master starts. After
every round:

* the entry's parent is exactly one of the contenders (the winner);
* the host watches that parent: its ``adopted`` event names it, and killing it winds the worker
  down to ``resumable`` within a poll (a host watching another parent would keep running);
* the winner said it adopted, every other contender that tried was told it was refused, naming
  the winner (an exact master whose scan came after the winner's adoption has no orphan to try).

Violations are collected over all rounds and reported together, so a run against a broken tree
says in how many rounds each rule broke. Every process is tracked by the ``reaper`` fixture and
killed by its identity at the end.
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import pytest
from helpers import Reaper, read_events
from waiting import poll, wait_for

import pi_tmux_matrix
from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix.model import Entry, Status
from pi_tmux_matrix.matrix.store import MatrixStore

ROUNDS: Final = int(os.environ.get("PI_MATRIX_ADOPTION_ROUNDS", "20"))
TASK_REF: Final = "goal-race"
SETTINGS: Final = {
    # Grace long enough that no round's worker expires; poll and beat at their lower bounds.
    "processMatrix": {"adoptionGraceMs": 60_000, "watcherPollMs": 1000, "heartbeatMs": 1000}
}
WIND_DOWN_S: Final = 3.0  # the pidfd sees a death at once; the 1 s poll is the safety net
CONTENDER: Final = Path(__file__).with_name("adoption_contender.py")
WON: Final = ("re-adopted", "adopted")
STEP_S: Final = 0.01  # a race: look often
T = TypeVar("T")


def child_env() -> dict[str, str]:
    """Every process started here imports the package under test, not another checkout's."""
    root = str(Path(pi_tmux_matrix.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "STANDIN_STEP_S": "0.05"}


@attrs.define(eq=False)
class Contender:
    """One contending master process and the lines it says."""

    popen: subprocess.Popen[str]
    lines: queue.Queue[str] = attrs.field(factory=queue.Queue)
    session: str = ""
    identity: ProcessIdentity | None = None

    @classmethod
    def spawn(cls, reaper: Reaper, state: Path) -> Contender:
        popen = subprocess.Popen(
            [sys.executable, str(CONTENDER), str(state)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=child_env(), start_new_session=True,
        )  # fmt: skip
        reaper.popen(popen)
        made = cls(popen)
        threading.Thread(target=made._read, daemon=True).start()
        return made

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def said(self, timeout: float = 20.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"contender {self.session} said nothing for {timeout}s") from None

    def register(self, session: str, boot_id: str) -> None:
        self.session = session
        self.send(f"register {session} {TASK_REF}")
        word, pid, start = self.said().split()
        assert word == "registered" and int(pid) == self.popen.pid
        self.identity = ProcessIdentity(int(pid), int(start), boot_id)

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait(timeout=10)


@pytest.fixture(autouse=True)
def race_settings(isolated_env: Path) -> None:
    agent_dir = Path(os.environ["PI_CODING_AGENT_DIR"])
    agent_dir.mkdir(parents=True, exist_ok=True)
    (agent_dir / "settings.json").write_text(json.dumps(SETTINGS))


@attrs.define(eq=False)
class Race:
    """The worker, its contenders, and what broke so far."""

    reaper: Reaper
    store: MatrixStore
    tmp: Path
    boot: str = attrs.field(factory=lambda: procs.current().boot_id)
    key: str = "worker-racer"
    log: Path = attrs.field(init=False)
    spare: Contender = attrs.field(init=False)  # started a round ahead: its imports are done
    foreign: list[Contender] = attrs.field(factory=list)
    rng: random.Random = attrs.field(factory=lambda: random.Random(307))
    broken: list[tuple[str, str]] = attrs.field(factory=list)  # (which rule, what happened)

    def __attrs_post_init__(self) -> None:
        self.log = self.tmp / "host.log"
        self.spare = Contender.spawn(self.reaper, self.store.root)

    def contender(self, session: str) -> Contender:
        made, self.spare = self.spare, Contender.spawn(self.reaper, self.store.root)
        made.register(session, self.boot)
        return made

    def entry(self) -> Entry | None:
        return self.store.find(self.key)

    def adopted_events(self) -> list[dict[str, Any]]:
        return read_events(self.store.root, self.key, "adopted")

    def diagnose(self) -> str:
        events = read_events(self.store.root, self.key)
        tail = [(e["event"], e.get("status") or e.get("parent_pid")) for e in events]
        return f"entry: {self.entry()}\nevents: {tail[-12:]}\nhost: {self.log.read_text()[-1500:]}"

    def resumable_under(self, parent_pid: int | None) -> Callable[[], Entry | None]:
        def probe() -> Entry | None:
            e = self.entry()
            ok = e is not None and e.status is Status.RESUMABLE and e.parent_pid == parent_pid
            return e if ok else None

        return probe

    def start_worker(self, parent: Contender) -> None:
        work = self.tmp / "work"
        work.mkdir()
        session_file = self.tmp / "sessions" / "racer.jsonl"
        cmd = [
            sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(self.store.root), "host",
            "--session-id", "racer", "--session-file", str(session_file), "--cwd", str(work),
            "--provider", "pi", "--mode", "interactive", "--parent-pid", str(parent.popen.pid),
            "--parent-session", parent.session, "--task-ref", TASK_REF, "--stop-grace", "1",
            "--", sys.executable, "-m", "pi_tmux_matrix.testing.standin", "--session", str(session_file),
            "HANG race",
        ]  # fmt: skip
        self.reaper.logged(cmd, self.log, cwd=work, env=child_env())

        def child() -> ProcessIdentity | None:
            e = self.entry()
            return e.child_process if e is not None and e.status is Status.RUNNING else None

        agent = wait_for("the worker's agent", child, 30, self.diagnose, step=STEP_S)
        assert agent is not None
        self.reaper.identity(agent)

    def run(self, n: int) -> None:
        """Round ``n``: the orphan's exact master and the two foreign owners contend at one gate."""
        said = f"round {n}"
        orphan = self.entry()
        assert orphan is not None and orphan.status is Status.RESUMABLE, self.diagnose()
        assert orphan.reason == "parent_lost", self.diagnose()
        exact = self.contender(orphan.parent_session_id or "")
        contenders = [exact, *self.foreign]
        before = len(self.adopted_events())
        for f in self.foreign:
            f.send("activate")
        for f in self.foreign:
            assert f.said() == "asking", f"{said}: {f.session} was not asked"
        # In one instant (shuffled, a few ms apart) the owners answer y and the exact master starts.
        gate = [(f, "go") for f in self.foreign] + [(exact, "activate")]
        self.rng.shuffle(gate)
        for who, word in gate:
            who.send(word)
            time.sleep(self.rng.uniform(0, 0.004))
        decisions = {c.session: [d for d in json.loads(c.said()) if d["key"] == self.key] for c in contenders}
        wait_for(
            f"{said}: the worker re-parented",
            lambda: (e := self.entry()) is not None and e.status is Status.RUNNING
            and len(self.adopted_events()) > before,
            10, self.diagnose, step=STEP_S,
        )  # fmt: skip
        time.sleep(0.1)  # a second grant landing late would show in the entry now
        self.judge(said, contenders, decisions, exact)
        self.foreign = [c for c in contenders if c.popen.poll() is None][:2]
        while len(self.foreign) < 2:
            self.foreign.append(self.contender(f"foreign-{n}-{len(self.foreign)}"))

    def judge(
        self, said: str, contenders: list[Contender], decisions: dict[str, list[Any]], exact: Contender
    ) -> None:

        def bad(rule: str, what: str) -> None:
            self.broken.append((rule, f"{said}: {what}"))

        now = self.entry()
        assert now is not None
        by_pid = {c.popen.pid: c for c in contenders}
        winner = by_pid.get(now.parent_pid or -1)
        if winner is None or winner.identity is None or now.parent_proc_start != winner.identity.start_ticks:
            bad("the entry names a contender", f"its parent pid {now.parent_pid} is none of them")
            winner = None
        watched = self.adopted_events()[-1]["parent_pid"]
        if watched != now.parent_pid:
            bad("the host watches its entry's parent", f"watches {watched}, entry names {now.parent_pid}")
        for c in contenders:
            mine = decisions[c.session]
            actions = [d["action"] for d in mine]
            if c is winner:
                if len(actions) != 1 or actions[0] not in WON:
                    bad("the winner says it won", f"the winner {c.session} said {actions}")
            elif not mine:
                if c is not exact:  # only an exact master's own scan can come after the adoption
                    bad("every loser is told", f"foreign {c.session} decided nothing")
            elif actions != ["refused"] or f"pid {winner and winner.popen.pid} " not in mine[0]["detail"]:
                told = [(d["action"], d["detail"]) for d in mine]
                bad("every loser is told", f"{c.session} was told {told}, winner {winner and winner.session}")
        # The parent the entry names dies: the worker must wind down within a poll. A host that
        # watches another parent keeps running; killing that one is what winds it down.
        killed = [c for c in (winner, by_pid.get(watched)) if c is not None]
        killed[0].kill()
        if not poll(self.resumable_under(now.parent_pid), WIND_DOWN_S, step=STEP_S):
            bad("the recorded parent's death winds down", f"killing pid {now.parent_pid} wound nothing down")
            for c in killed[1:]:
                c.kill()
            down = self.resumable_under(now.parent_pid)
            wait_for(f"{said}: resumable at last", down, WIND_DOWN_S, self.diagnose, step=STEP_S)


def test_one_adoption_grant_wins_the_losers_are_told_and_the_host_watches_its_entrys_parent(
    reaper: Reaper, store: MatrixStore, tmp_path: Path
) -> None:
    race = Race(reaper, store, tmp_path)
    first = race.contender("boss")
    race.start_worker(first)
    race.foreign = [race.contender("foreign1"), race.contender("foreign2")]
    first.kill()  # the worker winds down to resumable: the first orphan
    wait_for(
        "the first wind-down", race.resumable_under(first.popen.pid), WIND_DOWN_S, race.diagnose, step=STEP_S
    )
    for n in range(1, ROUNDS + 1):
        race.run(n)
    assert not race.broken, verdict(race.broken)


def verdict(broken: list[tuple[str, str]]) -> str:
    """How many rounds broke each rule, then every violation."""
    rounds: dict[str, set[str]] = {}
    for rule, what in broken:
        rounds.setdefault(rule, set()).add(what.partition(":")[0])
    counts = "; ".join(f"{rule}: broken in {len(r)} of {ROUNDS} rounds" for rule, r in rounds.items())
    return counts + "\n" + "\n".join(what for _, what in broken)
