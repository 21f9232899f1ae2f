"""What an idle host does at each of its timers, kept small (issue 30.9: a hundred idle hosts at
default settings within 1 % of a core).

A worker host's poll of its parent reads the parent's master entry by its key, not the whole
state dir: with a hundred agents each host's listing every ``watcherPollMs`` was most of the
fleet's idle CPU. The whole listing stays the way to find a master whose key changed (a session
switch re-keys it under the same process). A heartbeat fsyncs its entry's file but not the state
dir (half a beat's fsyncs).

A real registered, heartbeating parent process; the store's ``list`` and ``os.fsync`` are
observed (our own seams).
"""

from __future__ import annotations

import io
import itertools
import os
import stat
import sys
import threading
import time
from typing import Any, cast

import attrs
import pytest
from helpers import Reaper, make_identity, spawn_registered_parent

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import AgentIdentityContract, Mode, ProcessIdentity, Role
from pi_tmux_matrix.launch_contract import LaunchContract
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.mailbox import Inbox
from pi_tmux_matrix.matrix.model import Entry
from pi_tmux_matrix.matrix.store import ListResult, MatrixStore, now_ms
from pi_tmux_matrix.settings import MatrixSettings
from pi_tmux_matrix.supervise.host import AgentHost, HostHooks
from pi_tmux_matrix.supervise.hostspec import HostSpec
from pi_tmux_matrix.supervise.record import OwnRecord
from pi_tmux_matrix.supervise.worker import ParentState, WorkerSide


class CountingStore(MatrixStore):
    """The matrix store, counting its whole-directory listings."""

    listings = 0

    def list(self, *args: Any, **kwargs: Any) -> ListResult:
        self.listings += 1
        return super().list(*args, **kwargs)


class Agent:
    def steer(self, text: str, *, notice: bool = False) -> None:
        pass


@pytest.fixture
def store(tmp_path: Any) -> CountingStore:
    return CountingStore(tmp_path / "state")


def _side(store: MatrixStore, parent: ProcessIdentity, session: str) -> WorkerSide:
    me = procs.current()
    entry = lifecycle.new_entry(
        role=Role.WORKER,
        identity=make_identity("w1"),
        process=me,
        now=now_ms(),
        parent=parent,
        parent_session_id=session,
    )
    registered = store.register(entry)
    record = OwnRecord(store, registered.key, registered.registration, registered)
    return WorkerSide(record, cast(Any, Agent()), Role.WORKER, me, 5.0, beat_window_s=30.0, parent=parent)


def _parent(reaper: Reaper, store: MatrixStore, session: str) -> ProcessIdentity:
    # Beating rarely: a test that moves its entry away must not see it end on a failed beat.
    popen = reaper.popen(spawn_registered_parent(store.root, session, beat_s=600))
    identity = procs.identify(popen.pid)
    assert identity is not None
    return identity


def _rekeyed(store: MatrixStore, old_session: str, new_session: str) -> Entry:
    """The master's entry again under another session's key, same process (a session switch's
    new registration); the old entry is left as it is."""
    old = store.get(f"master-{old_session}")
    identity = attrs.evolve(old.identity, session_id=new_session)
    return store.register(attrs.evolve(old, key=f"master-{new_session}", identity=identity))


def _crowd(store: MatrixStore, n: int) -> None:
    """Other agents' entries: what a listing would read."""
    for i in range(n):
        store.register(
            lifecycle.new_entry(
                role=Role.WORKER,
                identity=make_identity(f"other{i}"),
                process=ProcessIdentity(10_000 + i, 1, "b"),
                now=now_ms(),
            )
        )


def test_the_parent_poll_reads_the_masters_entry_by_key_and_lists_nothing(
    reaper: Reaper, store: CountingStore
) -> None:
    parent = _parent(reaper, store, "boss")
    _crowd(store, 20)
    side = _side(store, parent, "boss")
    store.listings = 0
    for _ in range(3):
        assert side.look() is ParentState.ALIVE
    assert store.listings == 0, "each poll read the whole state dir"


def test_a_master_re_keyed_by_a_session_switch_is_still_found_by_its_process(
    reaper: Reaper, store: CountingStore
) -> None:
    parent = _parent(reaper, store, "boss")
    side = _side(store, parent, "boss")
    # The master switched session: its entry is now under another key, same process. The old
    # key is gone; the worker's entry still names the old session.
    _rekeyed(store, "boss", "boss2")
    store.delete("master-boss", store.get("master-boss").generation)
    store.listings = 0
    assert side.look() is ParentState.ALIVE
    assert store.listings == 1  # the fallback


def test_a_parent_that_is_no_registered_master_is_still_lost(reaper: Reaper, store: CountingStore) -> None:
    parent = _parent(reaper, store, "boss")
    side = _side(store, parent, "boss")
    store.delete("master-boss", store.get("master-boss").generation)
    # Confirmed on a second look (a session switch closes the old entry just before the new).
    assert [side.look(), side.look()] == [ParentState.ALIVE, ParentState.UNREGISTERED]


