"""Issue 19, N workers ending at once: a master marks pi's taken handoffs delivered without
holding back the posting of the others. Under a burst of workers' own durable writes one mark
can wait hundreds of ms on the disk (benchmarks/bench_handoff.py); here it waits on its entry's
lock, held by another process, which is the same wait made certain."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import make_entry
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Entry, ExitKind, ExitRecord, Handoff
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.supervise.master import Master

HOLD_S = 3.0
HOLDER = """import sys, time
from pi_tmux_matrix.matrix.store import MatrixStore
with MatrixStore(sys.argv[1]).locked(sys.argv[2]):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def ended_worker(store: MatrixStore, session: str) -> Entry:
    entry = store.create(make_entry(session, parent_session_id="boss"))
    end = ExitRecord(kind=ExitKind.EXITED, at=now_ms(), code=0)
    return store.update(entry.key, lambda e: lifecycle.record_terminal(e, end, now_ms(), summary="ok"))


def test_a_mark_waiting_on_its_entry_does_not_hold_back_the_next_handoffs_posting(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    taken, waiting = ended_worker(store, "a"), ended_worker(store, "b")
    posted: list[str] = []

    def deliver(entry: Entry, handoff: Handoff) -> bool:
        if entry.key == taken.key:
            return True  # pi took this one: it may be marked delivered now
        posted.append(handoff.id)  # this one is posted to pi, which has not taken it yet
        return False

    with ThreadPoolExecutor(2) as acks:
        master = Master(store, "boss", procs.current(), lambda *_: 0, deliver=deliver, acks=acks)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(store.root), taken.key, str(HOLD_S)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            started = time.monotonic()
            delivered = master.deliver_handoffs([taken.key, waiting.key])
            took = time.monotonic() - started
            assert [key for key, _ in delivered] == [taken.key]
            assert posted == [h.id for h in waiting.undelivered]
            assert took < HOLD_S / 2, f"the posting waited {took:.2f} s on the other entry's mark"
            assert store.get(taken.key).undelivered  # not marked while its lock is held
            master.deliver_handoffs([taken.key])  # seen again meanwhile: one mark queued, not two
        finally:
            holder.wait(30)
        wait_for("the mark", lambda: not store.get(taken.key).undelivered, timeout=HOLD_S + 10)
    assert store.get(waiting.key).undelivered  # never taken: never marked
    assert not master.deliver_handoffs([taken.key])  # delivered once, never again
