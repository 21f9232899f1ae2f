"""Compare-and-swap under real contention: N processes, each process's exit code is its verdict.

Every test here runs real OS processes (``multiprocessing`` with the ``fork`` start method, so a
child starts in milliseconds and also exercises the store's at-fork token reset) against a real
state dir. Nothing is mocked. A child reports its counts in a JSON result file and exits 0 only
if its own checks passed; the parent then checks the global invariants.

The counter is ``Entry.heartbeat_at``: an integer field the store never stamps or validates
(``_stamp`` touches only ``generation``, ``registration`` and ``updated_at``), so whatever value
is on disk was put there by an acknowledged write of ours.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import dir_digest, make_entry

from pi_tmux_matrix.errors import Conflict, EntryExists, NotFound
from pi_tmux_matrix.matrix.model import Entry
from pi_tmux_matrix.matrix.store import MatrixStore

# fork: children start fast on a 2-core box and inherit the parent's imports.
CTX = multiprocessing.get_context("fork")
LOCK_TIMEOUT = 30.0
PROCS = 8
CYCLES = 500
JOIN_TIMEOUT = 120.0  # far above the expected seconds; a hung child fails instead of hanging


# --- child-side plumbing ---------------------------------------------------------------------
def _child(
    result_path: str, body: Callable[[], dict[str, Any]], barrier: Any, lock_wait: str
) -> None:
    """Run ``body`` in a child; write its report; exit 0 only if it reported ``ok``."""
    # The store waits for a lock in the kernel's flock queue (bounded by a one-shot SIGALRM)
    # unless SIGALRM is taken, then it polls. The fork inherited pytest-timeout's handler, so
    # choose explicitly: "queue" is what a pi-matrix process does, "poll" the fallback.
    if lock_wait == "queue":
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    else:
        signal.signal(signal.SIGALRM, lambda _sig, _frame: None)
    try:
        report = body()
    except Exception:  # noqa: BLE001 - a child must always leave a verdict, whatever went wrong
        report = {"ok": False, "error": traceback.format_exc()}
        if barrier is not None:
            barrier.abort()  # the others fail fast instead of waiting out the barrier timeout
    Path(result_path).write_text(json.dumps(report))
    sys.exit(0 if report.get("ok") else 3)


def _counter(entry: Entry) -> int:
    assert entry.heartbeat_at is not None
    return entry.heartbeat_at


def _hammer(
    root: str, key: str, cycles: int, barrier: Any, deadline: float
) -> dict[str, Any]:
    """get -> replace(observed token, counter + 1), retrying on Conflict, until ``cycles`` acks."""
    store = MatrixStore(root, lock_timeout=LOCK_TIMEOUT)
    acked: list[int] = []
    tokens: list[str] = []
    conflicts = 0
    bogus_conflicts = 0  # a Conflict whose token on disk is the one we sent: never legitimate
    barrier.wait(timeout=30)
    while len(acked) < cycles and time.monotonic() < deadline:
        current = store.get(key)
        wanted = attrs.evolve(current, heartbeat_at=_counter(current) + 1)
        try:
            written = store.replace(key, current.generation, wanted)
        except Conflict as exc:
            conflicts += 1
            if exc.found == current.generation:
                bogus_conflicts += 1
            continue
        acked.append(_counter(written))
        tokens.append(written.generation)
    return {
        "ok": len(acked) == cycles and bogus_conflicts == 0,
        "acked": acked,
        "tokens": tokens,
        "conflicts": conflicts,
        "bogus_conflicts": bogus_conflicts,
    }


def _run(
    tmp_path: Path,
    targets: Iterable[Callable[[], dict[str, Any]]],
    barrier: Any = None,
    lock_wait: str = "queue",
) -> list[dict[str, Any]]:
    """Start one process per target, wait for all, return their reports (killing stragglers)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[Any, Path]] = []
    try:
        for index, body in enumerate(targets):
            result = tmp_path / f"result-{index}.json"
            proc = CTX.Process(target=_child, args=(str(result), body, barrier, lock_wait))
            proc.start()
            procs.append((proc, result))
        deadline = time.monotonic() + JOIN_TIMEOUT
        for proc, _ in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc, _ in procs:
            if proc.is_alive():
                proc.kill()  # SIGKILL to this child's own pid
                proc.join()
    reports = []
    failures = []
    for index, (proc, result) in enumerate(procs):
        report = json.loads(result.read_text()) if result.exists() else {"ok": False}
        if proc.exitcode != 0:
            shown = report.get("error") or {
                k: v for k, v in report.items() if k not in ("acked", "tokens")
            }
            failures.append(f"process {index} (pid {proc.pid}) exit code {proc.exitcode}: {shown}")
        reports.append(report)
    # The first cause first: a process that merely saw the barrier broken is a consequence.
    failures.sort(key=lambda text: "BrokenBarrierError" in text)
    assert not failures, "\n".join(failures)
    return reports


