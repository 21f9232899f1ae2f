"""The house holds its shape: every import runs down the layers, no cycles, no printing below cli/.

Layers, each importing only from its own or lower ones (docs/architecture.md):

    errors, strictjson, safetext, bridge             (0: no project imports)
    identity, settings, procs, inotify               (1: the machine's facts)
    matrix/, contract, launch_contract, programs,
    pisession                                        (2: the record and the contract)
    supervise/ | dispatch/                           (3: side by side, never each other)
    recovery, rehost, fork/, plugin, pytest_plugin,
    retention                                        (4: what plugs the two together)
    cli/, testing/ and the package's own programs    (5: the programs)

Every import counts: module level, inside functions and under ``TYPE_CHECKING`` alike, because a
function-level import is still an arrow (and was how the old cycles hid). Below the programs,
nothing prints, exits, reads ``sys.argv`` or asks on stdin: library code raises typed errors and
the CLI decides what a person sees. And every signal goes through ``procs.send_signal``, which
checks the process's identity right before the send; every git command through ``gitcmd.run``,
which hardens it against repository-controlled execution (issue 28); every agent host starts
through a backend (``dispatch/backends.py``), so a backend listed there is never bypassed by
recovery or anything else (issue 32.1): a process or a tmux pane is started only by the modules
named in :data:`PROCESS_STARTERS` and :data:`PANE_MAKERS`, each for its stated reason.

And no public signature says ``Any`` (issue 32.9; a short allowlist names the few that must).

``violations`` takes the package folder, so it can be run against an older tree to show what it
catches (``python tests/test_layers.py PATH/pi_tmux_matrix``).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "pi_tmux_matrix"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

LAYERS: dict[str, int] = {
    "errors": 0, "strictjson": 0, "safetext": 0, "bridge": 0,
    "identity": 1, "settings": 1, "paths": 1, "procs": 1, "inotify": 1, "gitcmd": 1,
    "matrix": 2, "contract": 2, "launch_contract": 2, "programs": 2, "pisession": 2, "piversion": 2,
    "pitools": 2, "projecttrust": 2,
    "supervise": 3, "dispatch": 3,
    "recovery": 4, "rehost": 4, "fork": 4, "plugin": 4, "pytest_plugin": 4, "retention": 4,
    "cli": 5, "testing": 5, "__main__": 5, "": 5,
}  # fmt: skip
# Side by side at layer 3: neither may import the other.
APART = frozenset({("supervise", "dispatch"), ("dispatch", "supervise")})
# Programs: the only modules that may print, exit, read argv or stdin.
PROGRAMS = frozenset({"cli", "testing", "__main__"})
# The pure core: entries and liveness facts in, decisions out; no I/O, no other project modules.
PURE: dict[str, frozenset[str]] = {
    "matrix.model": frozenset({"errors", "identity"}),
    "matrix.lifecycle": frozenset({"errors", "identity", "matrix.model"}),
    "matrix.reconcile": frozenset({"identity", "matrix.model"}),
}
IO_MODULES = frozenset(
    {"os", "io", "subprocess", "shutil", "socket", "signal", "psutil", "tempfile", "pathlib"}
)


def modules(root: Path) -> dict[str, Path]:
    """Dotted name below the package (``""`` for the package itself) -> file."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, package: str, node: ast.ImportFrom, known: dict[str, Path]) -> Iterator[str]:
    """The project modules an ``ImportFrom`` names (``from .. import procs`` names ``procs``)."""
    if node.level:
        base = package.split(".") if package else []
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join([*base, *([node.module] if node.module else [])])
    elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
        target = (node.module or "")[len(PACKAGE) + 1 :]
    else:
        return
    for alias in node.names:
        sub = f"{target}.{alias.name}" if target else alias.name
        yield sub if sub in known else target


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(project module, line) for every import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for target in _resolve(name, package, node, known):
                yield target, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    yield alias.name[len(PACKAGE) + 1 :], node.lineno


def _top(name: str) -> str:
    return name.split(".", maxsplit=1)[0]


def _layer(name: str) -> int:
    return LAYERS[_top(name)]


def _io_imports(path: Path) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        for found in names:
            if found.split(".")[0] in IO_MODULES:
                yield found, node.lineno


def _program_calls(path: Path) -> Iterator[tuple[str, int]]:
    """print(), input(), exit()/quit(), sys.exit(), any use of sys.argv."""
    for node in ast.walk(ast.parse(path.read_text())):
        called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""
        if called in {"print", "input", "exit", "quit"}:
            yield f"{called}()", node.lineno
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and node.attr in {"exit", "argv"}
        ):
            yield f"sys.{node.attr}", node.lineno


