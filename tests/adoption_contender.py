"""One contending master for ``tests/test_adoption_race.py`` (run as a program, never collected).

A real process that becomes a registered master of the matrix when told its session, beats like
one, and on command runs the real activation (``Master.activate``): an exact master recovers its
orphan at once, a foreign one asks its owner, and this owner answers ``y`` to "adopt ...?" only
when the test opens the gate. Talks in lines: the test writes commands on stdin, the contender
answers on stdout.

    register SESSION TASK_REF  -> "registered PID START"
    activate                   -> "asking" (foreign, at the owner's question; then waits for "go")
                                  then one JSON line: the activation's decisions
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from typing import Final, NoReturn

from pi_tmux_matrix import procs
from pi_tmux_matrix.errors import PiMatrixError, ResumeRefused
from pi_tmux_matrix.identity import AgentIdentityContract, ProcessIdentity, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Entry
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.supervise.master import Master

BEAT_S: Final = 0.5  # well inside a worker's 2 x heartbeatMs + watcherPollMs window
_said = threading.Lock()


def say(line: str) -> None:
    with _said:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def command() -> str:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the test is gone
    return line.strip()


class GatedOwner:
    """The owner at the terminal: "adopt ...?" is answered y the moment the test says go."""

    def ask(self, question: str) -> bool:
        if not question.rpartition("\n")[2].startswith("adopt "):
            return False
        say("asking")
        return command() == "go"


def no_relaunch(entry: Entry, parent: ProcessIdentity, parent_session: str) -> int:
    raise ResumeRefused(f"{entry.key}: the race test relaunches nothing")


def beat(store: MatrixStore, key: str, registration: str) -> NoReturn:
    while True:
        time.sleep(BEAT_S)
        with contextlib.suppress(PiMatrixError):  # a lock held long by a slow disk: beat again
            store.update(key, lambda e: lifecycle.heartbeat(e, now_ms()), registration=registration)


def main() -> None:
    store = MatrixStore(sys.argv[1])
    me = procs.current()
    verb, session, task_ref = command().split()
    assert verb == "register", verb
    identity = AgentIdentityContract(agent_id=f"contender-{session}", session_id=session)
    entry = store.register(lifecycle.new_entry(role=Role.MASTER, identity=identity, process=me, now=now_ms()))
    threading.Thread(target=beat, args=(store, entry.key, entry.registration), daemon=True).start()
    say(f"registered {me.pid} {me.start_ticks}")
    master = Master(
        store, session, me, relauncher=no_relaunch, task_ref=task_ref, prompter=GatedOwner()
    )  # fmt: skip
    while True:
        verb = command()
        assert verb == "activate", verb
        report = master.activate(reconcile_first=False)
        say(json.dumps([{"key": d.key, "action": d.action, "detail": d.detail} for d in report.orphans]))


if __name__ == "__main__":
    main()
