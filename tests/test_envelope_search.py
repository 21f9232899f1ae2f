"""A search's result is attributed line by line, or withheld (issue 28 case 5).

pi's grep prints ``path:N: text`` per match and find one path per line, relative to the searched
folder, with nothing marking where a path ends: a folder name holding a newline (pi makes one for
a cwd that holds one) splits one line in two, and the second half no longer looks like a private
path. The envelope now keeps a line only when it names an existing entry of the searched tree,
exactly; one line that does not withholds the whole result. Real pi's own grep and find (under
node, as pi runs them, with ripgrep and fd) make the results here, and the envelope's
``filterSearch`` judges them; the last test runs a real pi worker scripted by the fake model.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import read_events
from model_script import tool_results
from pi_support import pi_bin, pi_dist, pi_jiti, pi_search_path, pi_temp
from pilabs import PiPair, run_worker, scoped_profile
from waiting import wait_for

from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.testing.fake_model import Reply

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too

SECRET = "SECRET-28-5"
SECRET_NAME = "secret-name-28"
BREAK = "from a private folder that holds a name with a line break"


def tree(base: Path, *, split: bool) -> Path:
    """The searched folder: public files (one named like a notice, one holding ``:1: ``, a
    symlink loop), a private root ``secrets`` and, with ``split``, folders in it whose names hold
    a newline, and the files an attacker would plant where the second halves point."""
    work = base / "work"
    (work / "notes").mkdir(parents=True)
    (work / "notes" / "plain.txt").write_text("token=public\n")
    (work / "[x] notes.txt").write_text("token=bracket\n")
    (work / "secrets:1: x").write_text("token=colon\n")
    (work / "loop").symlink_to("loop")
    (work / "secrets").mkdir()
    (work / "secrets" / "key.txt").write_text("token=hidden-key\n")
    if split:
        newline = work / "secrets" / "--work-a\nb--"
        newline.mkdir()
        (newline / f"2026_{SECRET_NAME}.jsonl").write_text(f'{{"token=": "{SECRET}"}}\n')
        (work / "b--").mkdir()
        (work / "b--" / f"2026_{SECRET_NAME}.jsonl").write_text("token=decoy\n")
        # The same trick with pi's context separator: the first half parses as `secrets/--w--`
        # (an existing folder), so it looks like a private line and the second half like a match.
        (work / "secrets" / "--w--").mkdir()
        crafted = work / "secrets" / "--w---1- x\nc--"
        crafted.mkdir()
        (crafted / "s.jsonl").write_text(f"token={SECRET}\n")
        (work / "c--").mkdir()
        (work / "c--" / "s.jsonl").write_text("token=decoy\n")
    return work


def run_filter(
    base: Path, work: Path, calls: list[dict[str, Any]], events: list[dict[str, Any]], root: str = "secrets"
) -> Any:
    """Each call run by pi's own grep or find tool on ``work`` (or each synthetic ``event``),
    then envelope.ts's filterSearch with ``root`` as the private root; the answers in order."""
    jiti = pi_jiti()
    tools = pi_dist() / "core" / "tools" / "index.js"
    module = bridge_path().parent / "envelope.ts"
    script = base / "filter.mjs"
    w = json.dumps(str(work))
    script.write_text(
        f"import {{ createJiti }} from {json.dumps(str(jiti))};\n"
        f"import * as tools from {json.dumps(str(tools))};\n"
        f"const m = await createJiti(import.meta.url).import({json.dumps(str(module))});\n"
        f"const searched = m.physical({w});\n"
        "const e = { allowed: [], sessionsDirs: [],\n"
        f"  privateRoots: [{{ real: searched + '/' + {json.dumps(root)}, what: 's' }}] }};\n"
        "const hidden = m.hiddenFrom(e, searched);\n"
        "const out = [];\n"
        f"for (const call of {json.dumps(calls)}) {{\n"
        "  const make = call.tool === 'grep'\n"
        "    ? tools.createGrepToolDefinition : tools.createFindToolDefinition;\n"
        "  let event;\n"
        "  try {\n"
        f"    const r = await make({w}).execute('id', call.args, undefined, undefined, undefined);\n"
        "    event = { content: r.content, details: r.details, isError: false };\n"
        "  } catch (error) {\n"
        "    event = { content: [{ type: 'text', text: String(error.message) }], isError: true };\n"
        "  }\n"
        "  const raw = event.content.map((p) => p.text).join('');\n"
        "  out.push({ raw, result: m.filterSearch(call.tool, event, searched, hidden) ?? null });\n"
        "}\n"
        f"for (const event of {json.dumps(events)}) {{\n"
        "  out.push({ raw: '', result: m.filterSearch(event.tool, event, searched, hidden) ?? null });\n"
        "}\n"
        "console.log(JSON.stringify(out));\n"
    )
    env = dict(os.environ, TMPDIR=pi_temp(base), PATH=pi_search_path(pi_bin()))  # as install-pi's wrapper
    done = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, timeout=120, check=False, env=env, cwd=work
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def text_of(result: dict[str, Any]) -> str:
    return "\n".join(str(p.get("text", "")) for p in result["content"])


