"""The custom-drafter how-to's example (`examples/phrase_drafter.py`) through the engine: it
satisfies the Drafter protocol, its drafts are kept and rejected, and fp32 greedy output
equals plain decoding's token for token, with rows finishing and joining mid-batch."""

import importlib.util
import re
from pathlib import Path

import pytest

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters.base import Drafter, DrafterPowers
from specdec.engine import Engine
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

EXAMPLE = Path(__file__).parents[2] / "examples" / "phrase_drafter.py"
PROMPTS = ["def f(x):", "class A:", "x = [1, 2", "for i in", "# note"]


def _howto_drafter():
    """The class as docs/howto/custom-drafter.md prints it (its first Python block)."""
    text = (Path(__file__).parents[2] / "docs" / "howto" / "custom-drafter.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace = {}
    exec(compile(code, "custom-drafter.md", "exec"), namespace)
    return namespace["PhraseDrafter"]


def _example():
    spec = importlib.util.spec_from_file_location("phrase_drafter", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(tokenizer):
    target = native_from_hf(hf_tiny("llama"))
    ids = [tokenizer.encode(p) for p in PROMPTS]
    params = [SamplingParams(temperature=0, max_tokens=16 + 3 * i) for i in range(len(ids))]
    want = [c.token_ids for c in Engine(target, tokenizer, frozenset()).generate(ids, params)]
    # Phrases the target will say (pieces of its own output) and phrases it will not.
    said = [w[i : i + 6] for w in want for i in (1, 7)]
    unsaid = [[(t + 1) % 97 for t in w[2:8]] for w in want]
    return target, ids, params, want, said + unsaid


def test_it_is_a_drafter_with_no_optional_power():
    drafter = _example().PhraseDrafter([[1, 2, 3]])
    for member in ("admit", "propose", "commit", "move_row", "reset_row"):
        assert callable(getattr(drafter, member))
    assert DrafterPowers.of(drafter) == DrafterPowers.of(None)
    assert Drafter  # the protocol the members above follow


@pytest.mark.parametrize("where", ["example", "howto"])
def test_it_proposes_the_rest_of_a_phrase(where):
    cls = _example().PhraseDrafter if where == "example" else _howto_drafter()
    drafter = cls([[5, 6, 7, 8, 9]], min_match=2)
    drafter.admit([[1, 5, 6], [1, 5], [4, 5, 6, 7]])
    draft = drafter.propose(2, None, None)
    assert draft.lengths.tolist() == [2, 0, 2] and draft.probs is None
    assert draft.tokens.tolist() == [[7, 8], [0, 0], [8, 9]]


@pytest.mark.parametrize(
    "acceptor, window, where",
    [
        (RejectionSampler(), "k4", "example"),
        (GreedyAcceptor(), "k4", "example"),
        (RejectionSampler(), "auto", "example"),
        (RejectionSampler(), "k4", "howto"),
    ],
    ids=["rs-k4", "greedy-k4", "rs-auto", "howto-rs-k4"],
)
def test_greedy_output_equals_plain(setup, tokenizer, acceptor, window, where):
    target, ids, params, want, phrases = setup
    PhraseDrafter = _example().PhraseDrafter if where == "example" else _howto_drafter()
    chosen = FixedWindow(4) if window == "k4" else AdaptiveWindow(k_max=6)
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=3,  # five prompts: rows finish and are repacked, new ones join
        drafter_factory=lambda rows, length: PhraseDrafter(phrases),
        acceptor=acceptor,
        window=chosen,
    )
    got = staggered(engine, ids, params)
    assert [s.output_ids for s in got] == want
    if window == "k4":
        drafted = sum(s.stats.drafted for s in got)
        accepted = sum(s.stats.accepted for s in got)
        assert 0 < accepted < drafted  # drafts were kept, and some were rejected


def test_it_follows_its_rows(setup, tokenizer):
    """Given the target's whole answers as phrases, a drafter that tracks every row's history
    right (commit, move_row, reset_row as rows finish and join) drafts them nearly whole."""
    target, ids, params, want, _ = setup
    PhraseDrafter = _example().PhraseDrafter
    answers = [prompt + out for prompt, out in zip(ids, want, strict=True)]
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=2,
        drafter_factory=lambda rows, length: PhraseDrafter(answers, min_match=len(ids[0])),
        window=FixedWindow(4),
    )
    got = staggered(engine, ids, params)
    assert [s.output_ids for s in got] == want
    for seq in got:
        assert seq.stats.accepted >= 0.9 * seq.stats.drafted > 0
        assert seq.stats.mean_accepted_length > 3


def test_the_example_script_runs_on_a_tiny_model(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["phrase_drafter.py", "--model", "tiny", "--max-tokens", "12"])
    _example().main()
    assert "identical to plain greedy" in capsys.readouterr().out
