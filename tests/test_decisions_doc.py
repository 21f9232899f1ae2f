"""Code speaks to its readers (issue 32.12): no comment cites a planning document a reader does
not have ("issue 30.4", "seed 000"); the rule it means is a section of docs/decisions.md, and
every ``docs/decisions.md#anchor`` the code or the docs cite is a heading there.

tests/ may keep their issue numbers: a test names the issue case it guards.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECISIONS = ROOT / "docs" / "decisions.md"
# Where the product's own words are: the package (Python and the bridge's TypeScript), and what
# ships or runs beside it.
SCOPE = (
    ("pi_tmux_matrix", ("*.py", "*.ts")),
    ("launch_profiles", ("*",)),
    ("benchmarks", ("*",)),
    ("scripts", ("*",)),
    ("examples", ("*",)),
)
SKIPPED_PARTS = frozenset({"__pycache__", "node_modules", "results", ".pytest_cache"})
# "issue 30", "issue 30.4", "Issue 28.9", "issues 19", "issue #7"; "seed 000", "Seed 003's";
# "the seed's contract".
INTERNAL = re.compile(r"\b[Ii]ssues? #?\d+|\b[Ss]eeds? ?0\d\d\b|\b[Tt]he seed's\b")
LINK = re.compile(r"decisions\.md#([A-Za-z0-9_-]+)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$")
FENCE = re.compile(r"^(```|~~~)")


def scoped_files() -> Iterator[Path]:
    for folder, patterns in SCOPE:
        for pattern in patterns:
            for path in sorted((ROOT / folder).rglob(pattern)):
                if path.is_file() and not SKIPPED_PARTS.intersection(path.relative_to(ROOT).parts):
                    yield path


def lines_of(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []  # not text (an image of the examples, a compiled file)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors() -> list[str]:
    found, fenced = [], False
    for line in DECISIONS.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            found.append(slug(match.group(1)))
    return found


def test_no_code_cites_an_issue_or_a_seed() -> None:
    left = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in scoped_files()
        for number, line in enumerate(lines_of(path), 1)
        if INTERNAL.search(line)
    ]
    assert not left, (
        f"{len(left)} mention(s) of an issue or a seed: readers have neither; say the rule, and "
        "point to its section, e.g. (docs/decisions.md#fires-do-not-wait-for-starts):\n" + "\n".join(left)
    )


def test_every_cited_decision_is_a_heading() -> None:
    known = set(anchors())
    cited = [
        (f"{path.relative_to(ROOT)}:{number}", anchor)
        for path in (*scoped_files(), *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md")
        for number, line in enumerate(lines_of(path), 1)
        for anchor in LINK.findall(line)
    ]
    assert cited, "no code points to docs/decisions.md"
    missing = [f"{where}: #{anchor}" for where, anchor in cited if anchor not in known]
    assert not missing, "links to no heading of docs/decisions.md:\n" + "\n".join(missing)


def test_every_decision_has_its_own_anchor() -> None:
    seen = anchors()
    twice = sorted({a for a in seen if seen.count(a) > 1})
    assert not twice, f"headings with the same anchor (GitHub would number them): {twice}"


def test_the_slug_is_githubs() -> None:
    assert slug("Fires do not wait for starts") == "fires-do-not-wait-for-starts"
    assert slug("A fire's `fsync`s, fewer: and side by side") == "a-fires-fsyncs-fewer-and-side-by-side"
    assert slug("One grant wins") == "one-grant-wins"
