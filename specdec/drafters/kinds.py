"""What a `draft` argument names: one parse, at construction, into a kind and its value.

Kinds: `ngram` (prompt lookup), `suffix` (suffix decoding over this and past requests;
`suffix+model:NAME`, `suffix+heads:DIR`, `suffix+eagle:DIR`, `suffix+eagle3:DIR` combine it
with that drafter, each row drafting from whichever expects more accepted, `hybrid.py`),
`model:NAME` (a draft model: registry name, HF directory or .gguf file sharing the target's
tokenizer), `heads:DIR` (MLP speculator heads), `eagle:DIR` (an eagle head) and `eagle3:DIR` (an
EAGLE-3 head in vLLM's layout). A bare word
still works: `ngram`, a heads directory (its config.json says which kind) or a model name;
a bare word that could mean two kinds is an error that names the spellings to choose from.

    >>> parse_draft("ngram")
    DraftSpec(kind='ngram', value=None, with_suffix=False)
    >>> parse_draft("model:qwen2.5-coder-0.5b-instruct")
    DraftSpec(kind='model', value='qwen2.5-coder-0.5b-instruct', with_suffix=False)
    >>> str(parse_draft("suffix+model:qwen2.5-coder-0.5b-instruct"))
    'suffix+model:qwen2.5-coder-0.5b-instruct'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec.errors import InvalidParameterError
from specdec.heads.eagle import is_eagle_dir
from specdec.heads.eagle3 import is_eagle3_dir
from specdec.heads.mlp import is_speculator_dir

# kind -> whether it takes a value (a name or a directory) after "kind:"
KINDS = {
    "ngram": False,
    "suffix": False,
    "model": True,
    "heads": True,
    "eagle": True,
    "eagle3": True,
}
HEAD_KINDS = ("heads", "eagle", "eagle3")  # drafters that read the target's hidden states
SUFFIX_PLUS = "suffix+"  # `suffix+KIND:VALUE`: suffix decoding combined with that drafter
PARTNER_KINDS = ("model", *HEAD_KINDS)  # what suffix combines with


@dataclass(frozen=True)
class DraftSpec:
    kind: str
    value: str | None = None
    # `suffix+KIND:VALUE`: suffix decoding combined with this drafter (`drafters.hybrid`)
    with_suffix: bool = False

    @property
    def reads_states(self) -> bool:
        """Heads over the target's hidden states (small: replicated under tensor
        parallelism, trained by `train-speculator` and `--learn`)."""
        return self.kind in HEAD_KINDS

    def __str__(self) -> str:
        own = self.kind if self.value is None else f"{self.kind}:{self.value}"
        return f"{SUFFIX_PLUS}{own}" if self.with_suffix else own


def parse_draft(text: str | None) -> DraftSpec | None:
    """`text` as a DraftSpec (None stays None); errors say which spellings exist."""
    if text is None or text == "":
        return None
    text = str(text)
    if text.startswith(SUFFIX_PLUS):
        return _with_suffix(text)
    if any(part in KINDS for part in text.split("+")[1:]) or text.startswith("ngram+"):
        raise InvalidParameterError(
            f"draft {text!r}: combine suffix decoding with a drafter as "
            f"suffix+model:NAME, suffix+heads:DIR, suffix+eagle:DIR or suffix+eagle3:DIR"
        )
    return _parse_one(text)


def _with_suffix(text: str) -> DraftSpec:
    """`suffix+KIND:VALUE` (or `suffix+` a bare model name or heads directory)."""
    rest = text[len(SUFFIX_PLUS) :]
    spec = _parse_one(rest) if rest else None
    if spec is None or spec.kind not in PARTNER_KINDS:
        raise InvalidParameterError(
            f"draft {text!r}: suffix combines with a drafter that has a distribution, "
            f"one of {', '.join(k + ':...' for k in PARTNER_KINDS)} (e.g. "
            f"suffix+model:qwen2.5-coder-0.5b-instruct)"
        )
    return DraftSpec(spec.kind, spec.value, with_suffix=True)


def _parse_one(text: str) -> DraftSpec:
    kind, sep, value = text.partition(":")
    if sep and kind in KINDS:
        if not KINDS[kind]:
            raise InvalidParameterError(f"draft kind {kind!r} takes no value, got {text!r}")
        if not value:
            raise InvalidParameterError(f"draft {text!r} names no {kind}")
        _check_dir(kind, value)
        return DraftSpec(kind, value)
    return _bare(str(text))


def _bare(text: str) -> DraftSpec:
    """A word without a kind: a fixed name, a heads directory, or a model."""
    path = Path(text).expanduser()
    heads = heads_kind(path)
    if text in KINDS and not KINDS[text]:
        if path.exists():
            raise InvalidParameterError(
                f"draft {text!r} is ambiguous: a directory of that name exists here; "
                f"write {text!r} for the built-in drafter or model:./{text} for the directory"
            )
        return DraftSpec(text)
    if heads is not None:
        return DraftSpec(heads, text)
    return DraftSpec("model", text)


def heads_kind(path: Path) -> str | None:
    """Which heads a directory holds, by its config.json; None when it holds none."""
    if not path.is_dir():
        return None
    if is_eagle_dir(path):
        return "eagle"
    if is_eagle3_dir(path):
        return "eagle3"
    if is_speculator_dir(path):
        return "heads"
    return None


def _check_dir(kind: str, value: str) -> None:
    """`heads:DIR` / `eagle:DIR` must hold that kind (or be empty or new, for `--learn`)."""
    if kind not in HEAD_KINDS:
        return
    path = Path(value).expanduser()
    found = heads_kind(path)
    if found is not None and found != kind:
        raise InvalidParameterError(f"draft {kind}:{value}: that directory holds {found} heads")
    if found is None and path.is_dir() and (path / "config.json").exists():
        raise InvalidParameterError(
            f"draft {kind}:{value}: its config.json describes no heads (MLP, eagle or EAGLE-3)"
        )
