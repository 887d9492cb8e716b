"""Tokenizer loading, prompt encoding (with chat templates) and stop detection."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.errors import InvalidParameterError, ModelNotFoundError


def load_tokenizer(path: str | Path):
    """The tokenizer of a model directory: a `LightTokenizer` over its tokenizer.json where
    that gives exactly what transformers would (importing transformers and building its
    tokenizer costs ~5 s of every start), else `transformers.AutoTokenizer`'s."""
    from specdec.light_tokenizer import LightTokenizer

    try:
        light = LightTokenizer.from_directory(path)
    except Exception as err:  # noqa: BLE001 - tokenizers raises bare Exceptions on bad files
        raise ModelNotFoundError(f"{path}: cannot load a tokenizer ({err})") from err
    if light is not None:
        return light
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(f"{path}: cannot load a tokenizer ({err})") from err


# The files a Hugging Face tokenizer is read from (those a model directory has).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def same_tokenizer_files(a: str | Path, b: str | Path) -> bool:
    """Whether two model directories hold byte-identical tokenizer files: then they load the
    same tokenizer, and a draft need not load its own to be checked (2-4 s of a warm start
    for the Qwen pair)."""
    import filecmp

    a, b = Path(a), Path(b)
    names = [n for n in TOKENIZER_FILES if (a / n).is_file() or (b / n).is_file()]
    return bool(names) and all(
        (a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False)
        for n in names
    )


# Special tokens that end a sequence in the Llama-family models we serve. A GGUF keeps one
# EOS id, but instruct models end a turn with one token (<|im_end|>) and a document with
# another (<|endoftext|>); stopping on either is what their original configs declare.
END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>")


def eos_token_ids(path: str | Path, tokenizer) -> frozenset[int]:
    """Every id that ends a sequence: the tokenizer's EOS, those the model's config and
    generation_config declare, and the special end tokens in `END_TOKENS` it has."""
    special = set(tokenizer.all_special_tokens) | {
        t.content for t in tokenizer.added_tokens_decoder.values() if t.special
    }
    ids = {tokenizer.convert_tokens_to_ids(t) for t in END_TOKENS if t in special}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for name in ("generation_config.json", "config.json"):
        file = Path(path) / name
        if file.is_file():
            value = json.loads(file.read_text()).get("eos_token_id")
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids for a prompt, wrapped in the tokenizer's chat template when `chat`."""
    if not chat:
        return tokenizer(prompt)["input_ids"]
    return encode_chat(tokenizer, [{"role": "user", "content": prompt}])


def encode_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """Token ids of a conversation in the tokenizer's chat template, ready for the
    assistant's turn; `tools` (OpenAI's function definitions) go to the template, which
    shows them to the model in its own format."""
    if not tokenizer.chat_template:
        raise InvalidParameterError("this model's tokenizer has no chat template; drop --chat")
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
    except Exception as err:  # noqa: BLE001 - templates raise whatever jinja raises
        raise InvalidParameterError(f"the chat template rejected the messages: {err}") from err
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class StopChecker:
    """Finds stop strings in a growing token sequence without re-decoding all of it.

    Only a tail of tokens long enough to contain any stop string is decoded per token
    (a character is at most 4 bytes and a token at least one byte).
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.tail_tokens = 4 * max((len(s) for s in stop), default=0) + 4

    def hit(self, token_ids: list[int]) -> bool:
        """True when the text of `token_ids` contains a stop string that its last token
        completed (earlier tokens were checked when they arrived)."""
        if not self.stop:
            return False
        text = self.tokenizer.decode(token_ids[-self.tail_tokens :], skip_special_tokens=True)
        return any(s in text for s in self.stop)

    def cut(self, text: str) -> str:
        """The text before the first stop string."""
        cut_at = min((i for s in self.stop if (i := text.find(s)) >= 0), default=len(text))
        return text[:cut_at]
