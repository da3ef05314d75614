"""Tool calls in Qwen3's own format, parsed from the policy's text, and the tools they call.

The policy writes, anywhere in its turn, one or more

    <tool_call>
    {"name": "python", "arguments": {"code": "print(123 * 456)"}}
    </tool_call>

(the format Qwen3's chat template declares in its tools header and renders assistant tool calls
in). parse_tool_calls returns each as a ToolCall, or as a MalformedCall holding the error the
environment answers with (bad JSON, no name, arguments not an object, an unclosed tag): a
malformed call is an observation for the policy, never an exception. Tool.check names what is
wrong with a call's arguments against the tool's JSON-schema parameters (unknown tool, missing,
unexpected or mistyped argument), again as text for the policy.

Dimension legend: none (text).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}
MAX_ERROR_CHARS = 200  # how much of a malformed call an error observation quotes


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    """A call the environment cannot run; ``error`` is what it answers."""

    error: str


def parse_tool_calls(text: str) -> list[ToolCall | MalformedCall]:
    """Every <tool_call>...</tool_call> of ``text`` in order, parsed; an opening tag left
    unclosed at the end is a MalformedCall too. Never raises."""
    out: list[ToolCall | MalformedCall] = []
    for body in _CALL.findall(text):
        out.append(_parse_one(body.strip()))
    tail = _CALL.sub("", text)
    if OPEN in tail:
        out.append(MalformedCall(f"error: {OPEN} without {CLOSE}; close the call with {CLOSE}."))
    return out


def _parse_one(body: str) -> ToolCall | MalformedCall:
    quoted = body[:MAX_ERROR_CHARS]
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:
        return MalformedCall(f"error: the tool call is not valid JSON ({e}): {quoted}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return MalformedCall(
            'error: a tool call is a JSON object {"name": ..., "arguments": {...}}, got: ' + quoted
        )
    args = obj.get("arguments", {})
    if isinstance(args, str):  # the template accepts arguments as a JSON string too
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            pass
    if not isinstance(args, dict):
        return MalformedCall(f"error: the arguments of {obj['name']!r} must be a JSON object.")
    return ToolCall(obj["name"], args)


@dataclasses.dataclass(frozen=True)
class Tool:
    """A function the policy may call: its declaration (what the chat template lists in the
    system prompt) and ``fn(**arguments) -> str`` (its response's text)."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema: {"type": "object", "properties", "required"}
    fn: Callable[..., str]

    def schema(self) -> dict[str, Any]:
        """The declaration as chat templates take it in their ``tools`` list."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def check(self, arguments: Mapping[str, Any]) -> str | None:
        """What is wrong with ``arguments`` (one line for the policy), or None."""
        props = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", ()) if k not in arguments]
        unknown = [k for k in arguments if k not in props]
        if missing or unknown:
            return (
                f"error: {self.name} takes {sorted(props)}; missing {missing}, unexpected "
                f"{unknown}."
            )
        for k, v in arguments.items():
            want = _JSON_TYPES.get(props[k].get("type"))
            if want is not None and (
                not isinstance(v, want) or isinstance(v, bool) != (want is bool)
            ):
                return f"error: argument {k!r} of {self.name} must be a {props[k]['type']}."
        return None


def answer_call(tools: Mapping[str, Tool], call: ToolCall | MalformedCall) -> Callable[[], str]:
    """A job that gives the call's response text: the tool's output, or the error the call
    earned. Jobs run wherever the caller likes (here, on a pool); they never raise."""
    if isinstance(call, MalformedCall):
        return lambda: call.error
    tool = tools.get(call.name)
    if tool is None:
        return lambda: f"error: unknown tool {call.name!r}; the tools are {sorted(tools)}."
    problem = tool.check(call.arguments)
    if problem is not None:
        return lambda: problem

    def run() -> str:
        try:
            return str(tool.fn(**call.arguments))
        except Exception as e:  # the tool's own failure is the policy's observation
            return f"error: {tool.name} failed: {type(e).__name__}: {e}"

    return run
