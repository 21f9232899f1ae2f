"""No silent ``catch`` in the bridge (issue 32.10): every ``catch`` block of bridge/*.ts writes a
debug line (common.ts ``debug``, on with ``PI_MATRIX_BRIDGE_DEBUG``), rethrows, or hands the error
it caught on (a tool error, a refusal's reason, a withheld result: its binding is used); so does
every promise ``.catch(...)`` handler. The one exception is the debug writer's own sink (marked
``bridge-debug-sink``, in common.ts only): when the debug file fails there is nowhere left to say
so.

A source scan, no node needed: each offending catch is named as ``file:line``.
"""

from __future__ import annotations

import re
from pathlib import Path

from pi_tmux_matrix.bridge import bridge_path

BRIDGE = bridge_path().parent
SINK = "bridge-debug-sink"
CATCH_BLOCK = re.compile(r"\bcatch\s*(?:\(\s*(\w+)[^)]*\))?\s*\{")
CATCH_CALL = re.compile(r"\.catch\s*\(")
SILENT = "neither rethrows, hands its error on nor calls debug(...)"
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _balanced(text: str, start: int, opening: str, closing: str) -> str:
    """The text from ``start`` (just after an opening bracket) to its closing one."""
    depth = 1
    at = start
    while at < len(text) and depth > 0:
        if text[at] == opening:
            depth += 1
        elif text[at] == closing:
            depth -= 1
        at += 1
    return text[start : at - 1]


def silent_catches(file: Path) -> list[str]:
    """``file:line: why`` for each catch in ``file`` that neither rethrows nor logs."""
    text = file.read_text()
    found: list[str] = []
    sinks = 0
    for pattern, opening, closing in ((CATCH_BLOCK, "{", "}"), (CATCH_CALL, "(", ")")):
        for match in pattern.finditer(text):
            body = _balanced(text, match.end(), opening, closing)
            code = COMMENT.sub("", body)
            line = text.count("\n", 0, match.start()) + 1
            if re.search(r"\bdebug\(", code) or re.search(r"\bthrow\b", code):
                continue
            bound = match.group(1) if opening == "{" else None
            if bound and re.search(rf"\b{bound}\b", code):
                continue  # the caught error goes on (into a result, a reason, a message)
            if SINK in body and file.name == "common.ts":
                sinks += 1
                continue
            what = "catch block" if opening == "{" else ".catch handler"
            found.append(f"{file.name}:{line}: a {what} that {SILENT}")
    if sinks > 1:
        found.append(f"{file.name}: {sinks} catches marked {SINK} (only the debug writer's own may be)")
    return found


def test_the_scan_sees_a_silent_catch(tmp_path: Path) -> None:
    sample = tmp_path / "sample.ts"
    sample.write_text(
        "try { a(); } catch {\n  // quiet\n}\n"
        "try { a(); } catch (e) { debug('a', e); }\n"
        "try { a(); } catch (e) { throw e; }\n"
        "p.catch(() => undefined);\n"
        "p.catch((e) => debug('p', e));\n"
        "try { a(); } catch {\n  // debug(\n}\n"
        "try { a(); } catch (e) { return `bad: ${e}`; }\n"
        "try { a(); } catch (e) { return 1; }\n"
    )
    assert silent_catches(sample) == [
        "sample.ts:1: a catch block that neither rethrows, hands its error on nor calls debug(...)",
        "sample.ts:8: a catch block that neither rethrows, hands its error on nor calls debug(...)",
        "sample.ts:12: a catch block that neither rethrows, hands its error on nor calls debug(...)",
        "sample.ts:6: a .catch handler that neither rethrows, hands its error on nor calls debug(...)",
    ]


def test_no_bridge_catch_is_silent() -> None:
    files = sorted(BRIDGE.glob("*.ts"))
    assert files, f"no bridge sources in {BRIDGE}"
    found = [problem for file in files for problem in silent_catches(file)]
    why = "silent catches in the bridge (log them with debug(where, error)):\n"
    assert found == [], why + "\n".join(found)