def _signal_sends(path: Path) -> Iterator[tuple[str, int]]:
    """Signals sent other than through ``procs.send_signal`` (the one door: identity checked right
    before the send): ``os.kill``, ``os.killpg``, ``signal.pidfd_send_signal``, and a
    ``Popen.send_signal``/``terminate``/``kill`` (a pid that may have been reused)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        attr = node.func.attr
        # Popen's own methods: terminate() and kill() take no argument, send_signal() one.
        arity = len(node.args)
        popen = (attr in {"terminate", "kill"} and arity == 0) or (attr == "send_signal" and arity == 1)
        if (owner, attr) in {("os", "kill"), ("os", "killpg"), ("signal", "pidfd_send_signal")} or (
            popen and owner not in {"procs", "os", "signal"}
        ):
            yield f"{owner or '...'}.{attr}()", node.lineno


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


RUNNERS = frozenset({"run", "Popen", "call", "check_call", "check_output", "system"})

# Issue 32.1: the modules that may start a process, each for its reason. Every agent host (a
# fire's, a relaunch's, a rehost's) starts through a backend, so no module outside this table
# starts one on its own (as resume.py and supervise/rehost.py once did, ignoring any backend but
# their own two).
PROCESS_STARTERS: dict[str, str] = {
    "dispatch.backends": "the backends: every agent host, fired, relaunched or rehosted",
    "programs": "spawn_detached, the one detached start (a backend's, a fork run's finisher)",
    "supervise.child": "the host's own child: the agent it supervises",
    "cli.host": "with the matrix off the host becomes its agent (exec): the host's own child",
    "cli.host_rounds": "with the matrix off, a job's agent as the host program's own child",
    "dispatch.tmux": "the tmux binary (a pane's command is started by tmux, asked by a backend)",
    "gitcmd": "the one hardened git runner (run to completion)",
    "pitools": "fd and rg located for pi (run to completion)",
    "piversion": "`pi --version` (run to completion)",
    "cli.doctor": "the checks' probes (run to completion)",
    "cli.demo": "the demo program starts its master as a person at a shell would",
    "cli.runs": "a fork run's finisher (neither an agent nor a host), through spawn_detached",
}
# And the modules that may make a tmux pane (a pane's command is a process tmux starts).
PANE_MAKERS: dict[str, str] = {
    "dispatch.backends": "the tmux backend",
    "fork.panes": "a fork child's pane runs the fork's own script, not a matrix worker (seed 003)",
}
_SPAWNING = frozenset(
    {("subprocess", n) for n in ("Popen", "run", "call", "check_call", "check_output", "getoutput")}
    | {("os", n) for n in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp")}
    | {("pty", "spawn")}
)
_SPAWNING_NAMES = frozenset({"Popen", "spawn_detached", "posix_spawn", "posix_spawnp", "forkpty"})


def _process_starts(path: Path) -> Iterator[tuple[str, str, int]]:
    """(kind, the call, line) for each start of a process: ``subprocess``'s runners, ``os.fork``,
    ``os.posix_spawn``, ``os.exec*``/``os.spawn*``, ``programs.spawn_detached`` (kind
    ``process``); a tmux pane made by ``.launch(…, cwd=…)``/``.split(…, cwd=…)`` (kind ``pane``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        named = isinstance(func, ast.Name) and func.id
        if named and (named in _SPAWNING_NAMES or named.startswith(("execv", "execl"))):
            yield "process", f"{func.id}()", node.lineno
        if not isinstance(func, ast.Attribute):
            continue
        owner = func.value.id if isinstance(func.value, ast.Name) else ""
        spawns = (owner, func.attr) in _SPAWNING or func.attr == "spawn_detached"
        if spawns or (owner == "os" and func.attr.startswith(("exec", "spawn"))):
            yield "process", f"{owner or '...'}.{func.attr}()", node.lineno
        elif func.attr in {"launch", "split"} and any(k.arg == "cwd" for k in node.keywords):
            yield "pane", f"a tmux pane ({owner or '...'}.{func.attr}())", node.lineno


def _git_commands(path: Path) -> Iterator[tuple[str, int]]:
    """A command line spelled with ``"git"`` first (a list or tuple literal, or the first argument
    of a call such as ``subprocess.run("git ...")`` or ``os.execvp("git", ...)``), anywhere but
    in the one git door, ``gitcmd.run``."""
    for node in ast.walk(ast.parse(path.read_text())):
        first: ast.expr | None = None
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            first = node.elts[0]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.func, ast.Attribute)
            and (node.func.attr in RUNNERS or node.func.attr.startswith(("exec", "spawn", "posix_spawn")))
        ):
            first = node.args[0]
        if (
            isinstance(first, ast.Constant)
            and isinstance(first.value, str)
            and (first.value == "git" or first.value.startswith("git "))
        ):
            yield f"{first.value.split()[0]!r} as a command", node.lineno


