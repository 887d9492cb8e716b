"""Serving benchmark: replay prompts against an OpenAI-compatible server and measure what a
user feels (time to first token, time per output token, inter-chunk latency) and what an
operator pays for (throughput), with speculation on and off.

Load is either closed-loop (`concurrency` clients, each sending its next request when the
last one finished) or open-loop (Poisson arrivals at `request_rate` per second). Requests
stream with `include_usage`, so each response also reports its tokens and the server's
speculation figures; timings are taken on the client, per chunk.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx

from specdec.errors import InvalidParameterError


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    completion_tokens: int = 0
    chunk_gaps_s: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    error: str = ""

    @property
    def tpot_s(self) -> float:
        n = self.completion_tokens
        return (self.latency_s - self.ttft_s) / (n - 1) if n > 1 else 0.0


def resolve_server(url: str, timeout_s: float = 10.0) -> tuple[str, list[str]]:
    """The server's root URL and the model ids it serves, from a URL given with or without
    `/v1` (the `openai` client's base URL has it). Anything that does not answer
    `GET /v1/models` like an OpenAI server raises InvalidParameterError with one line."""
    root = url.strip().rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    if not root.startswith(("http://", "https://")):
        raise InvalidParameterError(f"--url must start with http:// or https://, got {url!r}")
    where = root + "/v1/models"
    try:
        response = httpx.get(where, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise InvalidParameterError(f"no server answered at {where}: {err}") from err
    if response.status_code == 401:
        raise InvalidParameterError(f"{where} wants an API key (the server runs --api-key)")
    try:
        ids = [m["id"] for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        ids = None
    if response.status_code != 200 or not ids:
        raise InvalidParameterError(
            f"{where} did not answer like an OpenAI server (HTTP {response.status_code}, "
            "no model list): give the server's base URL, e.g. http://HOST:PORT/v1"
        )
    return root, ids


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    provenance: bool = False,
    logprobs: int | None = None,
) -> RequestResult:
    """One streaming chat request; `provenance` asks for the per-token records too, and
    `logprobs` for each token's log-probability and that many alternatives (their cost is
    what they measure: received and parsed, not checked)."""
    options = {"include_usage": True} | ({"include_speculation": True} if provenance else {})
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": options,
    }
    if logprobs is not None:
        body |= {"logprobs": True, "top_logprobs": logprobs}
    start = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    u = chunk["usage"]
                    result.completion_tokens = u["completion_tokens"]
                    spec = u.get("speculation", {})
                    result.drafted = spec.get("drafted_tokens", 0)
                    result.accepted = spec.get("accepted_tokens", 0)
                    result.passes = spec.get("target_passes", 0)
                    continue
                if not any(c["delta"].get("content") for c in chunk["choices"]):
                    continue
                if last is None:
                    result.ttft_s = now - start
                else:
                    result.chunk_gaps_s.append(now - last)
                last = now
    except httpx.HTTPError as err:
        result.error = f"{type(err).__name__}: {err}"
        return result
    result.latency_s = time.perf_counter() - start
    result.ok = True
    return result


async def run_load(
    url: str,
    model: str,
    prompts: list[str],
    max_tokens: int,
    concurrency: int | None = None,
    request_rate: float | None = None,
    seed: int = 0,
    provenance: bool = False,
    logprobs: int | None = None,
) -> tuple[list[RequestResult], float]:
    """All prompts once, closed-loop at `concurrency` or open-loop at `request_rate`."""
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=max(concurrency or 0, 64))
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        request = (client, url, model)
        start = time.perf_counter()
        if request_rate is None:
            queue = list(prompts)
            results: list[RequestResult] = []

            async def worker():
                while queue:
                    prompt = queue.pop(0)
                    results.append(
                        await one_request(*request, prompt, max_tokens, provenance, logprobs)
                    )

            await asyncio.gather(*(worker() for _ in range(concurrency or 1)))
        else:
            rng = random.Random(seed)
            tasks = []
            for prompt in prompts:
                tasks.append(
                    asyncio.create_task(
                        one_request(*request, prompt, max_tokens, provenance, logprobs)
                    )
                )
                await asyncio.sleep(rng.expovariate(request_rate))
            results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - start


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(results: list[RequestResult], wall_s: float) -> dict:
    """Throughput and latency percentiles over the successful requests."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    ttft = [r.ttft_s for r in ok]
    tpot = [r.tpot_s for r in ok if r.completion_tokens > 1]
    gaps = [g for r in ok for g in r.chunk_gaps_s]
    drafted, accepted = sum(r.drafted for r in ok), sum(r.accepted for r in ok)
    passes = sum(r.passes for r in ok)
    row = {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "wall_s": round(wall_s, 3),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall_s, 3) if wall_s else 0.0,
        "requests_per_s": round(len(ok) / wall_s, 4) if wall_s else 0.0,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "tokens_per_target_pass": round(1 + accepted / passes, 3) if passes else 1.0,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", gaps)):
        row[f"{name}_median_ms"] = round(1000 * (statistics.median(values) if values else 0), 2)
        row[f"{name}_p90_ms"] = round(1000 * _pct(values, 0.90), 2)
        row[f"{name}_p99_ms"] = round(1000 * _pct(values, 0.99), 2)
    errors = [r.error for r in results if not r.ok]
    if errors:
        row["first_error"] = errors[0]
    return row


class LaunchedServer:
    """`specdec serve` in a subprocess, for benchmarking one configuration."""

    def __init__(self, serve_args: list[str], port: int, log_path: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w")
        cmd = [sys.executable, "-m", "specdec.cli", "serve", "--port", str(port), *serve_args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=os.environ)

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited (code {self.proc.returncode}); see {self.log.name}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not become healthy in {timeout_s:.0f} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def result_row(label: str, load: str, summary: dict) -> dict:
    return {"server": label, "load": load, **summary}


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the main columns, as `specdec bench-serve` prints it
    (docs/guide/serving.md, "Load testing")."""
    cols = [
        ("server", "server"),
        ("load", "load"),
        ("output_tokens_per_s", "tok/s"),
        ("ttft_median_ms", "TTFT p50 ms"),
        ("ttft_p90_ms", "TTFT p90"),
        ("ttft_p99_ms", "TTFT p99"),
        ("tpot_median_ms", "TPOT p50 ms"),
        ("tpot_p90_ms", "TPOT p90"),
        ("tpot_p99_ms", "TPOT p99"),
        ("itl_median_ms", "ITL p50 ms"),
        ("itl_p99_ms", "ITL p99"),
        ("tokens_per_target_pass", "tok/pass"),
        ("failed", "failed"),
    ]
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(k, "")) for k, _ in cols) + " |")
    return "\n".join(lines)


def as_dict(result: RequestResult) -> dict:
    return asdict(result)
