"""The streamed tool-call parser: OpenAI's delta shape, and the same calls and content
however the answer is cut into deltas (what makes streamed == non-streamed)."""

import json
import random

import pytest

from specdec.serving.tool_stream import ToolCallParser, merged_calls

NAMES = {"get_weather", "get_time"}
CALL = (
    '{"name": "get_weather", "arguments": '
    '{"city": "Paris", "note": "a \\"}\\" b", "d": [1, {"x": 2}]}}'
)
ANSWERS = [
    ("plain text, no calls at all  \n", False),
    ("Let me check.\n<tool_call>\n" + CALL + "\n</tool_call>", False),
    (
        "<tool_call>" + CALL + "</tool_call>\n<tool_call>"
        '{"name": "get_time", "arguments": {}}</tool_call>\n',
        False,
    ),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>text after', False),
    ('<tool_call>{"arguments": {"a": 1}, "name": "get_time"}</tool_call>', False),
    ("a < b <tool and <tool_cal are text", False),
    ("<tool_call>" + CALL[:40], False),  # cut off by max_tokens
    ('{"name":"get_weather","arguments":{"city":"Oslo","days":3}}', True),
    ('{"name":"get_time","arguments":{}}', True),
]


def streamed(text: str, forced: bool, rng: random.Random) -> tuple[str | None, list | None]:
    """Feed `text` in random pieces; add up the deltas as a client does."""
    parser = ToolCallParser(NAMES, forced)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for part in delta.get("tool_calls", ()):
            if part["index"] not in calls:  # the first fragment names the call
                assert {"index", "id", "type", "function"} <= set(part)
                assert part["type"] == "function" and part["function"]["name"] in NAMES
                calls[part["index"]] = {"name": part["function"]["name"], "arguments": ""}
            else:
                assert set(part) == {"index", "function"} and set(part["function"]) == {"arguments"}
            calls[part["index"]]["arguments"] += part["function"]["arguments"]
    return content or None, [calls[i] for i in sorted(calls)] or None


@pytest.mark.parametrize("text,forced", ANSWERS)
def test_any_cut_gives_the_whole_texts_answer(text, forced):
    content, calls = merged_calls(ToolCallParser(NAMES, forced), text)
    whole = None if calls is None else [c["function"] for c in calls]
    rng = random.Random(0)
    for _ in range(60):
        assert streamed(text, forced, rng) == (content, whole)


def test_what_the_calls_and_content_are():
    content, calls = merged_calls(ToolCallParser(NAMES, False), ANSWERS[1][0])
    assert content == "Let me check."
    (call,) = calls
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == json.loads(CALL)["arguments"]
    _, calls = merged_calls(ToolCallParser(NAMES, False), ANSWERS[2][0])
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert merged_calls(ToolCallParser(NAMES, False), ANSWERS[3][0]) == ("text after", None)
    _, (call,) = merged_calls(ToolCallParser(NAMES, False), ANSWERS[4][0])
    assert json.loads(call["function"]["arguments"]) == {"a": 1}
    assert merged_calls(ToolCallParser(NAMES, False), ANSWERS[5][0]) == (ANSWERS[5][0], None)
    text = ANSWERS[0][0]
    assert merged_calls(ToolCallParser(NAMES, False), text) == (text, None)
    _, (call,) = merged_calls(ToolCallParser(NAMES, True), ANSWERS[7][0])
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo","days":3}'}


def test_arguments_stream_as_they_are_written():
    parser = ToolCallParser(NAMES, True)
    assert parser.feed('{"name":"get_wea') == {}
    first = parser.feed('ther","arguments":{"ci')
    assert first["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    assert parser.feed('ty":"Oslo"}')["tool_calls"][0]["function"] == {"arguments": 'ty":"Oslo"}'}
    assert parser.feed("}") == {} and parser.finish() == {} and parser.called
