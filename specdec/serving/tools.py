"""Tool calls (`tools`, `tool_choice`) in OpenAI's shape, through the grammar machinery.

The model sees the tools through its own chat template (`encode_chat(tools=...)`). With
`tool_choice` "required" or a named function the answer is constrained (`specdec.grammar`)
to one call as JSON, `{"name": ..., "arguments": {...}}`, the arguments under the
function's own parameter schema, so it always parses; with "auto" the model answers
freely and calls written in the Hermes / Qwen format (`<tool_call>{json}</tool_call>`,
what their templates teach) are read out of the text; "none" leaves the answer as text.
"""

from __future__ import annotations

import json

from specdec.params import Grammar
from specdec.serving.tool_stream import ToolCallParser, merged_calls


def call_schema(functions: list[dict]) -> dict:
    """One call of any of `functions` (OpenAI's function objects) as a JSON schema."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_grammar(functions: list[dict], choice) -> Grammar | None:
    """The constraint for `tool_choice` ("auto"/"none"/None: none)."""
    if choice == "required":
        return Grammar("json_schema", json.dumps(call_schema(functions)))
    if isinstance(choice, dict):
        named = [f for f in functions if f["name"] == choice["function"]["name"]]
        return Grammar("json_schema", json.dumps(call_schema(named)))
    return None


def tool_calls(text: str, functions: list[dict], forced: bool) -> list[dict] | None:
    """OpenAI's `tool_calls` read from an answer: the whole text when the call was forced,
    else each `<tool_call>` block naming a known function; None when there are none.
    (`tool_stream.ToolCallParser` reads them, so streamed calls read the same.)"""
    parser = ToolCallParser({f["name"] for f in functions}, forced)
    return merged_calls(parser, text)[1]


def template_message(message: dict) -> dict:
    """A message as chat templates read it: an assistant's earlier calls with their
    arguments as objects (OpenAI sends them as JSON strings)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        function = dict(call.get("function", {}))
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except json.JSONDecodeError:
                pass
        out.append({**call, "function": function})
    return {**message, "tool_calls": out}
