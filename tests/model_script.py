"""Scripting and reading the fake model's side, for the project's own tests.

The model is the shipped one (:mod:`pi_tmux_matrix.testing.fake_model`: ``FakeModel``, ``Reply``,
``write_pi_agent_dir``); what is here is the tests' own: steps that answer each request from the
tool result pi sent back, a call of the bridge's ``tmux_agent_manager``, and what the model read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pi_tmux_matrix.testing.fake_model import FakeModel, Reply, Request, text_of


def _tool_text(message: Any) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _messages(request: Request) -> list[Any]:
    messages = request.get("messages")
    return messages if isinstance(messages, list) else []


def last_tool_result(request: Request) -> str:
    """The text of the last tool result in ``request`` (what the model read last), or ``""``."""
    for message in reversed(_messages(request)):
        if message.get("role") == "tool":
            return _tool_text(message)
    return ""


def tool_results(model: FakeModel) -> list[str]:
    """The text of every tool result in pi's last request, in order (what the model read)."""
    messages = _messages(model.requests[-1]) if model.requests else []
    return [_tool_text(m) for m in messages if m.get("role") == "tool"]


def last_conversation(model: FakeModel) -> list[str]:
    """The user-side messages of the model's latest request: the whole conversation it was sent."""
    messages = _messages(model.requests[-1]) if model.requests else []
    return [text_of(m) for m in messages if m.get("role") == "user"]


class Scripted:
    """Replies computed from what pi sent: each step sees the previous tool result."""

    def __init__(self, *steps: Callable[[str], Reply]) -> None:
        self.steps = list(steps)

    def __call__(self, request: Request) -> Reply:
        step = self.steps.pop(0) if self.steps else (lambda _r: Reply(text="ok"))
        return step(last_tool_result(request))


def tool(**arguments: Any) -> Callable[[str], Reply]:
    """A :class:`Scripted` step: call the bridge's ``tmux_agent_manager`` with ``arguments``."""
    return lambda _previous: Reply(tool="tmux_agent_manager", arguments=arguments)
