#!/usr/bin/env python
"""Start-up and whole-process listing benchmark: what a person feels when typing a verb
(docs/decisions.md#a-verb-loads-only-what-it-uses).

    python benchmarks/bench_startup.py [--quick]

Each figure is a whole process (interpreter start, imports, the verb, exit), the median of
``runs`` runs, against a baseline process timed in the same run, interleaved with it:

1. ``pi-matrix --version`` / ``python -c pass`` and / ``python -c "import json"``.
2. ``pi-matrix ls`` on an empty state dir / the same two baselines. Goal: <= 3x ``python -c pass``.
3. ``pi-matrix --help`` / ``python -c pass``. Goal: <= 150 ms (the verbs by group, no verb module).
4. ``pi-matrix ls`` on 100 entries / ``python -c pass``.
5. ``pi-matrix ls --json`` over 10,000 entries / a process that reads the same files and
   ``json.loads`` each (start-up included on both sides). Goal: <= 2x.

Also prints the ten slowest imports of ``pi-matrix ls`` (``python -X importtime``, cumulative).
Writes benchmarks/results/bench_startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import populate  # the same entries bench_store lists

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "bench_startup.json"
HEADER = ("figure", "ours", "baseline", "ratio", "goal", "met")
PI_MATRIX = [sys.executable, "-m", "pi_tmux_matrix"]
RAW_LS = (
    "import json, os, sys\n"
    "root = sys.argv[1]\n"
    "rows = []\n"
    "for name in sorted(os.listdir(root)):\n"
    "    if name.endswith('.json'):\n"
    "        with open(os.path.join(root, name), 'rb') as handle:\n"
    "            rows.append(json.loads(handle.read()))\n"
    "sys.stdout.write(json.dumps(rows))\n"
)


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[-3:]} failed ({done.returncode}): {done.stderr[-500:]!r}")
    return elapsed * 1000


def pair(ours: list[str], base: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Medians (ms) of ``ours`` and ``base``, run alternately so drift hits both alike."""
    timed(ours, env), timed(base, env)  # warm the page cache
    a: list[float] = []
    b: list[float] = []
    for i in range(runs):
        for which in (0, 1) if i % 2 else (1, 0):
            (a if which else b).append(timed(ours if which else base, env))
    return statistics.median(a), statistics.median(b)


def slowest_imports(argv: list[str], env: dict[str, str], count: int = 10) -> list[tuple[str, int]]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True, check=False
    )
    found: list[tuple[str, int]] = []
    for line in done.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[1].isdigit():
            found.append((parts[2].strip(), int(parts[1])))
    return sorted(found, key=lambda item: -item[1])[:count]


def row(figure: str, ours: float, base: float, base_is: str, goal: float | None) -> dict[str, Any]:
    ratio = ours / base
    return {
        "figure": figure, "ours": f"{ours:.0f} ms", "baseline": f"{base:.0f} ms {base_is}",
        "ratio": round(ratio, 2), "goal": f"<= {goal:g}x" if goal else "-",
        "met": ("yes" if ratio <= goal else "NO") if goal else "-",
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 runs, 300 entries instead of 10,000")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs, many = (3, 300) if args.quick else (10, 10_000)
    root = Path(tempfile.mkdtemp(prefix="pi-matrix-bench-startup-"))
    env = dict(os.environ, HOME=str(root), PI_CODING_AGENT_DIR=str(root / "agent"))
    env.pop("PI_MATRIX_STATE_DIR", None)
    began = time.monotonic()
    rows = []
    try:
        empty, hundred, big = root / "empty", root / "hundred" / "state", root / "big" / "state"
        empty.mkdir(mode=0o700)
        populate(hundred, 100)
        populate(big, many)
        py_pass = [sys.executable, "-c", "pass"]
        py_json = [sys.executable, "-c", "import json"]
        version = [*PI_MATRIX, "--version"]
        ls_empty = [*PI_MATRIX, "--state-dir", str(empty), "ls"]
        for name, ours in (("pi-matrix --version", version), ("pi-matrix ls, empty state dir", ls_empty)):
            goal = 3.0 if "ls" in name else None
            mine, base = pair(ours, py_pass, env, runs)
            rows.append(row(f"{name} / python -c pass", mine, base, "python -c pass", goal))
            mine, base = pair(ours, py_json, env, runs)
            rows.append(row(f"{name} / python -c 'import json'", mine, base, "import json", None))
        mine, base = pair([*PI_MATRIX, "--help"], py_pass, env, runs)
        rows.append(row("pi-matrix --help / python -c pass", mine, base, "python -c pass", None))
        rows[-1]["goal"], rows[-1]["met"] = "<= 150 ms", "yes" if mine <= 150 else "NO"
        mine, base = pair([*PI_MATRIX, "--state-dir", str(hundred), "ls"], py_pass, env, runs)
        rows.append(row("pi-matrix ls, 100 entries / python -c pass", mine, base, "python -c pass", None))
        ls_json = [*PI_MATRIX, "--state-dir", str(big), "ls", "--json"]
        mine, base = pair(ls_json, [sys.executable, "-c", RAW_LS, str(big)], env, runs)
        figure = f"pi-matrix ls --json, {many} entries / raw read + json.loads"
        rows.append(row(figure, mine, base, "raw", 2.0))
        imports = slowest_imports(ls_empty, env)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    titles = dict(zip(HEADER, HEADER, strict=True))
    widths = [max(len(str(r[h])) for r in [titles, *rows]) for h in HEADER]
    print(f"bench_startup ({'quick' if args.quick else 'full'}): {os.cpu_count()} CPUs, "
          f"median of {runs} runs, {time.monotonic() - began:.1f} s")  # fmt: skip
    for r in [titles, *rows]:
        print("  ".join(str(r[h]).ljust(w) for h, w in zip(HEADER, widths, strict=True)).rstrip())
    print("slowest imports of 'pi-matrix ls' (cumulative us):")
    for module, micros in imports:
        print(f"  {micros:>8}  {module}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"rows": rows, "imports": imports}, indent=2) + "\n")
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