def test_a_heartbeat_fsyncs_its_entry_file_and_not_the_state_dir(
    reaper: Reaper, store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash leaves the beat or the version before it, whole; a durable write still fsyncs both."""
    parent = _parent(reaper, store, "boss")
    side = _side(store, parent, "boss")
    seen: list[tuple[str, bool]] = []
    real = os.fsync

    def observed(fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        seen.append((name, stat.S_ISDIR(os.fstat(fd).st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", observed)
    side.record.write(lambda e: lifecycle.heartbeat(e, now_ms()), durable=False)
    assert seen == [(".worker-w1.json.tmp", False)], seen
    seen.clear()
    side.record.write(lambda e: lifecycle.heartbeat(e, now_ms()))
    assert seen == [(".worker-w1.json.tmp", False), ("state", True)], seen
    entry = store.get("worker-w1")
    assert entry.heartbeat_at is not None


def test_a_stale_entry_under_the_parents_key_does_not_hang_a_master_that_beats_under_another(
    reaper: Reaper, store: CountingStore
) -> None:
    """A session switch whose close of the old entry failed leaves it RUNNING with a beat that
    stands still, while the master beats under its new key: the key's stale beat sends the poll
    to the listing, which judges by the freshest entry, and keeps it there. A parent whose every
    entry stands still is still found hung."""
    parent = _parent(reaper, store, "boss")  # its own beat: every 600 s, so it stands still here
    me = procs.current()
    side = WorkerSide(
        _side(store, parent, "boss").record, cast(Any, Agent()), Role.WORKER, me, 5.0, beat_window_s=0.3,
        parent=parent,
    )  # fmt: skip
    _rekeyed(store, "boss", "boss2")
    assert side.look() is ParentState.ALIVE
    deadline = time.monotonic() + 1.5  # five windows
    while time.monotonic() < deadline:
        store.update("master-boss2", lambda e: lifecycle.heartbeat(e, now_ms()))
        assert side.look() is ParentState.ALIVE
        time.sleep(0.05)
    # Now nothing beats: found hung within a few windows (one to notice, one to judge).
    deadline = time.monotonic() + 3
    while side.look() is ParentState.ALIVE:
        assert time.monotonic() < deadline, "a master whose every entry stands still was never found hung"
        time.sleep(0.05)
    assert side.look() is ParentState.HUNG


# --- the loop's wakes: one per poll, and nothing else woken by it ---------------------------------
def test_an_idle_hosts_loop_wakes_once_per_poll_and_its_beat_rides_that_wake(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's own loop, in-process, over a sleeping child: a beat due before the next poll is
    written at the poll's wake (early, never late), so the loop wakes once per poll and never
    for a beat alone; and the poll's look at an empty inbox tells the hooks nothing (a host's
    round thread, poked by ``on_wake``, sleeps on)."""
    store = MatrixStore(tmp_path / "state")
    settings = MatrixSettings(watcher_poll_ms=1000, heartbeat_ms=1900)
    spec = HostSpec(
        argv=(sys.executable, "-c", "import time; time.sleep(60)"),
        identity=AgentIdentityContract(agent_id="a-s1", session_id="s1", cwd=str(tmp_path)),
        contract=LaunchContract(), mode=Mode.PRINT, role=Role.MASTER, stop_grace_s=0.2, deadline_s=60,
    )  # fmt: skip
    woken: list[float] = []
    host = AgentHost(
        spec, store, settings, hooks=HostHooks(on_wake=lambda _h: woken.append(time.monotonic())),
        out=io.StringIO(), err=io.StringIO(),
    )  # fmt: skip
    turns: list[float] = []
    polls: list[float] = []
    beats: list[int] = []
    on_timers, poll = AgentHost._on_timers, WorkerSide.poll

    def turn(self: AgentHost, timers: Any) -> None:
        turns.append(time.monotonic())
        on_timers(self, timers)

    def polled(self: WorkerSide) -> None:
        polls.append(time.monotonic())
        poll(self)

    heartbeat = lifecycle.heartbeat

    def beat(entry: Entry, now: int) -> Entry:
        beats.append(now)
        return heartbeat(entry, now)

    monkeypatch.setattr(AgentHost, "_on_timers", turn)
    monkeypatch.setattr(WorkerSide, "poll", polled)
    monkeypatch.setattr(lifecycle, "heartbeat", beat)
    quiet: list[int] = []

    def stop_later() -> None:
        time.sleep(6.5)
        quiet.extend((len(turns), len(polls), len(woken)))
        Inbox(store, "master-s1").post("stop", "stop", sender="test")

    asking = threading.Thread(target=stop_later)
    asking.start()
    ran = host.run()  # the host's loop runs in the main thread (its signal wake-up fd)
    asking.join(30)
    quiet_turns, quiet_polls, quiet_wakes = quiet
    assert ran in (0, 143), ran  # stopped: its child ended by SIGTERM
    assert quiet_polls >= 3, (quiet_polls, turns)
    # main woke the loop for every beat between two polls as well (9 turns for 6 polls)
    assert quiet_turns <= quiet_polls + 1, (quiet_turns, quiet_polls)
    assert len(beats) >= quiet_polls - 1  # beats still come (one per poll here: early, not late)
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert all(gap <= 1900 + 500 for gap in gaps), gaps
    assert quiet_wakes == 1, woken  # the loop's first look only: the polls found no mail
    assert len(woken) >= 2  # the stop's mail did tell the hooks