def _starts_outside(name: str, where: str, path: Path) -> list[str]:
    return [
        f"{where}:{line}: {call} outside the backends (dispatch/backends.py)"
        for kind, call, line in _process_starts(path)
        if name not in (PROCESS_STARTERS if kind == "process" else PANE_MAKERS)
    ]


def violations(root: Path = ROOT) -> list[str]:
    known = modules(root)
    problems: list[str] = []
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        where = f"{PACKAGE}/{path.relative_to(root)}"
        for target, line in imports(name, path, known):
            if target == name or (target not in known and target != ""):
                continue
            if name != "":  # the package's face re-exports; nothing imports it back but programs
                graph[name].add(target)
            if (_top(name), _top(target)) in APART:
                problems.append(f"{where}:{line}: {name} -> {target}: supervise/ and dispatch/ stand apart")
            elif _layer(target) > _layer(name):
                problems.append(
                    f"{where}:{line}: {name or PACKAGE} (layer {_layer(name)}) -> {target or PACKAGE} "
                    f"(layer {_layer(target)}): an arrow up the layers"
                )
            if name in PURE and target not in PURE[name]:
                problems.append(f"{where}:{line}: {name} is pure and may not import {target}")
        if name in PURE:
            for module, line in _io_imports(path):
                problems.append(f"{where}:{line}: {name} is pure and may not import {module}")
        if name not in {"procs", "testing.standin"}:
            for call, line in _signal_sends(path):
                problems.append(f"{where}:{line}: {call} outside procs.send_signal (the one signalling door)")
        problems += _starts_outside(name, where, path)
        problems += [
            f"{where}:{line}: {call} outside gitcmd.run (the one hardened git door)"
            for call, line in _git_commands(path)
            if name != "gitcmd"
        ]
        if _top(name) not in PROGRAMS and name != "":
            for call, line in _program_calls(path):
                problems.append(f"{where}:{line}: {call} below cli/ (raise a typed error; the CLI prints)")
    for component in _cycles(graph):
        problems.append("import cycle: " + " <-> ".join(component))
    return list(dict.fromkeys(problems))


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in modules(ROOT) if _top(name) not in LAYERS)
    assert unplaced == [], f"give these a layer in LAYERS (and docs/architecture.md): {unplaced}"


def test_imports_run_down_the_layers_without_cycles_or_printing_below_cli() -> None:
    problems = violations()
    assert problems == [], "\n".join(problems)


