"""Builders shared by the tests (real entries, real processes)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import AgentIdentityContract, Role
from pi_tmux_matrix.matrix.codec import encode_entry
from pi_tmux_matrix.matrix.model import Entry, Handoff, Outcome, Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

if TYPE_CHECKING:
    from pi_tmux_matrix.dispatch.model import Job
    from pi_tmux_matrix.dispatch.watch import InHost


def make_identity(session: str = "s1", **changes: Any) -> AgentIdentityContract:
    fields: dict[str, Any] = {"agent_id": f"agent-{session}", "session_id": session}
    fields.update(changes)
    return AgentIdentityContract(**fields)


def make_entry(
    session: str = "s1",
    *,
    role: Role = Role.WORKER,
    status: Status = Status.RUNNING,
    identity: AgentIdentityContract | None = None,
    process: procs.ProcessIdentity | None = None,
    **changes: Any,
) -> Entry:
    identity = identity or make_identity(session)
    now = now_ms()
    fields: dict[str, Any] = {
        "key": identity.key(role),
        "role": role,
        "status": status,
        "identity": identity,
        "created_at": now,
        "updated_at": now,
    }
    if process is not None:
        fields.update(pid=process.pid, proc_start=process.start_ticks, boot_id=process.boot_id)
    fields.update(changes)
    return Entry(**fields)


def spawn_sleeper(seconds: float = 60) -> subprocess.Popen[bytes]:
    """A real child process the test owns (killed by pid in the test's cleanup)."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        stdin=subprocess.DEVNULL,
    )


# A registered master and nothing more: it registers, then beats every BEAT seconds until killed.
_REGISTERED_PARENT = """
import sys, time
from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import AgentIdentityContract, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
store, session, beat_s = MatrixStore(sys.argv[1]), sys.argv[2], float(sys.argv[3])
identity = AgentIdentityContract(agent_id="parent-" + session, session_id=session)
entry = store.register(
    lifecycle.new_entry(role=Role.MASTER, identity=identity, process=procs.current(), now=now_ms())
)
print("registered", flush=True)
while True:
    time.sleep(beat_s)
    store.update(entry.key, lambda e: lifecycle.heartbeat(e, now_ms()), registration=entry.registration)
"""


