r"""A drafter of your own: propose the rest of a known phrase. Lossless (any acceptor).

`PhraseDrafter` holds a list of phrases you expect in the output (API names, boilerplate,
a glossary). When a row's latest tokens are the start of a phrase — at least `min_match`
tokens of it — it proposes the phrase's next tokens; otherwise it proposes nothing, and that
step costs what a plain step costs. No model runs, so its distribution q is one-hot
(`Draft.probs = None`) and every lossless acceptor keeps the output the target's own.

It implements the five members of `specdec.drafters.base.Drafter` and no optional power.
The walk-through: docs/howto/custom-drafter.md.

    python examples/phrase_drafter.py                      # SmolLM2-135M (pulled if needed)
    python examples/phrase_drafter.py --model tiny         # a tiny random model, no weights
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from specdec.acceptors import Draft


class PhraseDrafter:
    """Drafts the continuation of the longest phrase start that ends a row's history."""

    def __init__(self, phrases: Sequence[Sequence[int]], min_match: int = 2) -> None:
        # every start of a phrase (min_match tokens or more) -> the tokens that follow it
        self.next: dict[tuple[int, ...], list[int]] = {}
        for phrase in phrases:
            for n in range(min_match, len(phrase)):
                self.next.setdefault(tuple(phrase[:n]), list(phrase[n:]))
        self.longest = max((len(p) for p in phrases), default=0)
        self.min_match = min_match
        self.histories: list[list[int]] = []  # row i follows the target's row i
        self.proposed: list[list[int]] = []  # this step's draft, per row

    # -- the Drafter protocol ------------------------------------------------------------

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        """New rows, appended after the live ones, each with its committed tokens."""
        self.histories.extend(list(h) for h in histories)
        self.proposed.extend([] for _ in histories)

    def propose(self, k: int, params, generators) -> Draft:
        """Up to k tokens per row; rows with no match propose none (`lengths[b] = 0`)."""
        self.proposed = [self._lookup(h, k) for h in self.histories]
        tokens = torch.zeros(len(self.histories), k, dtype=torch.long)  # [B, k]
        for row, found in enumerate(self.proposed):
            tokens[row, : len(found)] = torch.tensor(found, dtype=torch.long)
        lengths = torch.tensor([len(f) for f in self.proposed], dtype=torch.long)  # [B]
        return Draft(tokens=tokens, probs=None, lengths=lengths)  # probs None: one-hot q

    def commit(self, num_accepted: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """The target kept the first num_accepted[b] drafts of row b, then next_tokens[b]."""
        pairs = zip(num_accepted.tolist(), next_tokens.tolist(), strict=True)
        for row, (n, token) in enumerate(pairs):
            self.histories[row] += self.proposed[row][:n] + [token]

    def move_row(self, src: int, dst: int) -> None:
        """Row src (the last) takes the place of a finished row dst."""
        self.histories[dst], self.proposed[dst] = self.histories[src], self.proposed[src]
        self.reset_row(src)

    def reset_row(self, row: int) -> None:
        """Row `row` (the last) finished: forget it."""
        del self.histories[row], self.proposed[row]

    # -- the lookup ----------------------------------------------------------------------

    def _lookup(self, history: list[int], k: int) -> list[int]:
        for n in range(min(self.longest, len(history)), self.min_match - 1, -1):
            rest = self.next.get(tuple(history[-n:]))
            if rest is not None:
                return rest[:k]
        return []


PHRASES = [  # what this prompt's answer is likely to say, as it would be tokenized there
    " def __init__(self):",
    " self.stack = []",
    " self.stack.append(item)",
    " return self.stack.pop()",
    " return self.stack[-1]",
    " return len(self.stack) == 0",
    " if not self.is_empty():",
    " if self.is_empty():",
    " raise IndexError(",
    'if __name__ == "__main__":',
]
PROMPT = "Write a Python class Stack with push, pop and peek methods, and a short usage example."


def tiny_model():
    """A random 2-layer Llama over a character-level vocabulary: runs anywhere, in seconds."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from specdec.models.config import ModelConfig
    from specdec.models.loading import build_transformer

    vocab = {"<unk>": 0, "<eos>": 1, **{chr(c): c - 30 for c in range(32, 127)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>"
    )
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    cfg = ModelConfig.from_hf_dict(config.to_dict())
    return build_transformer(cfg, hf.state_dict(), torch.float32), tokenizer, frozenset({1})


def main() -> None:
    from specdec import SamplingParams
    from specdec.engine import Engine
    from specdec.window import AdaptiveWindow, FixedWindow

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model, or tiny")
    parser.add_argument("--speculate", default="4", help="K, or auto")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    if args.model == "tiny":
        model, tokenizer, eos = tiny_model()
        prompt_ids = tokenizer.encode("def __init__(self")
    else:
        from specdec import LLM

        llm = LLM(args.model, dtype="fp32")  # plain: we bring the drafter
        model, tokenizer, eos = llm.model, llm.tokenizer, llm.eos_ids
        prompt_ids = llm.encode(PROMPT, chat=True)
    phrases = [tokenizer.encode(p, add_special_tokens=False) for p in PHRASES]
    auto = args.speculate == "auto"
    window = AdaptiveWindow(k_max=8) if auto else FixedWindow(int(args.speculate))

    def drafter_factory(max_batch: int, max_len: int) -> PhraseDrafter:
        return PhraseDrafter(phrases)  # one per KV cache the engine builds

    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    plain = Engine(model, tokenizer, eos)
    spec = Engine(model, tokenizer, eos, drafter_factory=drafter_factory, window=window)
    [want] = plain.generate([prompt_ids], params)
    [got] = spec.generate([prompt_ids], params)
    print(got.text)
    s = got.stats
    print(
        f"-- {got.num_generated} tokens; drafted {s.drafted}, accepted {s.accepted} "
        f"({s.mean_accepted_length:.2f} tokens per target pass); "
        f"{'identical to' if got.token_ids == want.token_ids else 'DIFFERENT from'} plain greedy"
    )


if __name__ == "__main__":
    main()