# --- hammer ----------------------------------------------------------------------------------
@pytest.mark.parametrize("lock_wait", ["queue", "poll"])
def test_hammer_eight_processes_one_entry(
    store: MatrixStore, tmp_path: Path, lock_wait: str
) -> None:
    created = store.create(make_entry("hammer", heartbeat_at=0))
    key = created.key
    barrier = CTX.Barrier(PROCS)
    deadline = time.monotonic() + JOIN_TIMEOUT - 10
    root = str(store.root)

    started = time.monotonic()
    reports = _run(
        tmp_path,
        [lambda: _hammer(root, key, CYCLES, barrier, deadline) for _ in range(PROCS)],
        barrier,
        lock_wait,
    )
    elapsed = time.monotonic() - started

    total = PROCS * CYCLES
    final = store.get(key)
    acked = sorted(v for r in reports for v in r["acked"])
    tokens = [t for r in reports for t in r["tokens"]]
    conflicts = [r["conflicts"] for r in reports]
    # Every process made progress: each acknowledged all its cycles (the child's verdict).
    assert [len(r["acked"]) for r in reports] == [CYCLES] * PROCS
    # Final value = acknowledged count, and each value 1..total was acknowledged exactly once:
    # two writers succeeding from the same observed version would duplicate a value.
    assert _counter(final) == total, f"final {_counter(final)} != {total} acks; conflicts {conflicts}"
    assert acked == list(range(1, total + 1))
    # Every acknowledged write minted a token nobody else minted; the last one is on disk.
    assert len(set(tokens)) == total
    assert final.generation == tokens[[v for r in reports for v in r["acked"]].index(total)]
    # Stale tokens were rejected (the writers raced, so conflicts must have happened at all).
    assert sum(conflicts) > 0
    assert store.list().problems == ()
    print(
        f"hammer 1 entry ({lock_wait}): {total} acks in {elapsed:.1f}s, "
        f"conflicts per process {conflicts}"
    )


def test_hammer_eight_processes_eight_entries(store: MatrixStore, tmp_path: Path) -> None:
    keys = [store.create(make_entry(f"hammer{i}", heartbeat_at=0)).key for i in range(PROCS)]
    barrier = CTX.Barrier(PROCS)
    deadline = time.monotonic() + JOIN_TIMEOUT - 10
    root = str(store.root)

    started = time.monotonic()
    reports = _run(
        tmp_path,
        [
            (lambda key=key: _hammer(root, key, CYCLES, barrier, deadline))  # type: ignore[misc]
            for key in keys
        ],
        barrier,
    )
    elapsed = time.monotonic() - started

    for key, report in zip(keys, reports, strict=True):
        assert _counter(store.get(key)) == CYCLES
        assert report["acked"] == list(range(1, CYCLES + 1))
        # One writer per entry: nobody else can have moved its token.
        assert report["conflicts"] == 0
    tokens = [t for r in reports for t in r["tokens"]]
    assert len(set(tokens)) == PROCS * CYCLES
    listing = store.list()
    assert listing.problems == ()
    assert sorted(e.key for e in listing.entries) == sorted(keys)
    print(f"hammer 8 entries: {PROCS * CYCLES} acks in {elapsed:.1f}s")


# --- stale CAS and ABA -------------------------------------------------------------------------
def test_stale_token_is_rejected_and_changes_nothing(store: MatrixStore, state_dir: Path) -> None:
    first = store.create(make_entry("stale", heartbeat_at=0))
    key = first.key
    second = store.replace(key, first.generation, attrs.evolve(first, heartbeat_at=1))
    path = state_dir / f"{key}.json"
    on_disk = path.read_bytes()
    inode = path.stat().st_ino
    everything = dir_digest(str(state_dir))

    called = []
    for stale in (first.generation, "never-issued-0", ""):
        with pytest.raises(Conflict) as info:
            store.replace(key, stale, attrs.evolve(first, heartbeat_at=99))
        assert info.value.found == second.generation
        with pytest.raises(Conflict):
            store.update(key, lambda e: called.append(e) or e, expected=stale)  # type: ignore[func-returns-value]
        with pytest.raises(Conflict):
            store.delete(key, stale)

    assert called == [], "update ran its change function despite a stale token"
    assert path.read_bytes() == on_disk
    assert path.stat().st_ino == inode, "the entry was rewritten (same bytes, new inode)"
    assert dir_digest(str(state_dir)) == everything, "a refused write left something behind"
    assert store.get(key) == second


def _create_in_child(root: str, entry: Entry) -> dict[str, Any]:
    created = MatrixStore(root, lock_timeout=LOCK_TIMEOUT).create(entry)
    return {"ok": True, "generation": created.generation, "registration": created.registration}