def spawn_registered_parent(
    state_dir: str | Path, session: str, beat_s: float = 1.0
) -> subprocess.Popen[bytes]:
    """A real process registered as a running master of ``session`` that heartbeats like one and
    does nothing else (no activation, no handoff delivery): the parent a worker host needs (a
    parent that is not a beating master counts as lost), for tests of the host itself. Returns
    once it is registered; the test kills it by pid."""
    popen = subprocess.Popen(
        [sys.executable, "-c", _REGISTERED_PARENT, str(state_dir), session, str(beat_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert popen.stdout is not None
    line = popen.stdout.readline()
    popen.stdout.close()
    if line != b"registered\n":
        popen.kill()
        popen.wait()
        raise AssertionError(f"the registered parent did not start: {line!r}")
    return popen


def dead_identity() -> procs.ProcessIdentity:
    """The identity of a real process that has exited (and been reaped)."""
    child = subprocess.Popen(["true"], stdin=subprocess.DEVNULL)
    identity = procs.identify(child.pid)
    child.wait()
    assert identity is not None
    assert not procs.is_alive(identity)
    return identity


def kill_now(*identities: procs.ProcessIdentity | None) -> None:
    """SIGKILL each process (by identity) and see it gone."""
    for ident in identities:
        if ident is not None:
            procs.send_signal(ident, signal.SIGKILL)
            assert procs.wait_for_exit(ident, 5), f"pid {ident.pid} outlived SIGKILL"


def fifo_writer(fifo: Path) -> subprocess.Popen[bytes]:
    """A pane pipe's writer (``sh -c 'exec cat >FIFO'``, as tmux's pipe-pane runs it) blocked in
    opening ``fifo``: returned once the kernel says it waits there for a reader (its wchan). Not
    yet there, a removal of the FIFO would race its open, which then makes a regular file."""
    from waiting import wait_for

    writer = subprocess.Popen(["sh", "-c", 'exec cat >"$1"', "sh", str(fifo)], stdin=subprocess.DEVNULL)

    def blocked() -> bool:
        try:
            return Path(f"/proc/{writer.pid}/wchan").read_text() == "wait_for_partner"
        except OSError:
            return False

    wait_for(f"pid {writer.pid} blocked in opening {fifo.name}", blocked, timeout=20)
    return writer


def end_popens(*popens: subprocess.Popen[bytes] | None) -> None:
    """Kill each process the test started that still runs, and reap it."""
    for popen in popens:
        if popen is not None and popen.poll() is None:
            popen.kill()
            popen.wait()


def dir_digest(root: str) -> dict[str, tuple[int, int, int, str]]:
    """Every name under ``root`` (not following links) with type, mode, size, content hash."""
    import hashlib
    import stat

    out: dict[str, tuple[int, int, int, str]] = {}
    for base, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            digest = ""
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                digest = os.readlink(path)
            out[os.path.relpath(path, root)] = (
                stat.S_IFMT(info.st_mode),
                stat.S_IMODE(info.st_mode),
                info.st_size,
                digest,
            )
    return out


def read_events(state: Path, key: str, name: str | None = None) -> list[dict[str, Any]]:
    """The events a host logged for ``key`` under the matrix root ``state`` (only ``name`` ones if
    given). Only whole lines count: tests poll this while the host appends."""
    try:
        text = (state / "events" / f"{key}.jsonl").read_text()
    except FileNotFoundError:
        return []
    events = [json.loads(line) for line in text.rpartition("\n")[0].splitlines() if line.strip()]
    return [e for e in events if name is None or e.get("event") == name]


def job_on_host(store: Any, cwd: Path, host: Any, session: str) -> Any:
    """A one-agent subprocess job whose agent ``worker-<session>`` has ``host`` (a
    ``ProcessIdentity``) as its recorded host, written to the store's jobs."""
    from pi_tmux_matrix.dispatch.jobs import JobStore, new_job_id, new_nonce
    from pi_tmux_matrix.dispatch.model import SUBPROCESS, Job, JobAgent
    from pi_tmux_matrix.matrix.store import now_ms

    agent = JobAgent(
        agent_id="a1", key=f"worker-{session}", session_id=session, profile="stand-in", provider="pi",
        mode="print", cwd=str(cwd), backend=SUBPROCESS, nonce=new_nonce(), round=1,
        deadline_at=now_ms() + 600_000, deadline_s=600.0, target=f"pid {host.pid}", host_pid=host.pid,
        host_start=host.start_ticks, boot_id=host.boot_id,
    )  # fmt: skip
    job = Job(
        id=new_job_id(), created_at=now_ms(), parent_pid=os.getpid(), parent_session_id="boss", task="t",
        profile="stand-in", team=None, agents=(agent,), backend=SUBPROCESS,
    )  # fmt: skip
    return JobStore(store).create(job)


def plant_job(store: MatrixStore, job_id: str, tmp_path: Path) -> Job:
    """A one-agent subprocess job ``job_id`` (agent ``worker-j1``, no host) in the store's jobs."""
    from pi_tmux_matrix.dispatch.jobs import JobStore, new_nonce
    from pi_tmux_matrix.dispatch.model import SUBPROCESS, Job, JobAgent

    agent = JobAgent(
        agent_id="a1", key="worker-j1", session_id="j1", profile="stand-in", provider="pi", mode="print",
        cwd=str(tmp_path), backend=SUBPROCESS, nonce=new_nonce(), round=1, deadline_at=now_ms() + 600_000,
        deadline_s=600.0,
    )  # fmt: skip
    job = Job(
        id=job_id, created_at=now_ms(), parent_pid=os.getpid(), parent_session_id="boss", task="t",
        profile="stand-in", team=None, agents=(agent,), backend=SUBPROCESS,
    )  # fmt: skip
    return JobStore(store).create(job)


@contextmanager
def in_host(stop: Callable[[], None] = lambda: None, **changes: Any) -> Iterator[InHost]:
    """What a round needs of the host it runs in, as the round thread hands it over: this process
    as the host, and its two pipes (the agent ended; the host took mail), closed at the end."""
    from pi_tmux_matrix.dispatch.watch import InHost

    done, wake = os.pipe(), os.pipe()
    try:
        yield InHost(os.getpid(), done[0], wake[0], stop, **changes)
    finally:
        for fd in (*done, *wake):
            os.close(fd)


def plant_hostile_files(root: Path, outside: Path) -> None:
    """Beside a matrix's entries: a truncated entry, junk, a FIFO, a folder, a symlink out (to
    ``outside``), another key's entry, a 100 MiB sparse file and names that are no entry's."""
    (root / "worker-trunc.json").write_bytes(encode_entry(make_entry("trunc"))[:40])
    (root / "worker-junk.json").write_bytes(os.urandom(512))
    os.mkfifo(root / "worker-fifo.json")
    (root / "worker-dir.json").mkdir()
    target = outside / "secret.json"
    target.write_bytes(encode_entry(make_entry("link")))
    (root / "worker-link.json").symlink_to(target)
    (root / "worker-other.json").write_bytes(encode_entry(make_entry("someone-else")))
    with open(root / "worker-big.json", "wb") as handle:
        handle.truncate(100 * 1024 * 1024)
    (root / "notes.txt").write_text("hello")
    (root / "bad name.json").write_text("{}")


def sample_document() -> dict[str, Any]:
    """An entry's JSON document with every kind of part (a handoff, pointers, a process)."""
    handoff = Handoff(id="h1", generation="g-1", parent_session_id="m1", outcome=Outcome.EXITED, created_at=1)
    entry = make_entry(
        "s1",
        identity=make_identity("s1", session_file="/s/s1.jsonl", cwd="/w", resource_pointers=["/r"]),
        pid=10,
        proc_start=5,
        boot_id="b",
        handoffs=[handoff],
    )
    document: dict[str, Any] = json.loads(encode_entry(entry))
    return document


def run_main(*args: str) -> tuple[int, str, str]:
    """``pi-matrix ARGS`` run in this process: (exit code, stdout, stderr)."""
    from pi_tmux_matrix.cli import main
    from pi_tmux_matrix.cli.app import Io

    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), io=Io(out, err, width=200))
    return code, out.getvalue(), err.getvalue()


def cli_at(
    state: Path, *words: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """``pi-matrix --state-dir STATE WORDS`` in a process of its own, its output captured; ``env`` is
    its whole environment (this process's by default), ``popen`` more of ``subprocess.run`` (``cwd``)."""
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), *words],
        capture_output=True, text=True, env=env, timeout=90, check=False, **popen,
    )  # fmt: skip


