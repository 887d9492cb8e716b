"""The server's loop (`AsyncEngine._step`) publishes the live rows' tokens of each decode
step it takes between the passes of a long prompt's chunked prefill, before the long prompt's
first token: a client streaming beside a long arrival hears from its row once a pass, not
once per whole prefill. Counted in publish order (a stand-in event loop runs each callback
at once, on this thread): no clocks."""

from specdec.engine import Engine
from specdec.params import SamplingParams
from specdec.serving.async_engine import AsyncEngine
from specdec.serving.metrics import ServerMetrics

from tiny import hf_tiny, native_from_hf

LIVE = [[5, 17, 42, 8, 9], [60, 3, 3, 3, 9], [7, 7, 8, 7, 7, 8]]
LONG = [11, 12, 13, 14, 15, 16] * 8  # 48 positions: 12 passes of 4


class InlineLoop:
    """`call_soon_threadsafe` runs the callback now, and logs (request, tokens so far) in
    publish order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.names: dict[int, str] = {}

    def call_soon_threadsafe(self, put, event):
        self.log.append((self.names[id(put.__self__)], len(event.token_ids)))
        put(event)


def step(runner: AsyncEngine) -> None:
    """One turn of the engine thread's loop (`AsyncEngine._run`), on this thread."""
    runner._apply(runner._take_commands(block=False))
    runner._step()


def arrival_log(tokenizer, chunk: int | None) -> list[tuple[str, int]]:
    """Three streams decode, then the long prompt arrives: what the step that admits it
    publishes, in order."""
    engine = Engine(
        native_from_hf(hf_tiny("qwen2", seed=3)),
        tokenizer,
        frozenset(),
        max_batch=4,
        max_len=128,  # a server's fixed cache: the long prompt joins the running batch
        prefill_chunk=chunk,
    )
    runner = AsyncEngine(engine, ServerMetrics())
    runner._loop = loop = InlineLoop()
    stream = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i, ids in enumerate(LIVE):
        loop.names[id(runner.submit([(ids, stream)], "live")[1])] = f"live-{i}"
    step(runner)  # the streams are admitted and take a step
    _, long = runner.submit([(LONG, SamplingParams(temperature=0, max_tokens=4))], "long")
    loop.names[id(long)] = "long"
    loop.log.clear()
    step(runner)
    return loop.log


def test_live_streams_are_published_between_a_long_prompts_passes(tokenizer):
    log = arrival_log(tokenizer, chunk=4)
    first = log.index(("long", 1))  # its first token, after its last pass
    for i in range(len(LIVE)):
        before = [n for name, n in log[:first] if name == f"live-{i}"]
        # one event per decode step between the 12 passes, a token each, in order
        assert before == list(range(3, 14))
        assert [n for name, n in log[first:] if name == f"live-{i}"] == [14]


def test_one_pass_publishes_the_streams_only_after_it(tokenizer):
    log = arrival_log(tokenizer, chunk=None)  # what the chunks avoid
    first = log.index(("long", 1))
    assert all(name == "long" for name, _ in log[: first + 1])
    assert sorted(log[first + 1 :]) == [("live-0", 3), ("live-1", 3), ("live-2", 3), ("long", 2)]