def test_recreated_entry_never_matches_an_old_token(store: MatrixStore, tmp_path: Path) -> None:
    # The same content every round, so only the token can tell incarnations apart.
    template = make_entry("aba", heartbeat_at=0, created_at=1, updated_at=1)
    key = template.key
    seen: list[str] = []
    registrations: list[str] = []
    for round_ in range(12):
        if round_ % 2:
            # Recreated by another process (forked: it must not reuse the parent's tokens).
            report = _run(tmp_path / f"r{round_}", [lambda: _create_in_child(str(store.root), template)])[0]
            token, registration = report["generation"], report["registration"]
        else:
            created = store.create(template)
            token, registration = created.generation, created.registration
        current = store.get(key)
        assert current.generation == token
        for old in seen:
            with pytest.raises(Conflict):
                store.replace(key, old, attrs.evolve(template, heartbeat_at=-1))
            with pytest.raises(Conflict):
                store.delete(key, old)
        assert store.get(key) == current, "a stale token from an earlier incarnation changed it"
        seen.append(token)
        registrations.append(registration)
        moved = store.replace(key, token, attrs.evolve(current, heartbeat_at=round_ + 1))
        seen.append(moved.generation)
        store.delete(key, moved.generation)
        with pytest.raises(NotFound):
            store.get(key)
    assert len(set(seen)) == len(seen), "a generation token was minted twice"
    assert len(set(registrations)) == len(registrations)


# --- races ------------------------------------------------------------------------------------
CREATE_ROUNDS = 12


def _creator(root: str, barrier: Any) -> dict[str, Any]:
    store = MatrixStore(root, lock_timeout=LOCK_TIMEOUT)
    outcomes: list[list[Any]] = []
    for round_ in range(CREATE_ROUNDS):
        entry = make_entry(f"race{round_}", pid=os.getpid())
        barrier.wait(timeout=30)
        try:
            created = store.create(entry)
        except EntryExists as exc:
            outcomes.append(["exists", exc.found])
        else:
            outcomes.append(["won", created.generation])
    return {"ok": True, "outcomes": outcomes}


def test_concurrent_create_exactly_one_wins(store: MatrixStore, tmp_path: Path) -> None:
    # The state dir does not exist yet: the first round also races its creation.
    assert not store.exists()
    barrier = CTX.Barrier(PROCS)
    root = str(store.root)
    reports = _run(tmp_path, [lambda: _creator(root, barrier) for _ in range(PROCS)], barrier)
    for round_ in range(CREATE_ROUNDS):
        outcomes = [r["outcomes"][round_] for r in reports]
        winners = [o[1] for o in outcomes if o[0] == "won"]
        assert len(winners) == 1, f"round {round_}: {len(winners)} winners: {outcomes}"
        on_disk = store.get(make_entry(f"race{round_}").key)
        assert on_disk.generation == winners[0]
        # Each loser saw the winner's entry (under the lock), not some half-made state.
        assert [o[1] for o in outcomes if o[0] == "exists"] == [winners[0]] * (PROCS - 1)
        winner_index = next(i for i, o in enumerate(outcomes) if o[0] == "won")
        assert on_disk.pid is not None
        assert reports[winner_index]["outcomes"][round_] == ["won", on_disk.generation]
    assert store.list().problems == ()


RACE_ROUNDS = 50


def _racer(root: str, keys: list[str], tokens: list[str], barrier: Any, op: str) -> dict[str, Any]:
    store = MatrixStore(root, lock_timeout=LOCK_TIMEOUT)
    outcomes: list[list[Any]] = []
    for key, token in zip(keys, tokens, strict=True):
        observed = store.get(key)  # both racers read the same version before the start line
        assert observed.generation == token
        barrier.wait(timeout=30)
        try:
            if op == "delete":
                store.delete(key, token)
                outcomes.append(["ok", None])
            else:
                written = store.replace(key, token, attrs.evolve(observed, heartbeat_at=1))
                outcomes.append(["ok", written.generation])
        except Conflict as exc:
            outcomes.append(["conflict", exc.found])
    return {"ok": True, "outcomes": outcomes}


def test_delete_racing_replace(store: MatrixStore, tmp_path: Path) -> None:
    created = [store.create(make_entry(f"dr{i}", heartbeat_at=0)) for i in range(RACE_ROUNDS)]
    keys = [e.key for e in created]
    tokens = [e.generation for e in created]
    barrier = CTX.Barrier(2)
    root = str(store.root)
    deleter, replacer = _run(
        tmp_path,
        [
            lambda: _racer(root, keys, tokens, barrier, "delete"),
            lambda: _racer(root, keys, tokens, barrier, "replace"),
        ],
        barrier,
    )
    wins = {"delete": 0, "replace": 0}
    for round_, key in enumerate(keys):
        deleted, replaced = deleter["outcomes"][round_], replacer["outcomes"][round_]
        assert sorted([deleted[0], replaced[0]]) == ["conflict", "ok"], (
            f"round {round_}: delete {deleted}, replace {replaced}"
        )
        found = store.find(key)
        if deleted[0] == "ok":
            wins["delete"] += 1
            assert found is None, f"round {round_}: delete won but the entry is still there"
            assert replaced[1] is None  # the replacer saw no entry
        else:
            wins["replace"] += 1
            assert found is not None, f"round {round_}: replace won but the entry is gone"
            assert found.generation == replaced[1]
            assert _counter(found) == 1
            assert deleted[1] == replaced[1]  # the deleter saw the replacer's version
    assert store.list().problems == ()
    print(f"delete vs replace over {RACE_ROUNDS} rounds: {wins}")
