"""The server as the official OpenAI client sees it: completions, chat, streaming, usage,
seeds, stop strings, and a load of concurrent streams, all against offline greedy output."""

import asyncio
import json

import httpx
import openai
import pytest

from specdec.cli import main

from tiny_server import MODEL


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_greedy_completion_equals_offline_generate(client, model_dirs, capsys):
    out = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=24, temperature=0)
    argv = ["generate", "--model", str(model_dirs[0]), "--dtype", "fp32", "--json"]
    assert main([*argv, "--max-tokens", "24", "def f(x):"]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert out.choices[0].text == offline["text"]
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == offline["prompt_tokens"]
    assert out.usage.completion_tokens == 24
    spec = out.usage.model_extra["speculation"]
    assert spec["drafted_tokens"] > 0 and 0 <= spec["accepted_tokens"] <= spec["drafted_tokens"]
    assert spec["mean_accepted_length"] == pytest.approx(
        1 + spec["accepted_tokens"] / spec["target_passes"], abs=1e-3
    )


def test_chat_equals_offline_chat(client, offline):
    messages = [{"role": "user", "content": "Say hi"}]
    out = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=20, temperature=0
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == offline("Say hi", 20, chat=True)


def test_streaming_deltas_add_up_to_the_full_text(client):
    args = dict(model=MODEL, prompt="import os\n", max_tokens=30, temperature=0)
    whole = client.completions.create(**args).choices[0].text
    chunks = list(
        client.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole and len([c for c in chunks if c.choices]) > 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 30 and not chunks[-1].choices


def test_chat_streaming(client, offline):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour"}],
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == offline("Name a colour", 16, chat=True)


def test_stop_string_across_token_boundaries(client, offline):
    free = offline("abc", 30)
    stop = free[10:13]  # three characters: three tokens of the tiny tokenizer
    expected = free[: free.find(stop)]
    args = dict(model=MODEL, prompt="abc", max_tokens=30, temperature=0, stop=[stop, "\x00"])
    out = client.completions.create(**args)
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True))
    assert streamed == expected


def test_seeded_sampling_reproduces(client):
    args = dict(model=MODEL, prompt="x = ", max_tokens=24, temperature=1.0, top_p=0.95)
    a = client.completions.create(**args, seed=7).choices[0].text
    b = client.completions.create(**args, seed=7).choices[0].text
    c = client.completions.create(**args, seed=8).choices[0].text
    assert a == b and a != c


def test_n_choices_and_top_k_extension(client):
    out = client.completions.create(
        model=MODEL, prompt="q", max_tokens=8, temperature=1.0, n=3, seed=1, extra_body={"top_k": 5}
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.completion_tokens == 24


def test_32_concurrent_streaming_clients(server, offline):
    """Every stream completes, nothing fails, every text equals the offline greedy one."""
    prompts = [f"item {i}: " for i in range(32)]

    async def one(aclient, prompt):
        stream = await aclient.completions.create(
            model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True
        )
        parts, finish = [], None
        async for chunk in stream:
            parts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        return "".join(parts), finish

    async def run_all():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        async with aclient:
            return await asyncio.gather(*(one(aclient, p) for p in prompts))

    results = asyncio.run(run_all())
    assert [finish for _, finish in results] == ["length"] * 32
    assert [text for text, _ in results] == [offline(p, 20) for p in prompts]
    assert server.metric("specdec_rejected_requests_total") == 0


def test_serving_benchmark_load_generator(server):
    """bench-serve's client: every request measured, speculation figures read from usage."""
    from specdec.serving import loadgen

    prompts = ["a", "bb", "ccc", "dddd", "e", "ff"]
    results, wall = asyncio.run(loadgen.run_load(server.url, MODEL, prompts, 12, concurrency=3))
    summary = loadgen.summarize(results, wall)
    assert summary["requests"] == 6 and summary["failed"] == 0
    assert summary["output_tokens"] == 72 and summary["output_tokens_per_s"] > 0
    assert 0 < summary["ttft_median_ms"] <= summary["ttft_p90_ms"] <= summary["ttft_p99_ms"]
    assert summary["tokens_per_target_pass"] >= 1.0 and all(r.drafted > 0 for r in results)
    rate, _ = asyncio.run(loadgen.run_load(server.url, MODEL, prompts[:3], 4, request_rate=50))
    assert all(r.ok for r in rate)
    asked, _ = asyncio.run(loadgen.run_load(server.url, MODEL, prompts[:2], 4, 2, logprobs=3))
    assert all(r.ok and r.completion_tokens == 4 for r in asked)  # served with logprobs
    table = loadgen.format_table([loadgen.result_row("s", "clients=3", summary)])
    assert table.count("\n") == 2 and "| s | clients=3 |" in table


def test_a_shared_opening_is_served_from_the_prefix_cache(client, server):
    """Two chats with one system turn: the second copies the first's opening, and OpenAI's
    usage.prompt_tokens_details.cached_tokens and /metrics say how much."""
    system = {"role": "system", "content": "You answer in one short line, politely."}
    outs = []
    for question in ("Name a colour", "Name a fruit"):
        messages = [system, {"role": "user", "content": question}]
        outs.append(
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=12, temperature=0
            )
        )
    second = outs[1].usage
    assert second.prompt_tokens_details.cached_tokens >= len(system["content"])  # char-level
    assert second.prompt_tokens_details.cached_tokens < second.prompt_tokens
    metrics = httpx.get(server.url + "/metrics").text
    cached = [line for line in metrics.splitlines() if line.startswith("specdec_prompt_cached")]
    assert cached and float(cached[0].split()[-1]) >= second.prompt_tokens_details.cached_tokens