def _public_signatures(path: Path) -> Iterator[tuple[str, str, int]]:
    """(function, annotation source, line) for every annotation of a public function or method."""
    tree = ast.parse(path.read_text())
    scopes: list[tuple[str, ast.AST]] = [("", tree)]
    while scopes:
        prefix, scope = scopes.pop()
        for node in ast.iter_child_nodes(scope):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                scopes.append((f"{node.name}.", node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not node.name.startswith("_") or node.name == "__init__"
            ):
                arguments = node.args
                every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
                notes = [a.annotation for a in every if a.annotation is not None]
                notes += [node.returns] if node.returns is not None else []
                for note in notes:
                    yield prefix + node.name, ast.unparse(note), node.lineno


# Issue 32.9: the few public signatures that keep ``Any``, each for a reason the types cannot say.
ANY_ALLOWED: dict[str, str] = {
    # Parsed untrusted text: each caller checks the shape it expects next (the codec, a field's
    # isinstance); typing it as a JSON union would put that narrowing in front of every caller.
    "strictjson.py: loads": "parses untrusted JSON that its caller checks next",
    # attrs.evolve's keyword overrides: each keyword has its own field's type, which the attrs
    # plugin checks at evolve itself and no annotation on ``**changes`` can say.
    "matrix/model.py: Entry.moved": "attrs.evolve field overrides",
    "matrix/lifecycle.py: with_identity": "attrs.evolve field overrides",
}


def any_in_signatures(root: Path = ROOT) -> list[str]:
    """``file:line: function: annotation`` for every ``Any`` in a public signature's parameters or
    return (public: a module-level function, or a method of a public class, not named ``_…``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        for function, note, line in _public_signatures(path):
            if re.search(r"\bAny\b", note) and f"{where}: {function}" not in ANY_ALLOWED:
                found.append(f"{PACKAGE}/{where}:{line}: {function}: {note}")
    return found


def test_public_signatures_name_their_types() -> None:
    """No ``Any`` in a public signature anywhere in the package: a plugin author, an orchestrator
    or the next maintainer reads the types off the signatures (mypy --strict checks the rest)."""
    found = any_in_signatures()
    assert found == [], f"{len(found)} public signature(s) with Any:\n" + "\n".join(found)


def test_the_any_allowlist_names_what_is_there() -> None:
    """An allowlisted signature that lost its ``Any`` leaves the list too."""
    present = set()
    for path in sorted(ROOT.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        present |= {f"{where}: {f}" for f, note, _ in _public_signatures(path) if re.search(r"\bAny\b", note)}
    assert set(ANY_ALLOWED) <= present


# Issue 32.7: the package was never released, so a module that moved keeps no alias at its old
# path, and no module re-exports a name that moved out of it.
GONE_MODULES = (
    "_deprecated", "runs", "standin", "supervise.lifecycle", "supervise.mailbox", "resume",
    "supervise.rehost", "cli.handoffs", "dispatch.profile_checks", "dispatch.teams",
)  # fmt: skip
GONE_NAMES = {
    "supervise.master": ("calling_master", "owning_master", "require_master"),
    "supervise.relaunch": (
        "host_argv", "pi_command", "spawn_detached", "ENV_PI_COMMAND", "ResumeRefused", "check_resumable",
        "transcript_lost", "wake_prompt",
    ),
    "dispatch.manager": (
        "SCRUB_ENV", "DEFAULT_SOCKET", "TMUX_SESSION", "FireRequest", "marker_instruction", "PlannedAgent",
        "LIVE", "MAX_DEADLINE_S", "MAX_TASK_BYTES",
    ),
    "dispatch.plan": ("FireRequest", "marker_instruction", "MAX_DEADLINE_S", "MAX_TASK_BYTES"),
    "dispatch.backends": ("DEFAULT_SOCKET",),
    # The tmux model runs nothing: its one socket probe is the runner's (dispatch.tmux).
    "dispatch.tmux_model": ("listening",),
    # Issue 32.8: the master session and the handoff text live below cli/.
    "cli.master": ("HANDOFF_REPOST_S", "handoff_message"),
    "cli.base": ("printable",),
}  # fmt: skip


def test_a_moved_module_keeps_no_alias() -> None:
    assert sorted(set(GONE_MODULES) & set(modules(ROOT))) == []


def test_no_module_re_exports_a_name_that_moved_out() -> None:
    for name, moved in GONE_NAMES.items():
        module = importlib.import_module(f"{PACKAGE}.{name}")
        assert set(moved) & set(module.__all__) == set(), name


def test_the_checker_sees_an_arrow_up_a_cycle_and_a_print(tmp_path: Path) -> None:
    """The harness can fail: a planted upward import, cycle and print are each reported."""
    package = tmp_path / PACKAGE
    (package / "matrix").mkdir(parents=True)
    (package / "dispatch").mkdir()
    (package / "supervise").mkdir()
    for init in ("", "matrix", "dispatch", "supervise"):
        (package / init / "__init__.py").write_text("")
    (package / "matrix" / "store.py").write_text("def f():\n    from ..dispatch import manager\n")
    (package / "dispatch" / "manager.py").write_text("from ..supervise import host\nprint('hi')\n")
    (package / "supervise" / "host.py").write_text("from ..matrix import store\n")
    (package / "matrix" / "model.py").write_text("import os\n")
    (package / "supervise" / "child.py").write_text("def f(p):\n    p.terminate()\n")
    (package / "supervise" / "vcs.py").write_text("import subprocess\nsubprocess.run(['git', 'status'])\n")
    # A host started by a module of its own, a pane made beside the backends, and the host's
    # own child spawn moved out of supervise/child.py: each a start outside the backends.
    (package / "recovery.py").write_text(
        "from .programs import spawn_detached\ndef f(s, a):\n    spawn_detached(a, 'x.log', cwd='/')\n"
        "    s.launch(a, session='s', cwd='/', env={})\n"
    )
    (package / "supervise" / "spawn.py").write_text("import subprocess\nsubprocess.Popen(['pi'])\n")
    (package / "supervise" / "typed.py").write_text(
        "from typing import Any\n\n\nclass Pipe:\n"
        "    def send(self, command: dict[str, Any]) -> None: ...\n\n\n"
        "def _private(x: Any) -> Any: ...\n"
    )
    assert any_in_signatures(package) == [
        f"{PACKAGE}/supervise/typed.py:5: Pipe.send: dict[str, Any]"
    ]
    found = "\n".join(violations(package))
    assert "matrix.store (layer 2) -> dispatch.manager (layer 3)" in found
    assert "dispatch.manager -> supervise.host: supervise/ and dispatch/ stand apart" in found
    assert "print() below cli/" in found
    assert "import cycle: dispatch.manager <-> matrix.store <-> supervise.host" in found
    assert "matrix.model is pure and may not import os" in found
    assert "p.terminate() outside procs.send_signal" in found
    assert "supervise/vcs.py:2: 'git' as a command outside gitcmd.run" in found
    assert "recovery.py:3: spawn_detached() outside the backends" in found
    assert "recovery.py:4: a tmux pane (s.launch()) outside the backends" in found
    assert "supervise/spawn.py:2: subprocess.Popen() outside the backends" in found


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    print("\n".join(violations(where) + any_in_signatures(where)) or "no violations")
