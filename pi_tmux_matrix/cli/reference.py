"""The CLI reference, generated from the parser (``python -m pi_tmux_matrix.cli.reference``).

docs/cli-reference.md is this module's output; a test fails when the two differ, so the reference
cannot drift from the commands."""

from __future__ import annotations

import os

__all__ = ["reference"]


def reference() -> str:
    import argparse

    from .app import DESCRIPTION, build_parser
    from .base import EPILOG
    from .verbs import GROUPS, top_help

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for a stable file
    parser = build_parser()
    parts = [
        "# pi-matrix command reference\n",
        "Generated from the parser by `python -m pi_tmux_matrix.cli.reference > docs/cli-reference.md`;",
        "a test keeps it in step. The overview with examples is [cli.md](cli.md).\n",
        "```text",
        top_help(EPILOG, DESCRIPTION, width=100).rstrip(),
        "```\n",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # By group, as --help lists them; then the host, which the product starts (and a person may,
    # by hand: docs/cli.md), out of --help's sight.
    for name in [*(verb for _title, verbs in GROUPS for verb in verbs), "host"]:
        parts += [f"## pi-matrix {name}\n", "```text", sub.choices[name].format_help().rstrip(), "```\n"]
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference(), end="")