def test_a_name_holding_a_newline_withholds_the_whole_search_result(tmp_path: Path) -> None:
    """The issue's case on pi's own grep and find: the split lines (each half, the crafted
    ``-1- `` name too) never reach the model; the result says why and what to do instead."""
    work = tree(tmp_path, split=True)
    grep, find, context = run_filter(
        tmp_path, work,
        [{"tool": "grep", "args": {"pattern": "token="}},
         {"tool": "find", "args": {"pattern": "*.jsonl"}},
         {"tool": "grep", "args": {"pattern": "token=", "context": 1}}],
        [],
    )  # fmt: skip
    assert SECRET in grep["raw"] and SECRET_NAME in find["raw"], "pi's own tools did find them"
    for answer in (grep, find, context):
        result = answer["result"]
        assert result is not None, answer["raw"]
        shown = json.dumps(result)
        assert SECRET not in shown and SECRET_NAME not in shown and "token=" not in shown, shown
        assert result["isError"] is True and result["details"] == {}
        said = text_of(result)
        assert "result was withheld" in said and ("names no file of the searched" in said or BREAK in said)
        assert "Search a folder that holds none of them" in said


def test_a_split_whose_first_half_is_a_private_entry_is_withheld_too(tmp_path: Path) -> None:
    """Both halves name entries: `secrets/--w--` (a private folder beside `--w--\\nd--`) and
    `d--/...` (planted where the second half points). The private folder's line break is seen."""
    work = tmp_path / "work"
    (work / "secrets" / "--w--").mkdir(parents=True)
    (work / "secrets" / "--w--\nd--").mkdir()
    (work / "secrets" / "--w--\nd--" / "f.jsonl").write_text(f"token={SECRET}\n")
    (work / "d--").mkdir()
    (work / "d--" / "f.jsonl").write_text("token=decoy\n")
    (find,) = run_filter(tmp_path, work, [{"tool": "find", "args": {"pattern": "*"}}], [])
    assert "d--/f.jsonl" in find["raw"].split("\n")  # pi's find printed the second half as a path
    assert BREAK in text_of(find["result"]), find
    assert "d--" not in json.dumps(find["result"]).replace("--w--", "")


def test_a_private_folder_named_dot_dot_something_withholds_a_grep(tmp_path: Path) -> None:
    """pi's grep prints a bare file name for a relative path starting with `..` (`..state/x.json`
    becomes `x.json`), so a private folder named so would lose the prefix that marks it."""
    work = tmp_path / "work"
    (work / "..state").mkdir(parents=True)
    (work / "..state" / "x.json").write_text(f"token={SECRET}\n")
    (work / "x.json").write_text("token=planted\n")  # where the bare name points
    call = {"tool": "grep", "args": {"pattern": "token="}}
    (grep,) = run_filter(tmp_path, work, [call], [], root="..state")
    assert f"x.json:1: token={SECRET}" in grep["raw"].split("\n")  # pi's own output, prefix gone
    assert grep["result"] is not None, f"the result went to the model unchanged: {grep['raw']}"
    assert SECRET not in json.dumps(grep["result"]) and "starts with '..'" in text_of(grep["result"])