class Reaper:
    """Every process a test starts, killed by pid (identity-checked) at teardown."""

    def __init__(self, beat_s: float = 1.0) -> None:
        self.beat_s = beat_s  # a registered parent's heartbeat (the lower bound of heartbeatMs)
        self.popens: list[subprocess.Popen[Any]] = []
        self.identities: list[procs.ProcessIdentity] = []

    def popen(self, popen: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        self.popens.append(popen)
        return popen

    def identity(self, identity: procs.ProcessIdentity) -> procs.ProcessIdentity:
        self.identities.append(identity)
        return identity

    def logged(
        self, cmd: list[str], log: Path, *, cwd: Path, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        """``cmd`` in a session of its own, its output to ``log``, reaped at teardown."""
        with open(log, "wb") as output:
            return self.popen(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                )
            )

    def sleeper(self) -> subprocess.Popen[bytes]:
        """A live process that is no master (a process the test can kill)."""
        popen = spawn_sleeper(120)
        self.popen(popen)
        return popen

    def parent(self, store: MatrixStore, session: str) -> subprocess.Popen[bytes]:
        """A live parent session: a process registered as a running master of ``session`` that
        heartbeats (a worker counts any other parent lost), which the test can kill or stop."""
        return self.popen(spawn_registered_parent(store.root, session, self.beat_s))

    def cleanup(self) -> None:
        for identity in reversed(self.identities):
            # Only ever the very process recorded (pidfd + start time), never a reused pid.
            procs.send_signal(identity, signal.SIGKILL)
        for popen in reversed(self.popens):
            if popen.poll() is None:
                os.kill(popen.pid, signal.SIGCONT)  # a test may have stopped it
                popen.kill()
            popen.wait(timeout=30)
        for identity in self.identities:
            procs.wait_for_exit(identity, timeout=10)


def stop_outside_its_lock(store: MatrixStore, identity: procs.ProcessIdentity) -> None:
    """SIGSTOP ``identity`` (a host or a master), never inside the lock of an entry it writes:
    stopped in a heartbeat, it would make every other writer of that entry (a takeover, an
    activation) wait out the lock's timeout and fail. The test takes those locks around the
    stop, so the process stops outside them, or waiting for one, which it then never takes."""
    from contextlib import ExitStack, suppress

    from pi_tmux_matrix.errors import PiMatrixError

    keys: list[str] = []
    with suppress(PiMatrixError):
        keys = [e.key for e in store.list().entries if e.process == identity]
    with ExitStack() as locks:
        for key in keys:
            locks.enter_context(store.hold(f"{key}.lock", f"{key}: lock still held", "this entry"))
        assert procs.send_signal(identity, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while procs.process_state(identity.pid) != "T":
            assert time.monotonic() < deadline, f"pid {identity.pid} did not stop"
            time.sleep(0.01)


def loaded(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[dict[str, int], subprocess.CompletedProcess[str]]:
    """The modules ``pi-matrix ARGV`` imports, with their cumulative import time (µs), and the run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pi_tmux_matrix", *argv],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    found: dict[str, int] = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _self, cumulative, name = line.removeprefix("import time:").split("|")
            if cumulative.strip().isdigit():
                found[name.strip()] = int(cumulative)
    return found, done
