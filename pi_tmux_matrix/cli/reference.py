"""The CLI reference, generated from the parser (``python -m pi_tmux_matrix.cli.reference``).

docs/cli-reference.md is this module's output; a test fails when the two differ, so the reference
cannot drift from the commands."""

from __future__ import annotations

import os

__all__ = ["reference"]


def reference() -> str:
    from .app import build_parser
    from .base import public_verbs

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for a stable file
    parser = build_parser()
    parts = [
        "# pi-matrix command reference\n",
        "Generated from the parser by `python -m pi_tmux_matrix.cli.reference > docs/cli-reference.md`;",
        "a test keeps it in step. The overview with examples is [cli.md](cli.md).\n",
        "```text",
        parser.format_help().rstrip(),
        "```\n",
    ]
    for name, sub in public_verbs(parser):
        parts += [f"## pi-matrix {name}\n", "```text", sub.format_help().rstrip(), "```\n"]
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference(), end="")
