"""Tool calls read out of answers (`specdec.serving.tools`)."""

import json

from specdec.serving.tools import call_schema, template_message, tool_calls

FUNCTIONS = [{"name": "get_weather", "parameters": {"type": "object"}}, {"name": "get_time"}]


def test_hermes_blocks_in_free_text_become_calls():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    calls = tool_calls(text, FUNCTIONS, forced=False)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_text_without_calls_or_with_unknown_names_stays_text():
    assert tool_calls("just text", FUNCTIONS, forced=False) is None
    assert (
        tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', FUNCTIONS, False)
        is None
    )
    assert tool_calls("<tool_call>{not json}</tool_call>", FUNCTIONS, forced=False) is None


def test_a_forced_answer_is_one_call():
    (call,) = tool_calls('{"name": "get_time", "arguments": {"tz": "UTC"}}', FUNCTIONS, forced=True)
    assert call["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}


def test_schema_of_one_or_several_functions():
    assert call_schema(FUNCTIONS[:1])["properties"]["name"] == {"const": "get_weather"}
    assert len(call_schema(FUNCTIONS)["anyOf"]) == 2


def test_earlier_calls_reach_templates_with_object_arguments():
    message = {
        "role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    assert template_message(message)["tool_calls"][0]["function"]["arguments"] == {"a": 1}
