"""Finding the real pi for the tests: ``$PI_MATRIX_PI_BIN``, else the project's ``.pi-cli/``.

Missing pi or node is a loud skip locally (with how to fix it) and a hard failure under CI.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# scripts/install-pi's wrapper: pi on the node it needs (node 22 from .pi-cli/ when the system's is older).
DEFAULT_PI = ROOT / ".pi-cli" / "bin" / "pi"
# Whether the running test carries the ``real_pi`` mark (set by conftest for each test; None
# outside a test): the oldest-supported pass of .ci/run selects tests by that mark, so a test
# that runs real pi without it would silently never meet the oldest pi.
RUNNING_MARKED: bool | None = None
MARK_FIX = (
    "this test runs real pi but is not marked real_pi: add 'pytestmark = pytest.mark.real_pi' to "
    "its module (or @pytest.mark.real_pi to it), so .ci/run's oldest-pi pass runs it too"
)


# pi compiles the bridge (TypeScript, through jiti) at each start unless it finds the compiled copy
# in $TMPDIR/jiti. Each test's pi has a TMPDIR of its own; they all link one compile cache (per
# xdist worker, set by conftest), so the bridge is compiled once per worker, not once per pi start
# (~0.9 CPU-s each, on a suite that is CPU-bound). jiti checks a cached copy's hash before use.
JITI_CACHE: Path | None = None


def pi_temp(folder: Path) -> str:
    """``folder`` made, as a TMPDIR for pi that shares the tests' compile cache; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "jiti"
    if JITI_CACHE is not None and not link.exists():
        link.symlink_to(JITI_CACHE, target_is_directory=True)
    return str(folder)


def pi_bin() -> str:
    """The path of the pinned pi binary, or skip (fail under ``CI=true``) saying why."""
    if RUNNING_MARKED is False:
        pytest.fail(MARK_FIX)
    configured = os.environ.get("PI_MATRIX_PI_BIN")
    path = Path(configured) if configured else DEFAULT_PI
    problem = None
    if shutil.which("node") is None:
        problem = "node is not installed (pi needs Node.js; run 'bash scripts/install-pi')"
    elif not os.access(path, os.X_OK):
        problem = f"no pi at {path}; run 'bash scripts/install-pi' or set PI_MATRIX_PI_BIN"
    if problem is not None:
        _unavailable(problem)
    return str(path)


def _unavailable(problem: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"real pi unavailable in CI: {problem}")
    pytest.skip(f"real pi unavailable: {problem}")


def pi_search_path(binary: str, agent_dir: Path | None = None) -> str:
    """The PATH pi ``binary`` runs its search tools with: install-pi's wrapper puts its ``tools/``
    (the fd adapter, ``scripts/pi-fd-adapter``, when the system's fd is older than 8.7) first.
    Checked first, as ``pi-matrix doctor`` checks it: pi must find rg and an fd that takes
    ``--no-require-git`` (Debian's fd-find 8.6 alone does not: every find would be a usage
    error); else skip (fail under ``CI=true``) saying how to fix it. For a test that runs pi's
    ``dist`` directly under node, as the wrapper would."""
    from pi_tmux_matrix.pitools import search_tools, wrapper_path

    agent = agent_dir or Path(os.environ.get("PI_CODING_AGENT_DIR", str(Path.home() / ".pi" / "agent")))
    fd, rg = search_tools([binary], agent)
    if rg.path is None or fd.path is None:
        _unavailable("ripgrep and fd are needed for pi's grep and find (.ci/run installs them)")
    if not fd.takes_flag:
        _unavailable(
            f"{fd.path} ({fd.version}) rejects --no-require-git, so pi's find fails: run "
            "'bash scripts/install-pi' (its wrapper brings an adapter) or install fd 8.7+"
        )
    tools = wrapper_path([binary])
    path = os.environ.get("PATH", os.defpath)
    return f"{tools}:{path}" if tools else path


def pi_jiti() -> Path:
    """pi's own TypeScript loader, beside the pi the tests run (to run a bridge module in node):
    ``<prefix>/bin/pi`` (install-pi's wrapper) or ``<prefix>/node_modules/.bin/pi`` (npm's link)."""
    pi = Path(pi_bin())
    candidates = [pi.parent.parent / "node_modules" / "jiti", pi.parent.parent / "jiti"]
    candidates.append(pi.resolve().parent.parent / "jiti")
    for folder in candidates:
        jiti = folder / "lib" / "jiti.mjs"
        if jiti.exists():
            return jiti
    pytest.skip(f"no jiti beside {pi} (it comes with pi)")


def pi_dist() -> Path:
    """The ``dist`` folder of the pi the tests run (``@earendil-works`` from 0.74, ``@mariozechner``
    before), to import pi's own modules (its tools) in node."""
    modules = pi_jiti().parent.parent.parent
    for scope in ("@earendil-works", "@mariozechner"):
        dist = modules / scope / "pi-coding-agent" / "dist"
        if dist.is_dir():
            return dist
    pytest.skip(f"no pi-coding-agent package in {modules}")


_BRIDGE_HARNESS = """import {{ createJiti }} from {jiti};
{no_poll}const handlers = {{}};
const pi = new Proxy({{}}, {{
  get: (_target, name) => {{
    if (name === "on") return (event, fn) => {{ (handlers[event] ||= []).push(fn); }};
    if (name === "sendUserMessage") return (body) => console.log(JSON.stringify({{ sent: body }}));
    return () => undefined;
  }},
}});
const bridge = await createJiti(import.meta.url, {{ alias: {alias} }}).import({bridge});
bridge.default(pi);
const session = {{ getSessionId: () => "s1", getSessionFile: () => null }};
const ctx = {{ isIdle: () => true, sessionManager: session }};
for (const fn of handlers.session_start || []) await fn({{}}, ctx);
console.log(JSON.stringify({{ ready: true }}));
{alive}setTimeout(() => process.exit(0), 60000);
"""


def bridge_harness(bridge: Path, *, poll: bool = True, alive: bool = False) -> str:
    """A node script that loads the bridge into a stand-in pi API (each message pi is sent printed
    as a JSON line ``{"sent": …}``, then ``{"ready": true}``). ``poll=False`` takes away the
    bridge's safety-net poll (only its watch can deliver); ``alive`` prints ``{"alive": true}``
    every 0.5 s (pi itself was never blocked)."""
    no_poll = "globalThis.setInterval = () => ({ unref() {} }); // no safety-net poll: only the watch\n"
    beat = "setInterval(() => console.log(JSON.stringify({ alive: true })), 500); // pi never blocked\n"
    jiti = pi_jiti()
    modules = jiti.parent.parent.parent  # pi's node_modules: what its loader resolves from
    # pi 1.x (@earendil-works) maps the old package names an extension imports, as its loader does.
    alias = {
        f"@mariozechner/{name}": str(modules / "@earendil-works" / name)
        for name in ("pi-tui",)
        if not (modules / "@mariozechner" / name).exists() and (modules / "@earendil-works" / name).exists()
    }
    return _BRIDGE_HARNESS.format(
        jiti=json.dumps(str(jiti)),
        alias=json.dumps(alias),
        bridge=json.dumps(str(bridge)),
        no_poll="" if poll else no_poll,
        alive=beat if alive else "",
    )


def read_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, object] | None:
    """The next JSON line a harness (:func:`bridge_harness`) printed, or None if none came within
    ``timeout`` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return None
        line = proc.stdout.readline()
    return json.loads(line) if line.strip() else None
