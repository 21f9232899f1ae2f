"""Run every benchmark and print one table: figure, ours, baseline, ratio, goal, met.

    python benchmarks/run_all.py [--quick] [--no-real-pi] [--no-fleet]

Each benchmark measures its own baseline in the same run (see its docstring). The combined table
is written to benchmarks/results/all.json, and as a bar chart of the ratios against their goals
to benchmarks/results/all.png when matplotlib is installed (``pip install -e '.[plot]'``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCHES = ("bench_store", "bench_supervise", "bench_fire", "bench_handoff", "bench_startup", "bench_fleet")


def _number(text: str) -> float | None:
    found = re.match(r"\s*([0-9.]+)", text)
    return float(found.group(1)) if found else None


def _met(value: Any) -> bool | None:
    if isinstance(value, str):
        return None if value in ("-", "") else value.lower() == "yes"
    return None if value is None else bool(value)


def rows_of(name: str) -> list[dict[str, Any]]:
    data = json.loads((RESULTS / f"{name}.json").read_text())
    if "rows" in data:
        # Some benchmarks write "met" as text ("yes", "NO", "-"): any non-empty text is truthy, so
        # a missed goal printed "yes" until it was read as what it says.
        return [dict(row, bench=name, met=_met(row.get("met"))) for row in data["rows"]]
    rows = []
    for figure, ours, baseline, ratio, goal, met in data.get("table", []):
        rows.append(
            {"bench": name, "figure": figure, "ours": ours, "baseline": baseline, "ratio": _number(ratio),
             "goal": goal, "met": None if met == "-" else met == "yes"}
        )  # fmt: skip
    return rows


def _shown(value: Any, unit: str = "") -> str:
    if isinstance(value, float):
        return f"{value:.3g}{(' ' + unit) if unit else ''}"
    return str(value)


def chart(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    plotted = [r for r in rows if isinstance(r.get("ratio"), (int, float))]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(plotted) + 1.5))
    labels = [r["figure"][:60] for r in plotted]
    colours = [
        "tab:green" if r.get("met") else ("tab:red" if r.get("met") is False else "tab:gray") for r in plotted
    ]
    ax.barh(labels, [r["ratio"] for r in plotted], color=colours)
    for i, row in enumerate(plotted):
        goal = (
            _number(str(row.get("goal", "")).split("<=")[-1]) if "ratio <=" in str(row.get("goal")) else None
        )
        if goal is not None:
            ax.plot([goal, goal], [i - 0.4, i + 0.4], color="black")
    ax.set_xscale("log")
    ax.set_xlabel("ours / baseline (log scale; black tick: the goal)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="every benchmark's smoke size (numbers mean little)"
    )
    parser.add_argument(
        "--real-pi", action=argparse.BooleanOptionalAction, default=True,
        help="bench_handoff's real-pi rows (default: on; skipped, saying why, when pi is not installed)",
    )  # fmt: skip
    parser.add_argument(
        "--fleet", action=argparse.BooleanOptionalAction, default=True,
        help="bench_fleet: 100 agents in tmux, ~4 min (default: on; --no-fleet skips it)",
    )  # fmt: skip
    args = parser.parse_args()
    failed = []
    benches = [name for name in BENCHES if args.fleet or name != "bench_fleet"]
    for name in benches:
        command = [sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if args.quick else [])]
        if name == "bench_handoff" and not args.real_pi:
            command.append("--no-real-pi")
        print(f"== {name}", flush=True)
        done = subprocess.run(command, check=False)
        if done.returncode != 0:
            failed.append(name)
    rows = [row for name in benches if name not in failed for row in rows_of(name)]
    print(f"\n{'figure':<48}  {'ours':>12}  {'baseline':>14}  {'ratio':>7}  {'goal':<18}  met")
    for row in rows:
        unit = str(row.get("unit", ""))
        met = "-" if row.get("met") is None else ("yes" if row["met"] else "NO")
        ratio = f"{row['ratio']:.3g}" if isinstance(row.get("ratio"), (int, float)) else "-"
        ours, baseline = _shown(row["ours"], unit), _shown(row["baseline"], unit)
        goal = str(row.get("goal", "-"))[:18]
        print(f"{row['figure'][:48]:<48}  {ours:>12}  {baseline:>14}  {ratio:>7}  {goal:<18}  {met}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "all.json").write_text(
        json.dumps({"quick": args.quick, "failed": failed, "rows": rows}, indent=2)
    )
    drawn = chart(rows, RESULTS / "all.png")
    print(
        f"written to {RESULTS / 'all.json'}"
        + (f" and {RESULTS / 'all.png'}" if drawn else " (no matplotlib: no chart)")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
