"""Prometheus metrics of a running server (`GET /metrics`).

Each server owns a `CollectorRegistry`, so several apps in one process (tests) never share
counters. Speculation figures use the definitions of `specdec.stats.SpecStats`.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from specdec.stats import SpecStats

disable_created_metrics()  # no *_created series: they double the output for nothing

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "specdec_requests", "Finished requests", ["finish_reason"], registry=r
        )
        self.rejected = Counter(
            "specdec_rejected_requests", "Requests refused, by HTTP status", ["status"], registry=r
        )
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_prompt_tokens = Counter(
            "specdec_prompt_cached_tokens",
            "Prompt tokens whose keys and values came from the prefix cache",
            registry=r,
        )
        self.generation_tokens = Counter(
            "specdec_generation_tokens", "Generated tokens", registry=r
        )
        self.target_passes = Counter(
            "specdec_spec_target_passes", "Target decode passes (steps per request)", registry=r
        )
        self.drafts = Counter(
            "specdec_spec_drafts", "Steps that verified at least one draft token", registry=r
        )
        self.drafted = Counter("specdec_spec_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specdec_spec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.drafted_at = Counter(
            "specdec_spec_position_draft_tokens",
            "Draft tokens proposed at each draft position",
            ["position"],
            registry=r,
        )
        self.accepted_at = Counter(
            "specdec_spec_position_accepted_tokens",
            "Draft tokens accepted at each draft position",
            ["position"],
            registry=r,
        )
        self.acceptance_at = Gauge(
            "specdec_spec_acceptance_per_position",
            "Acceptance rate at each draft position since start",
            ["position"],
            registry=r,
        )
        self.ttft = Histogram(
            "specdec_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "specdec_time_per_output_token_seconds",
            "Time per output token after the first, per request",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "specdec_e2e_request_latency_seconds",
            "Arrival to last token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_length = Gauge(
            "specdec_queue_length", "Requests waiting for a batch slot", registry=r
        )
        self.batch_size = Gauge("specdec_batch_size", "Sequences in the running batch", registry=r)
        self.window = Gauge(
            "specdec_speculation_window", "Draft tokens per row in the last step", registry=r
        )
        self.steps = Counter("specdec_engine_steps", "Engine steps (batched)", registry=r)
        self._totals = SpecStats()  # per-position totals for the acceptance gauge
        self._learning = None  # gauges made on first use: only a --learn server has them

    def learning(self, heads: dict) -> None:
        """The learner's figures (`OnlineLearner.metrics`), set when /metrics is read."""
        if self._learning is None:
            r = self.registry
            self._learning = {
                "version": Gauge("specdec_heads_version", "Heads published so far", registry=r),
                "steps": Gauge("specdec_heads_train_steps", "Training steps so far", registry=r),
                "buffer_tokens": Gauge(
                    "specdec_heads_buffer_tokens", "Tokens in the traffic buffer", registry=r
                ),
                "buffer_requests": Gauge(
                    "specdec_heads_buffer_requests", "Requests in the traffic buffer", registry=r
                ),
                "loss": Gauge("specdec_heads_loss", "Latest training loss", registry=r),
                "mean_accepted_length": Gauge(
                    "specdec_heads_mean_accepted_length",
                    "Tokens per target pass over the recent steps",
                    registry=r,
                ),
                "acceptance": Gauge(
                    "specdec_heads_acceptance",
                    "Acceptance of each head over the recent steps",
                    ["head"],
                    registry=r,
                ),
                "failed": Gauge(
                    "specdec_heads_trainer_failed", "1 once the trainer has failed", registry=r
                ),
            }
        g = self._learning
        for key in ("version", "steps", "buffer_tokens", "buffer_requests", "loss"):
            if heads[key] is not None:
                g[key].set(heads[key])
        if heads["mean_accepted_length"] is not None:
            g["mean_accepted_length"].set(heads["mean_accepted_length"])
        for i, rate in enumerate(heads["acceptance_per_head"]):
            if rate is not None:
                g["acceptance"].labels(str(i)).set(rate)
        g["failed"].set(0 if heads["error"] is None else 1)

    def finished(self, finish_reason: str, prompt_tokens: int, stats: SpecStats) -> None:
        """Record one finished (or aborted) request."""
        self.requests.labels(finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_prompt_tokens.inc(stats.cached_tokens)
        self.generation_tokens.inc(stats.generated)
        self.target_passes.inc(stats.steps)
        self.drafts.inc(stats.drafts)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        for i, (d, a) in enumerate(zip(stats.drafted_at, stats.accepted_at, strict=True)):
            self.drafted_at.labels(str(i)).inc(d)
            self.accepted_at.labels(str(i)).inc(a)
        self._totals = self._totals + stats
        for i, rate in enumerate(self._totals.acceptance_per_position):
            self.acceptance_at.labels(str(i)).set(rate)
        if stats.generated:
            self.ttft.observe(stats.ttft_s)
            self.latency.observe(stats.elapsed_s)
        if stats.generated > 1:
            self.tpot.observe(stats.tpot_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
