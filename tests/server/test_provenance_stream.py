"""Per-token provenance in the stream (`stream_options.include_speculation`) and the
per-request `speculate` field: the records match the engine's own accept/reject
decisions, add up to the text and the usage figures, and leave the stream untouched
when not asked for."""

import json

import httpx
import openai
import pytest

from scripted import SCRIPT, K, decisions, scripted_engine, serving
from tiny_server import MODEL

CHUNK_KEYS = {"id", "object", "created", "model", "choices"}
CHAT_CHOICE_KEYS = {"index", "delta", "logprobs", "finish_reason"}


def sse(url: str, body: dict, api_key: str | None = None) -> list[dict]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    chunks = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def tokens_of(chunks: list[dict]) -> list[dict]:
    return [
        t
        for c in chunks
        for ch in c["choices"]
        for t in ch.get("speculation", {}).get("tokens", [])
    ]


def expected_kinds(steps: list[tuple[int, int]], generated: int) -> list[str]:
    """Token kinds from (drafted, accepted) per decode step: what the page must colour."""
    kinds = ["plain"]
    for drafted, accepted in steps:
        own = "plain" if drafted == 0 else "bonus" if accepted == drafted else "recovered"
        kinds += ["accepted"] * accepted + [own]
    return kinds[:generated]


@pytest.fixture(scope="module")
def scripted():
    engine, acceptor = scripted_engine()
    with serving(engine) as url:
        yield url, acceptor


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_records_follow_the_engines_decisions(scripted, route):
    url, acceptor = scripted
    acceptor.log.clear()
    body = {"model": MODEL, "max_tokens": 40, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True, "include_speculation": True}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "Tell me a story"}]
        chunks = sse(url + "/v1/chat/completions", body)
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    else:
        body["prompt"] = "Once upon a time"
        chunks = sse(url + "/v1/completions", body)
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    records = tokens_of(chunks)
    usage = chunks[-1]["usage"]
    spec = usage["speculation"]

    # Every chunk's pieces add up to its own delta, so the whole stream's to the text.
    for c in chunks:
        for ch in c["choices"]:
            delta = ch["delta"].get("content", "") if route == "chat" else ch["text"]
            pieces = ch.get("speculation", {}).get("tokens", [])
            assert "".join(t["text"] for t in pieces) == (delta or "")
    assert "".join(t["text"] for t in records) == text

    # One record per token (a token split across chunks shares its index), in order.
    by_index = {}
    for t in records:
        by_index.setdefault(t["index"], t)
    assert sorted(by_index) == list(range(usage["completion_tokens"]))
    kinds = [by_index[i]["kind"] for i in range(len(by_index))]

    # The engine's decisions, step by step, and the script that drove them.
    steps = decisions(acceptor)
    assert kinds == expected_kinds(steps, usage["completion_tokens"])
    spec_steps = [(d, a) for d, a in steps if d]
    assert [a for d, a in spec_steps] == [
        min(SCRIPT[s % len(SCRIPT)], d) for s, (d, _) in enumerate(spec_steps)
    ]
    assert [by_index[i]["step"] for i in range(len(by_index))][:2] == [0, 1]
    assert all(t["window"] <= K for t in records)
    assert {t["source"] for t in records if t["kind"] == "accepted"} <= {"draft"}

    # The counts the page shows are usage.speculation's.
    drafts = [t for t in by_index.values() if t["source"] == "draft"]
    assert len(drafts) == spec["accepted_tokens"]
    assert len({t["step"] for t in by_index.values() if t["step"] > 0}) == spec["target_passes"]


def test_speculate_false_runs_plain_with_the_same_text(scripted):
    url, acceptor = scripted
    base = {"model": MODEL, "prompt": "abc", "max_tokens": 24, "temperature": 0}
    on = httpx.post(url + "/v1/completions", json=base).json()
    off = httpx.post(url + "/v1/completions", json={**base, "speculate": False}).json()
    assert off["choices"][0]["text"] == on["choices"][0]["text"]
    assert off["usage"]["speculation"]["drafted_tokens"] == 0
    assert off["usage"]["speculation"]["target_passes"] == 23
    assert on["usage"]["speculation"]["drafted_tokens"] > 0


def test_the_official_client_reads_the_records(scripted):
    url, _ = scripted
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "include_speculation": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    pieces = [
        t["text"]
        for c in chunks
        if c.choices
        for t in (c.choices[0].model_extra.get("speculation") or {}).get("tokens", [])
    ]
    assert "".join(pieces) == text and chunks[-1].usage.completion_tokens == 12


def test_without_the_option_the_stream_has_no_extension(server):
    """The real server, as before: OpenAI's chunk fields only, nothing added."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    body |= {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse(server.url + "/v1/chat/completions", body)
    for c in chunks:
        assert set(c) == CHUNK_KEYS | ({"usage"} if "usage" in c else set())
        for ch in c["choices"]:
            assert set(ch) == CHAT_CHOICE_KEYS
    assert set(chunks[-1]["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",  # OpenAI's, with the prefix cache's cached_tokens
        "speculation",
    }


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"speculate": "yes"}, "speculate"),
        ({"speculate": 1}, "speculate"),
        ({"stream": True, "stream_options": {"include_speculation": "true"}}, "stream_options"),
        ({"stream_options": {"include_speculation": True}}, "stream_options"),
    ],
)
def test_bad_values_of_the_new_fields_are_400(scripted, extra, param):
    url, _ = scripted
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 4, **extra}
    r = httpx.post(url + "/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}


def test_speculate_true_without_a_drafter_is_400():
    engine, _ = scripted_engine(drafter=False)
    with serving(engine) as url:
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 4, "speculate": True}
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "speculate"
        ok = httpx.post(url + "/v1/completions", json={**body, "speculate": False})
        assert ok.status_code == 200
        card = httpx.get(url + "/v1/models").json()["data"][0]
        assert card["speculation"] == {"drafter": False, "k_max": 0}