def test_each_line_is_judged_by_the_file_it_names(tmp_path: Path) -> None:
    """Without a split name, the search runs as before: public lines stay (a name starting with
    ``[`` or holding ``:1: `` included, a symlink loop too), private ones go, and pi's own
    trailing notice is kept only where pi puts it. The details pi would store in the session
    file (which the worker may read) lose the truncated text; an error naming paths is withheld."""
    work = tree(tmp_path, split=False)
    (work / "[1 results limit reached]").write_text("")
    # Two matches for a limit of one: pi 1.x notes the limit only once a further match proves it.
    (work / "notes" / "two.txt").write_text("limit-me 1\nlimit-me 2\n")
    grep, find, limited, error, aborted, truncated, bracket = run_filter(
        tmp_path, work,
        [{"tool": "grep", "args": {"pattern": "token="}},
         {"tool": "find", "args": {"pattern": "*"}},
         {"tool": "grep", "args": {"pattern": "limit-me", "limit": 1, "glob": "two.txt"}}],
        [{"tool": "grep", "isError": True,
          "content": [{"type": "text", "text": f"rg: {work}/secrets/x: Permission denied (os error 13)"}]},
         {"tool": "grep", "isError": True, "content": [{"type": "text", "text": "Operation aborted"}]},
         {"tool": "grep", "isError": False,
          "content": [{"type": "text",
                       "text": "notes/plain.txt:1: token=public\nsecrets/key.txt:1: token=hidden-key"}],
          "details": {"truncation": {"truncated": True, "maxBytes": 51200,
                                     "content": "secrets/key.txt:1: token=hidden-key"}}},
         # A line starting with `[` was kept unread; only pi's own notice, after a blank line, is.
         {"tool": "grep", "isError": False, "content": [{"type": "text",
          "text": "secrets/key.txt:1: token=hidden-key\n[token=hidden-in-a-bracket]\n\n"
                  "[10 matches limit reached]"}]}],
    )  # fmt: skip
    lines = text_of(grep["result"]).split("\n")
    assert sorted(lines[:-1]) == sorted(
        ["notes/plain.txt:1: token=public", "[x] notes.txt:1: token=bracket", "secrets:1: x:1: token=colon"]
    ), grep
    assert lines[-1].startswith("[pi-matrix envelope: 1 line(s) from private folders")
    assert "hidden-key" not in json.dumps(grep["result"])
    found = text_of(find["result"]).split("\n")
    public = {"notes/plain.txt", "[x] notes.txt", "secrets:1: x", "loop", "[1 results limit reached]"}
    assert public <= set(found), found
    assert not any(line.startswith("secrets/") for line in found), found
    # pi's notice after a blank line is pi's, not a line to attribute: the result goes unchanged.
    assert limited["raw"].endswith("\n\n[1 matches limit reached. Use limit=2 for more, or refine pattern]")
    assert limited["result"] is None
    assert "withheld" in text_of(error["result"]) and "Permission denied" not in json.dumps(error["result"])
    assert aborted["result"] is None
    details = truncated["result"]["details"]
    assert details == {"filtered": 1, "truncation": {"truncated": True, "maxBytes": 51200}}
    assert "hidden-key" not in json.dumps(truncated["result"])
    assert "hidden-in-a-bracket" not in json.dumps(bracket["result"])
    assert "line 2 names no file" in text_of(bracket["result"])


def test_a_real_pi_search_over_a_split_session_folder_never_shows_the_transcript(
    pilab: PiPair,
) -> None:
    """Issue 28.5 on real pi: a full-scope worker greps and finds over pi's agent dir, whose
    sessions folder holds another session's folder named with a newline (and the attacker's
    decoys where its second half points). Nothing of that transcript, not even its file name,
    reaches the model; a search of the same folder for public text still runs and answers."""
    lab, llm = pilab
    agent_dir = lab.agent_dir
    pi_search_path(pi_bin(), agent_dir)  # pi finds rg and an fd it can run (install-pi's wrapper)
    split = agent_dir / "sessions" / "--work-a\nb--"
    split.mkdir(parents=True)
    (split / f"2026_{SECRET_NAME}.jsonl").write_text(f'{{"type":"message","token=":"{SECRET}"}}\n')
    (agent_dir / "b--").mkdir()
    (agent_dir / "b--" / f"2026_{SECRET_NAME}.jsonl").write_text("token=decoy\n")
    (agent_dir / "notes").mkdir()
    (agent_dir / "notes" / "plain.txt").write_text("token=public-28\n")
    scoped_profile(lab, "pi-full-search", tools=["read", "grep", "find"], write_paths=[])

    agent = run_worker(
        lab, llm, "pi-full-search",
        Reply(tool="grep", arguments={"pattern": "token=", "path": str(agent_dir)}),
        Reply(tool="find", arguments={"pattern": "*.jsonl", "path": str(agent_dir)}),
        Reply(tool="grep", arguments={"pattern": "public-28", "path": str(agent_dir)}),
        Reply(tool="find", arguments={"pattern": "plain*", "path": str(agent_dir)}),
    )  # fmt: skip

    everything = json.dumps(llm.requests)
    assert SECRET not in everything and SECRET_NAME not in everything
    grep, find, public, listed = tool_results(llm)
    assert "grep result was withheld" in grep and ("names no file" in grep or BREAK in grep), grep
    assert "find result was withheld" in find, find
    assert "notes/plain.txt:1: token=public-28" in public, public  # the search really runs
    assert listed.strip() == "notes/plain.txt", listed
    own = Path(agent.session_file).read_text()
    assert SECRET not in own and SECRET_NAME not in own  # nor in what the worker may read back
    wait_for("the host to record the end", lambda: lab.store.get(agent.key).exit is not None)
    assert read_events(lab.state, agent.key, "tool_blocked") == []  # withheld, not blocked
