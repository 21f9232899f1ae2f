"""pi's search tools (issue 29.10): the fd adapter of ``scripts/install-pi`` and ``doctor``'s check.

pi's find passes fd ``--no-require-git`` (pi before 0.79.10 on every find, later ones outside a
git repository), which fd before 8.7 (Debian bookworm's fd-find 8.6.0) rejects. install-pi then
puts ``scripts/pi-fd-adapter`` at ``<prefix>/tools/fd``, first on its wrapper's PATH. Here: the
adapter itself on the system's fd (gitignored files stay out outside a repository, anchored
patterns and negations included; inside one fd applies .gitignore itself); pi's own find through
it, on the pi under test (every search asserts what it must find, not only what it must not);
and ``doctor`` naming the fd and rg pi would run, with a fake fd that rejects the flag and one
that takes it. Real processes throughout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pi_support import ROOT, pi_bin, pi_dist, pi_search_path, pi_temp

from pi_tmux_matrix.pitools import search_tools, wrapper_path
from pi_tmux_matrix.piversion import node_for

pytestmark = pytest.mark.real_pi

ADAPTER = ROOT / "scripts" / "pi-fd-adapter"
GITIGNORE = "# build output\n/build\nlogs/\n*.tmp\n!keep.tmp\ndocs/*.md\n"
FOUND = {".gitignore", "src/app.py", "docs/b.txt", "keep.tmp", "sub/docs/c.md", "sub/build/y.txt"}
IGNORED = {"build/out.txt", "logs/a.txt", "sub/logs/b.txt", "x.tmp", "docs/a.md"}


def tree(base: Path, name: str = "work") -> Path:
    """A folder whose .gitignore has an anchored folder (``/build``: not ``sub/build``), a folder
    at any depth (``logs/``), a wildcard with a negation (``*.tmp``, ``!keep.tmp``) and a pattern
    with an inner slash (``docs/*.md``: anchored, so ``sub/docs/c.md`` stays)."""
    work = base / name
    for relative in FOUND | IGNORED:
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        (work / relative).write_text("x\n")
    (work / ".gitignore").write_text(GITIGNORE)
    return work


def system_fd() -> str:
    found = shutil.which("fd") or shutil.which("fdfind")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no fd or fdfind (.ci/run installs Debian's fd-find)")
        pytest.skip("no fd or fdfind (Debian: fd-find)")
    return found


def adapter_in(folder: Path) -> Path:
    """The adapter as install-pi installs it: ``<folder>/fd``."""
    system_fd()
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ADAPTER, folder / "fd")
    (folder / "fd").chmod(0o755)
    return folder / "fd"


def files(output: str, root: Path | None = None) -> set[str]:
    """fd's lines as paths relative to ``root``; folders (ending in ``/``) and a repository's
    ``.git/`` (listed with ``--hidden``) left out."""
    prefix = f"{root}/" if root else ""
    paths = {line.removeprefix(prefix) for line in output.splitlines()}
    return {p for p in paths if p and not p.endswith("/") and not p.startswith(".git/")}


def run_adapter(adapter: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{adapter.parent}:{os.environ.get('PATH', '')}")
    return subprocess.run(
        ["fd", *args], capture_output=True, text=True, timeout=30, check=False, env=env, cwd=cwd
    )


# pi 1.6's call outside a git repository, and pi 0.73.1's (always).
PI_16 = ["--color=never", "--hidden", "--no-require-git", "--glob", "--max-results", "1001"]
PI_073 = ["--glob", "--color=never", "--hidden", "--no-require-git", "--max-results", "1000"]


@pytest.mark.parametrize("flags", [PI_16, PI_073], ids=["pi-1.6", "pi-0.73.1"])
def test_the_adapter_runs_pis_find_outside_a_repository_leaving_out_what_gitignore_names(
    tmp_path: Path, flags: list[str]
) -> None:
    work = tree(tmp_path)
    adapter = adapter_in(tmp_path / "tools")
    done = run_adapter(adapter, *flags, "--", "*", str(work))
    assert done.returncode == 0, done.stderr
    assert files(done.stdout, work) == FOUND, done.stdout
    real = system_fd()
    plain = subprocess.run(
        [real, *flags, "--", "*", str(work)], capture_output=True, text=True, timeout=30, check=False
    )
    if plain.returncode == 0:  # an fd that takes the flag itself (8.7+): the adapter answers alike
        assert files(plain.stdout, work) == FOUND
    else:  # Debian's 8.6: the very call pi makes is a usage error without the adapter
        assert "--no-require-git" in plain.stderr and plain.stdout == ""


def test_the_adapter_anchors_patterns_at_the_root_as_given_and_passes_other_calls_through(
    tmp_path: Path,
) -> None:
    """A relative root (fd's entries then relative too), a root whose name holds glob characters
    (escaped, not read as a pattern), a call without the flag (unchanged), no real fd (a clear
    error, never itself)."""
    adapter = adapter_in(tmp_path / "tools")
    work = tree(tmp_path)
    done = run_adapter(adapter, "--hidden", "--no-require-git", "--glob", "--", "*", cwd=work)
    assert done.returncode == 0, done.stderr
    assert files(done.stdout) == FOUND, done.stdout
    odd = tree(tmp_path, "a [x]*b")
    done = run_adapter(adapter, *PI_16, "--", "*", str(odd))
    assert files(done.stdout, odd) == FOUND, done.stdout
    version = run_adapter(adapter, "--version")
    assert version.returncode == 0 and version.stdout.startswith(("fd", "fdfind")), version
    lonely = subprocess.run(
        [str(adapter), "--version"], capture_output=True, text=True, timeout=30, check=False,
        env=dict(os.environ, PATH=str(adapter.parent)),
    )  # fmt: skip
    assert lonely.returncode == 127 and "no fd or fdfind on PATH" in lonely.stderr


def test_inside_a_git_repository_the_adapter_only_drops_the_flag(tmp_path: Path) -> None:
    """fd applies .gitignore itself in a repository; the adapter adds nothing (pi 0.73.1 passes
    the flag there too). A nested .gitignore counts there, as fd reads it."""
    work = tree(tmp_path)
    (work / "sub" / ".gitignore").write_text("c.md\n")
    subprocess.run(["git", "init", "-q", str(work)], check=True, timeout=30)
    adapter = adapter_in(tmp_path / "tools")
    done = run_adapter(adapter, *PI_073, "--", "*", str(work))
    assert done.returncode == 0, done.stderr
    assert files(done.stdout, work) == (FOUND - {"sub/docs/c.md"}) | {"sub/.gitignore"}, done.stdout


_FIND = """import * as tools from {tools};
const out = [];
for (const pattern of {patterns}) {{
  try {{
    const find = tools.createFindToolDefinition({work});
    const r = await find.execute('id', {{ pattern }}, undefined, undefined, undefined);
    out.push({{ ok: true, text: r.content.map((p) => p.text).join('') }});
  }} catch (error) {{
    out.push({{ ok: false, text: String(error.message) }});
  }}
}}
console.log(JSON.stringify(out));
"""


@pytest.mark.parametrize("git", [False, True], ids=["outside-git", "in-a-repository"])
def test_pis_own_find_finds_what_is_there_and_leaves_out_what_gitignore_names(
    tmp_path: Path, git: bool
) -> None:
    """pi's find tool (its own code, under the node its wrapper runs) with the PATH install-pi's
    wrapper gives it: the files are found, the gitignored ones are not, in and outside a git
    repository, on the pi under test (1.6 passes the flag outside only, 0.73.1 always)."""
    binary = pi_bin()
    path = pi_search_path(binary)
    work = tree(tmp_path)
    if git:
        subprocess.run(["git", "init", "-q", str(work)], check=True, timeout=30)
    script = tmp_path / "find.mjs"
    script.write_text(_FIND.format(
        tools=json.dumps(str(pi_dist() / "core" / "tools" / "index.js")),
        patterns=json.dumps(["*", "*.py", "src/*"]),
        work=json.dumps(str(work)),
    ))  # fmt: skip
    done = subprocess.run(
        [node_for([binary]) or "node", str(script)], capture_output=True, text=True, timeout=120,
        check=False, env=dict(os.environ, PATH=path, TMPDIR=pi_temp(tmp_path)), cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    every, python, source = json.loads(done.stdout)
    assert every["ok"], every["text"]  # a usage error from an fd without --no-require-git fails here
    assert files(every["text"]) == FOUND, every["text"]
    assert python["text"].split() == ["src/app.py"] and source["text"].split() == ["src/app.py"]


# -- doctor --------------------------------------------------------------------------------------
def fake_tool(folder: Path, name: str, version: str, *, takes_flag: bool = True) -> Path:
    """A stand-in fd or rg: answers --version, and (``takes_flag=False``) rejects
    --no-require-git as fd 8.6 does (exit 2)."""
    folder.mkdir(parents=True, exist_ok=True)
    reject = (
        ""
        if takes_flag
        else 'for a do [ "$a" = --no-require-git ] && { echo "error: Found argument '
        "'--no-require-git' which wasn't expected\" >&2; exit 2; }; done\n"
    )
    tool = folder / name
    tool.write_text(f'#!/bin/sh\n{reject}echo "{version}"\n')
    tool.chmod(0o755)
    return tool


def fake_pi(root: Path, version: str) -> Path:
    """A pi package (package.json) with install-pi's wrapper ``bin/pi``, whose tools/ line is
    install-pi's own (``tools`` made by the caller, as install-pi does when it is needed)."""
    package = root / "node_modules" / "@earendil-works" / "pi-coding-agent"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text(
        json.dumps({"name": "@earendil-works/pi-coding-agent", "version": version})
    )
    (root / "bin").mkdir()
    wrapper = root / "bin" / "pi"
    tools = root / "tools"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ -d "{tools}" ]; then PATH="{tools}:$PATH"; export PATH; fi\n'
        f'exec "/usr/bin/node" "{package}/dist/cli.js" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def doctor(tmp_path: Path, path: str, pi: Path) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), "doctor", "--json"],
        env={**os.environ, "PATH": path, "PI_MATRIX_PI_COMMAND": json.dumps([str(pi)])},
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.stdout, done.stderr
    return {c["check"]: c for c in json.loads(done.stdout)["checks"]}


@pytest.mark.parametrize(("version", "when"), [("0.73.1", "everywhere"), ("1.6.0", "outside git")])
def test_doctor_warns_of_an_fd_that_rejects_the_flag_and_says_how_to_fix_it(
    tmp_path: Path, version: str, when: str
) -> None:
    bin_dir = tmp_path / "fakebin"
    fd = fake_tool(bin_dir, "fd", "fd 8.6.0", takes_flag=False)
    rg = fake_tool(bin_dir, "rg", "ripgrep 13.0.0")
    pi = fake_pi(tmp_path / "pi", version)
    checks = doctor(tmp_path, f"{bin_dir}:{os.environ['PATH']}", pi)
    check = checks["pi's fd"]
    assert not check["ok"] and not check["required"], check
    said = f"{fd} (fd 8.6.0; on PATH) rejects --no-require-git: pi's find fails {when}"
    assert said in str(check["detail"]), check
    fix = str(check["fix"])
    assert "fd 8.7.0 or newer" in fix and str(Path(os.environ["PI_CODING_AGENT_DIR"]) / "bin" / "fd") in fix
    assert "scripts/install-pi" in fix
    assert checks["pi's rg"]["ok"] and str(rg) in str(checks["pi's rg"]["detail"])


def test_doctor_finds_the_fd_pi_runs_agent_dir_first_then_the_wrappers_adapter(tmp_path: Path) -> None:
    bin_dir = tmp_path / "fakebin"
    fake_tool(bin_dir, "fd", "fd 8.6.0", takes_flag=False)
    pi = fake_pi(tmp_path / "pi", "1.6.0")
    path = f"{bin_dir}:{os.environ['PATH']}"
    # The wrapper's tools/ holds the adapter (install-pi's copy): it takes the flag, over the old fd.
    adapter = adapter_in(tmp_path / "pi" / "tools")
    assert wrapper_path([str(pi)]) == str(adapter.parent)
    check = doctor(tmp_path, path, pi)["pi's fd"]
    assert check["ok"] and f"{adapter}: the adapter of scripts/install-pi" in str(check["detail"]), check
    assert "for fd 8.6.0" in str(check["detail"])  # the real fd it runs, found past itself
    # pi takes <agent dir>/bin/fd before anything on PATH.
    agent = Path(os.environ["PI_CODING_AGENT_DIR"])
    own = fake_tool(agent / "bin", "fd", "fd 10.2.0")
    check = doctor(tmp_path, path, pi)["pi's fd"]
    assert check["ok"] and str(check["detail"]).startswith(f"{own} (fd 10.2.0; the agent dir's"), check
    assert "takes --no-require-git" in str(check["detail"])
    # Without the adapter and the agent dir's fd, an fd that takes the flag is fine on its own.
    own.unlink()
    shutil.rmtree(adapter.parent)
    fake_tool(bin_dir, "fd", "fd 10.2.0")
    check = doctor(tmp_path, path, pi)["pi's fd"]
    assert check["ok"] and "(fd 10.2.0; on PATH): takes --no-require-git" in str(check["detail"]), check


def test_doctor_says_when_pi_has_no_fd_or_rg(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    checks = doctor(tmp_path, str(empty), fake_pi(tmp_path / "pi", "1.6.0"))
    assert not checks["pi's fd"]["ok"] and "no fd or fdfind" in str(checks["pi's fd"]["detail"])
    assert not checks["pi's rg"]["ok"] and "pi's grep tool fails" in str(checks["pi's rg"]["detail"])
    assert "ripgrep" in str(checks["pi's rg"]["fix"])


def test_the_pinned_wrappers_search_tools_work_as_pi_runs_them() -> None:
    """The pi under test, as installed by install-pi: its fd takes the flag (the adapter when the
    system's is older) and rg answers, as doctor reads them off its wrapper."""
    binary = pi_bin()
    fd, rg = search_tools([binary], Path(os.environ["PI_CODING_AGENT_DIR"]))
    assert fd.takes_flag, fd
    assert rg.version is not None and rg.version.startswith("ripgrep"), rg
    tools = Path(binary).parent.parent / "tools"
    assert (wrapper_path([binary]) == str(tools)) is tools.is_dir()
    assert fd.adapter is tools.is_dir()
