"""Bad input gets the right status and an OpenAI error body; the server keeps serving.
A client that disconnects mid-stream frees its batch row."""

import json
import threading
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from specdec.engine import Engine
from specdec.serving.app import build_app

from tiny import hf_tiny, native_from_hf, tiny_tokenizer
from tiny_server import MODEL

OK = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
CMPL, CHAT_URL = "/v1/completions", "/v1/chat/completions"

# (name, method, path, body (dict, or raw str sent as JSON), status, text in the message)
CASES = [
    ("malformed JSON", "POST", CMPL, '{"model": "tiny", "prompt": ', 400, "not valid JSON"),
    ("body is a list", "POST", CMPL, "[1, 2]", 400, "valid dictionary"),
    ("missing model", "POST", CMPL, {"prompt": "x"}, 400, "model: Field required"),
    ("missing prompt", "POST", CMPL, {"model": MODEL}, 400, "prompt: Field required"),
    ("prompt wrong type", "POST", CMPL, {**OK, "prompt": 5}, 400, "prompt"),
    ("temperature not a number", "POST", CMPL, {**OK, "temperature": "hot"}, 400, "temperature"),
    ("temperature negative", "POST", CMPL, {**OK, "temperature": -1}, 400, "temperature"),
    ("temperature above 2", "POST", CMPL, {**OK, "temperature": 5}, 400, "temperature"),
    ("top_p zero", "POST", CMPL, {**OK, "top_p": 0}, 400, "top_p"),
    ("top_p above 1", "POST", CMPL, {**OK, "top_p": 1.5}, 400, "top_p"),
    ("top_k below -1", "POST", CMPL, {**OK, "top_k": -2}, 400, "top_k"),
    ("max_tokens zero", "POST", CMPL, {**OK, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens not an int", "POST", CMPL, {**OK, "max_tokens": 2.5}, 400, "max_tokens"),
    ("n zero", "POST", CMPL, {**OK, "n": 0}, 400, "n:"),
    ("n too large", "POST", CMPL, {**OK, "n": 1000}, 400, "n:"),
    ("seed negative", "POST", CMPL, {**OK, "seed": -1}, 400, "seed"),
    ("five stop strings", "POST", CMPL, {**OK, "stop": list("abcde")}, 400, "at most 4"),
    ("empty stop string", "POST", CMPL, {**OK, "stop": [""]}, 400, "non-empty"),
    ("stream not a bool", "POST", CMPL, {**OK, "stream": [1]}, 400, "stream"),
    ("empty prompt", "POST", CMPL, {**OK, "prompt": ""}, 400, "prompt is empty"),
    ("empty prompt list", "POST", CMPL, {**OK, "prompt": []}, 400, "empty list"),
    ("token id past vocab", "POST", CMPL, {**OK, "prompt": [5, 100000]}, 400, "token ids"),
    ("prompt past context", "POST", CMPL, {**OK, "prompt": "x" * 5000}, 400, "context"),
    ("max_tokens past context", "POST", CMPL, {**OK, "max_tokens": 5000}, 400, "exceeds"),
    ("unknown model", "POST", CMPL, {**OK, "model": "gpt-9"}, 404, "does not exist"),
    ("logprobs past 20", "POST", CMPL, {**OK, "logprobs": 30}, 400, "logprobs"),
    ("presence penalty past 2", "POST", CMPL, {**OK, "presence_penalty": 2.5}, 400, "presence"),
    ("chat: no messages", "POST", CHAT_URL, {"model": MODEL}, 400, "messages"),
    ("chat: empty messages", "POST", CHAT_URL, {**CHAT, "messages": []}, 400, "messages"),
    ("chat: bad role", "POST", CHAT_URL, {**CHAT, "messages": [{"role": "x"}]}, 400, "role"),
    (
        "chat: content object",
        "POST",
        CHAT_URL,
        {**CHAT, "messages": [{"role": "user", "content": {"a": 1}}]},
        400,
        "content",
    ),  # noqa: E501
    ("chat: tools", "POST", CHAT_URL, {**CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("chat: unknown model", "POST", CHAT_URL, {**CHAT, "model": "x"}, 404, "does not exist"),
    ("unknown route", "POST", "/v1/edits", OK, 404, "Not Found"),
    ("wrong method", "GET", CMPL, None, 405, "Method Not Allowed"),
]


@pytest.mark.parametrize("name,method,path,body,status,text", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_status_and_error_body(server, name, method, path, body, status, text):
    if isinstance(body, str):
        kwargs = {"content": body, "headers": {"content-type": "application/json"}}
    else:
        kwargs = {"json": body} if body is not None else {}
    response = httpx.request(method, server.url + path, timeout=30, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert text in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] in ("invalid_request_error", "not_found_error")


def test_server_still_answers_after_bad_input(server):
    assert len(CASES) >= 20
    # ignore_eos: a sampled end-of-text from the random tiny model must not shorten the answer
    response = httpx.post(server.url + CMPL, json={**OK, "ignore_eos": True}, timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert server.metric('specdec_rejected_requests_total{status="400"}') >= 20


def test_disconnect_mid_stream_frees_the_slot(server, offline):
    long = {"model": MODEL, "prompt": "aaaa", "max_tokens": 3500, "stream": True}
    long |= {"ignore_eos": True, "temperature": 0}
    other_result = {}

    def other_stream():
        body = {"model": MODEL, "prompt": "zzz", "max_tokens": 60, "temperature": 0}
        with httpx.stream("POST", server.url + CMPL, json={**body, "stream": True}) as r:
            other_result["lines"] = [line for line in r.iter_lines() if line]

    aborted_before = server.metric('specdec_requests_total{finish_reason="abort"}')
    with httpx.stream("POST", server.url + CMPL, json=long, timeout=60) as response:
        lines = response.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few chunks, then hang up
        assert all(g.startswith("data: ") or g == "" for g in got)
        assert server.metric("specdec_batch_size") >= 1
        other = threading.Thread(target=other_stream)
        other.start()
    deadline = time.monotonic() + 30
    while server.metric('specdec_requests_total{finish_reason="abort"}') == aborted_before:
        assert time.monotonic() < deadline, "the aborted request was never freed"
        time.sleep(0.1)
    other.join(timeout=60)
    deadline = time.monotonic() + 30
    while server.metric("specdec_batch_size") != 0:
        assert time.monotonic() < deadline, "a row stayed busy"
        time.sleep(0.1)
    assert other_result["lines"][-1] == "data: [DONE]"
    chunks = [json.loads(x[6:]) for x in other_result["lines"][:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == offline("zzz", 60)


# ---- in-process app: API key and a full queue ----------------------------------------


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(1)
    return Engine(native_from_hf(hf_tiny("qwen2")), tiny_tokenizer(), frozenset(), max_len=128)


def test_api_key_required_when_set(engine):
    app = build_app(engine, MODEL, api_key="sesame")
    with TestClient(app) as client:
        missing = client.post(CMPL, json=OK)
        wrong = client.post(CMPL, json=OK, headers={"Authorization": "Bearer nope"})
        right = client.post(CMPL, json=OK, headers={"Authorization": "Bearer sesame"})
        models = client.get("/v1/models")
        health = client.get("/health")
    assert missing.status_code == 401 and "missing API key" in missing.json()["error"]["message"]
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert right.status_code == 200 and models.status_code == 401 and health.status_code == 200


def test_queue_full_is_429(engine):
    app = build_app(engine, MODEL, max_queue=2)
    with TestClient(app) as client:
        full = client.post(CMPL, json={**OK, "n": 3})
        fits = client.post(CMPL, json={**OK, "n": 2})
    assert full.status_code == 429 and full.json()["error"]["type"] == "rate_limit_error"
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 2


def test_commands_replayed_on_a_follower_give_the_same_tokens(engine):
    """Under TP, ranks other than 0 replay rank 0's per-step commands (`follow`): an
    unseeded sampled request must come out identical on both."""
    from specdec.serving.async_engine import follow

    recorded = []

    def record(commands):
        recorded.append(list(commands))
        return commands

    body = {**OK, "temperature": 1.0, "max_tokens": 12, "n": 2}
    with TestClient(build_app(engine, MODEL, sync=record)) as client:
        texts = [c["text"] for c in client.post(CMPL, json=body).json()["choices"]]
    follower = Engine(engine.model, engine.tokenizer, frozenset(), max_len=128)
    seqs = []
    add = follower.add_request
    follower.add_request = lambda *a: seqs.append(add(*a)) or seqs[-1]
    replay = iter(recorded)
    follow(follower, lambda _: next(replay))
    assert [follower.completion(s).text for s in seqs] == texts and texts[0] != texts[1]
