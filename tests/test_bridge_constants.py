"""The TypeScript bridge's copies of shared constants stay equal to the Python ones.

The bridge is loaded by pi (``pi -e bridge.ts``) and cannot import Python, so it keeps its own
copies of a few facts the two sides must agree on: the entry key pattern, the allowed-paths
limits, the agent-launching tools, the stop word, the mailbox formats and the environment names.
Each is read out of the .ts source here and compared with its Python home, so changing one side
alone fails this test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pi_tmux_matrix import contract, launch_contract
from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.cli.base import STOP_WORD
from pi_tmux_matrix.dispatch.profile import AGENT_LAUNCHING_TOOLS
from pi_tmux_matrix.identity import ID_PATTERN, Role
from pi_tmux_matrix.matrix.mailbox import MESSAGE_KINDS, AgentNotices, Inbox
from pi_tmux_matrix.matrix.store import MatrixStore

BRIDGE = bridge_path().parent
# Names the bridge reads that belong to pi itself, not to the product.
PI_OWN_ENV = frozenset({"PI_CODING_AGENT_DIR", "PI_CODING_AGENT_SESSION_DIR"})


def source(name: str) -> str:
    return (BRIDGE / name).read_text()


def const(name: str, file: str) -> str:
    match = re.search(rf"\bconst {name} = (.+?);\s*(?://.*)?$", source(file), re.MULTILINE)
    assert match is not None, f"{file} no longer defines {name}"
    return match.group(1).strip()


def number(expression: str) -> int:
    assert re.fullmatch(r"[0-9_ *]+", expression), expression
    value = 1
    for factor in expression.replace("_", "").split("*"):
        value *= int(factor)
    return value


def test_the_entry_key_pattern_is_the_roles_and_the_id_pattern() -> None:
    expected = "/^(" + "|".join(r.value for r in Role) + ")-" + ID_PATTERN.pattern + "$/"
    assert const("KEY_PATTERN", "common.ts") == expected


def test_the_allowed_paths_limits_are_the_contracts() -> None:
    assert number(const("MAX_BYTES", "envelope.ts")) == launch_contract.ALLOWED_PATHS_MAX_BYTES
    assert number(const("MAX_ITEMS", "envelope.ts")) == launch_contract.ALLOWED_PATHS_MAX_ITEMS
    assert json.loads(const("ENV_ALLOWED", "envelope.ts")) == contract.ENV_ALLOWED_PATHS


def test_the_agent_launching_tools_are_the_profile_loaders() -> None:
    assert set(json.loads(const("AGENT_LAUNCHING_TOOLS", "envelope.ts"))) == set(AGENT_LAUNCHING_TOOLS)


def test_the_stop_word_is_the_clis() -> None:
    assert json.loads(const("STOP_WORD", "master.ts")) == STOP_WORD


def test_the_tools_deadline_bound_is_the_dispatchers() -> None:
    from pi_tmux_matrix.dispatch.request import MAX_DEADLINE_S

    assert number(const("MAX_DEADLINE_S", "master.ts").split("//")[0].strip()) == MAX_DEADLINE_S


@pytest.mark.parametrize("file", sorted(p.name for p in BRIDGE.glob("*.ts")))
def test_every_env_name_the_bridge_reads_is_owned_by_the_contract(file: str) -> None:
    names = vars(contract).items()
    owned = {value for name, value in names if name.startswith("ENV_") and isinstance(value, str)}
    owned |= contract.FORK_RUN_ENV
    read = set(re.findall(r"\benv\.([A-Z][A-Z0-9_]*)", source(file)))
    assert read - owned - PI_OWN_ENV == set(), f"{file} reads names contract.py does not own"


def test_every_report_kind_the_bridge_posts_is_one_the_host_takes() -> None:
    sources = [file.read_text() for file in BRIDGE.glob("*.ts")]
    posted = {kind for text in sources for kind in re.findall(r'\bpost\("([a-z_]+)"', text)}
    assert posted and posted <= MESSAGE_KINDS


def test_the_bridges_inbox_message_is_what_inbox_writes_and_reads(tmp_path: Path) -> None:
    """``post()`` in common.ts writes ``<state>/mailbox/<key>/<15-digit ms>-<hex>.json`` holding
    ``{kind, text, at, sender}``: the shape of ``Inbox.post``, which ``Inbox.take`` reads."""
    common = source("common.ts")
    assert 'path.join(STATE, "mailbox", KEY)' in common
    assert 'padStart(15, "0")' in common
    stringified = re.search(r"JSON\.stringify\(\{ kind, text, at: now, sender: \"bridge\" \}\)", common)
    assert stringified is not None, "common.ts post() writes another shape"
    store = MatrixStore(tmp_path / "state")
    written = Inbox(store, "worker-k1").post("result", "{}", sender="bridge")
    assert re.fullmatch(r"[0-9]{15}-[0-9a-f]{8}\.json", written.name)
    assert set(json.loads(written.read_bytes())) == {"kind", "text", "at", "sender"}


def test_the_agents_notices_are_read_with_the_fields_the_host_writes(tmp_path: Path) -> None:
    notices = AgentNotices(MatrixStore(tmp_path / "state"), "worker-k1")
    notices.notify("steer", "hello")
    line = json.loads(notices.path.read_text().splitlines()[0])
    assert {"type", "message"} <= set(line)
    for file in ("bridge.ts", "master.ts"):
        assert "notice.message" in source(file)
    assert "notice.type" in source("bridge.ts")


def test_the_tools_workspace_name_checks_are_the_id_and_tmux_session_patterns() -> None:
    from pi_tmux_matrix.dispatch import tmux_model

    assert const("ID", "master.ts") == f"/^{ID_PATTERN.pattern}$/"
    assert const("SESSION_NAME", "master.ts") == f"/^{tmux_model._SESSION.pattern}$/"


def test_the_fork_result_notice_and_its_acknowledgement_are_what_the_host_reads(tmp_path: Path) -> None:
    """A ``fork_result`` notice (the host tells it) is delivered by bridge.ts to forktool.ts,
    whose ``notice_taken`` names the run: what BridgeReports marks delivered."""
    from pi_tmux_matrix.matrix.mailbox import EventLog
    from pi_tmux_matrix.supervise.bridge_reports import BridgeReports

    assert "fork_result" in MESSAGE_KINDS
    assert 'kind === "fork_result"' in source("bridge.ts")
    assert 'event: "notice_taken", id: noticeId, kind: "fork_result", runId' in source("forktool.ts")
    reports = BridgeReports()
    events = EventLog(MatrixStore(tmp_path / "state"), "master-boss")
    report = {"event": "notice_taken", "id": "n1", "kind": "fork_result", "runId": "run-1"}
    reports.receive("bridge", json.dumps(report), events)
    assert reports.fork_results_accepted == {"run-1"}


def test_the_bridges_usage_claim_is_the_dispatchers_format() -> None:
    """usage.ts reads the round's claim file from the line the marker instruction writes, and
    writes only the fields a claim may hold (pi's usage record, model, provider)."""
    from pi_tmux_matrix.dispatch.request import USAGE_LINE
    from pi_tmux_matrix.dispatch.usage import _COSTS, _LABELS, _TOKENS, CLAIM_SUFFIX

    assert json.loads(const("LINE", "usage.ts")) == USAGE_LINE
    assert const("NAME", "usage.ts").endswith(CLAIM_SUFFIX.replace(".", "\\.") + "$/")
    counts = re.search(r"COUNTS = (\[.*?\]) as const", source("usage.ts"))
    costs = re.search(r"COSTS = (\[.*?\]) as const", source("usage.ts"))
    assert counts is not None and costs is not None
    assert json.loads(counts.group(1)) == list(_TOKENS) and json.loads(costs.group(1)) == list(_COSTS)
    assert all(f"claim.{label} = " in source("usage.ts") for label in _LABELS)


def test_every_flag_the_tool_passes_has_the_tools_name_for_its_errors() -> None:
    """A CLI error about a flag the tool passed names the tool's parameter (toolwords.ts): a flag
    added to fire_task's or the workspace actions' argv without its name there fails here."""
    passed = set(re.findall(r'push\("(--[a-z-]+)"', source("master.ts")))
    named = set(re.findall(r'^\s*"(--[a-z-]+)": "[A-Za-z]+",', source("toolwords.ts"), re.MULTILINE))
    # Never the model's: the output shape, the caller's registration, list_jobs' usage switch.
    ours = {"--json", "--parent-pid", "--parent-session", "--usage"}
    assert passed - ours <= named, sorted(passed - ours - named)
    assert "--launch-key" in named and "--workspace" in named and "--name" in named


def test_the_tool_tells_a_stops_preview_by_the_clis_not_confirmed_message() -> None:
    from pi_tmux_matrix.errors import NotConfirmed

    said = str(NotConfirmed(STOP_WORD))
    assert said.startswith("nothing was stopped;")
    assert 'startsWith("pi-matrix: error: nothing was stopped;")' in source("master.ts")
