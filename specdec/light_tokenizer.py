"""A tokenizer read straight from `tokenizer.json` and `tokenizer_config.json`.

`transformers.AutoTokenizer` costs ~5 s of a warm start on a 2-vCPU Zen 3 (importing
transformers, its lazy import scan, and parsing tokenizer.json in Python); `tokenizers`
alone loads the same file in a fraction of a second. `LightTokenizer` is that backend plus
what transformers 5 adds on top for the directories it knows to load the same way, giving
exactly AutoTokenizer's ids, text, special tokens and chat prompts for everything specdec
uses (tests/unit/test_light_tokenizer.py compares the two). Anything else falls back to
AutoTokenizer (`from_directory` returns None).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers

from specdec import chat_template as templates

# The named special tokens, in the order transformers lists them.
SPECIAL_ATTRIBUTES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# tokenizer_config.json keys whose meaning is reproduced here (or that do not change what
# the tokenizer does); any other key sends the directory to AutoTokenizer.
KNOWN_CONFIG_KEYS = frozenset(
    {
        *SPECIAL_ATTRIBUTES,
        "added_tokens_decoder",
        "additional_special_tokens",
        "extra_special_tokens",
        "chat_template",
        "clean_up_tokenization_spaces",
        "add_bos_token",  # ignored by transformers when tokenizer.json exists
        "add_eos_token",
        "add_prefix_space",
        "backend",
        "tokenizer_class",
        "model_max_length",
        "is_local",
        "local_files_only",
        "padding_side",
        "truncation_side",
        "model_input_names",
        "errors",
        "legacy",
        "split_special_tokens",
    }
)

# Tokenizer classes that load tokenizer.json as it is.
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
QWEN2_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")

# Qwen2's pre-tokenizer split, as transformers' Qwen2Tokenizer builds it.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN2_DEFAULTS = {
    "unk_token": "<|endoftext|>",
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json stores it: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _added_token(value, special: bool) -> AddedToken:
    if isinstance(value, dict):
        fields = ("single_word", "lstrip", "rstrip", "normalized")
        kwargs = {k: value[k] for k in fields if k in value}
        return AddedToken(value["content"], special=value.get("special", special), **kwargs)
    return AddedToken(value, special=special, normalized=False)


def _loader(path: Path, config: dict, backend: Tokenizer) -> str | None:
    """How AutoTokenizer would build this directory's tokenizer, where it is one of the ways
    reproduced here: "plain" (tokenizer.json as is) or "qwen2" (Qwen2Tokenizer's own
    normalizer, pre-tokenizer and decoder over the file's BPE); None otherwise."""
    if any((path / n).is_file() for n in ("special_tokens_map.json", "added_tokens.json")):
        return None  # older layouts whose precedence rules are not reproduced here
    if (path / "additional_chat_templates").is_dir() or "auto_map" in config:
        return None
    if set(config) - KNOWN_CONFIG_KEYS or config.get("split_special_tokens"):
        return None
    named = [config.get(k) for k in SPECIAL_ATTRIBUTES]
    if any(isinstance(v, dict) and v.get("__type") != "AddedToken" for v in named):
        return None  # (transformers refuses these; let it say so)
    model_type = _read_json(path / "config.json").get("model_type")
    cls = config.get("tokenizer_class")
    if model_type == "qwen2" or (model_type is None and cls in QWEN2_CLASSES):
        # transformers uses Qwen2Tokenizer for qwen2 models whatever the config names
        model = backend.model
        plain_bpe = (
            type(model).__name__ == "BPE"
            and model.dropout is None
            and model.unk_token is None
            and not model.continuing_subword_prefix
            and not model.end_of_word_suffix
            and not model.fuse_unk
            and not model.byte_fallback
            and not model.ignore_merges
        )
        return "qwen2" if plain_bpe else None
    if model_type in (None, "llama") and cls in PLAIN_CLASSES:
        return "plain"
    return None


class LightTokenizer:
    """The subset of a transformers tokenizer's interface that specdec uses, over a
    `tokenizers.Tokenizer`. Anything else goes to the full transformers tokenizer, loaded
    on first use (`hf`)."""

    def __init__(self, path: Path, backend: Tokenizer, config: dict, chat_template) -> None:
        self.name_or_path = str(path)
        self._backend = backend
        self._hf = None
        self._special: dict[str, str] = {}  # named special tokens (bos_token: "<s>", ...)
        self._extra: list[str] = []
        self.chat_template = chat_template
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces"))

    @classmethod
    def from_directory(cls, path: str | Path) -> LightTokenizer | None:
        """The directory's tokenizer, or None where AutoTokenizer must build it."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            return None
        config = _read_json(path / "tokenizer_config.json")
        backend = Tokenizer.from_file(str(file))
        kind = _loader(path, config, backend)
        if kind is None or backend.padding is not None or backend.truncation is not None:
            return None  # (padding or truncation baked into the file: not reproduced here)
        special = dict.fromkeys(SPECIAL_ATTRIBUTES)
        if kind == "qwen2":
            special.update(QWEN2_DEFAULTS)
            _as_qwen2(backend, config.get("add_prefix_space"))
        for name in SPECIAL_ATTRIBUTES:
            if name in config:
                special[name] = config[name]
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        if isinstance(extra, dict):
            return None  # named extra tokens (multimodal) are not reproduced here

        tok = cls(path, backend, config, _chat_template(path, config))
        tok._special = {k: _token_text(v) for k, v in special.items() if v is not None}
        tok._extra = [_token_text(t) for t in extra]

        # The token additions transformers makes while constructing, in its order: the
        # config's added tokens, then (Qwen2Tokenizer) its special tokens as added tokens,
        # then every named and extra special token as a special token.
        decoder = config.get("added_tokens_decoder") or {}
        listed = [
            _added_token(v, True) for _, v in sorted(decoder.items(), key=lambda kv: int(kv[0]))
        ]
        named = [v for v in special.values() if v is not None]
        # (named tokens neither added tokens already nor listed in the config)
        added = {t.content for t in backend.get_added_tokens_decoder().values()}
        added |= {t.content for t in listed}
        missing = [_added_token(v, True) for v in named if _token_text(v) not in added]
        if listed or missing:
            backend.add_tokens(listed + missing)
        if kind == "qwen2":
            backend.add_tokens([AddedToken(t, special=True) for t in tok.all_special_tokens])
        finals = [_added_token(v, True) for v in named] + [_added_token(t, True) for t in extra]
        if finals:
            backend.add_special_tokens(finals)
        if backend.post_processor is None:
            from tokenizers import processors

            backend.post_processor = processors.TemplateProcessing(
                single="$A:0", pair="$A:0 $B:1", special_tokens=[]
            )
        backend.encode_special_tokens = False
        return tok

    # -- what the full transformers tokenizer is still needed for ------------------------

    @property
    def hf(self):
        """The transformers tokenizer of the same directory, for the few users that need
        the real object (llguidance reads its internals) or a method not reproduced here.
        Loading it costs the seconds this class exists to save, so only on first use."""
        if self._hf is None:
            import transformers

            self._hf = transformers.AutoTokenizer.from_pretrained(self.name_or_path)
        return self._hf

    def __getattr__(self, name: str):
        # Only reached for attributes not defined here: rarely used parts of the
        # transformers interface, served by the full tokenizer.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.hf, name)

    # -- vocabulary and special tokens ----------------------------------------------------

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._backend

    @property
    def is_fast(self) -> bool:
        return True

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __bool__(self) -> bool:
        return True

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return self._backend.get_added_tokens_decoder()

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {t.content: i for i, t in sorted(self.added_tokens_decoder.items())}

    def get_added_vocab(self) -> dict[str, int]:
        return self.added_tokens_encoder

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {k: self._special[k] for k in SPECIAL_ATTRIBUTES if k in self._special}

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self._extra]))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    def _named(self, attr: str) -> str | None:
        return self._special.get(attr)

    bos_token = property(lambda self: self._named("bos_token"))
    eos_token = property(lambda self: self._named("eos_token"))
    unk_token = property(lambda self: self._named("unk_token"))
    sep_token = property(lambda self: self._named("sep_token"))
    pad_token = property(lambda self: self._named("pad_token"))
    cls_token = property(lambda self: self._named("cls_token"))
    mask_token = property(lambda self: self._named("mask_token"))

    def _named_id(self, attr: str) -> int | None:
        token = self._special.get(attr)
        return None if token is None else self.convert_tokens_to_ids(token)

    bos_token_id = property(lambda self: self._named_id("bos_token"))
    eos_token_id = property(lambda self: self._named_id("eos_token"))
    unk_token_id = property(lambda self: self._named_id("unk_token"))
    sep_token_id = property(lambda self: self._named_id("sep_token"))
    pad_token_id = property(lambda self: self._named_id("pad_token"))
    cls_token_id = property(lambda self: self._named_id("cls_token"))
    mask_token_id = property(lambda self: self._named_id("mask_token"))

    def convert_tokens_to_ids(self, tokens: str | list[str]):
        if isinstance(tokens, str):
            index = self._backend.token_to_id(tokens)
            return self.unk_token_id if index is None else index
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    # -- text <-> ids ---------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict:
        """`{"input_ids", "attention_mask"}` for a text (lists for a list of texts)."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        encodings = self._backend.encode_batch(list(text), add_special_tokens=add_special_tokens)
        ids = [e.ids for e in encodings]
        return {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}

    def decode(
        self,
        token_ids,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        elif isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        elif hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        text = self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        clean = (
            self.clean_up_tokenization_spaces
            if clean_up_tokenization_spaces is None
            else clean_up_tokenization_spaces
        )
        # transformers skips the clean-up for BPE (it would strip real spaces).
        if clean and type(self._backend.model).__name__ != "BPE":
            text = _clean_up(text)
        return text

    def batch_decode(self, sequences, **kwargs) -> list[str]:
        return [self.decode(s, **kwargs) for s in sequences]

    # -- chat -----------------------------------------------------------------------------

    def get_chat_template(self, chat_template: str | None = None, tools=None) -> str:
        if chat_template is not None:
            if isinstance(self.chat_template, dict) and chat_template in self.chat_template:
                return self.chat_template[chat_template]
            return chat_template
        return templates.select_template(self.chat_template, tools)

    def apply_chat_template(
        self,
        conversation,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ):
        """The conversation (or a batch of them) in the chat template, as text or ids.
        Options not reproduced here (tools given as Python functions, continuing the final
        message, assistant masks, padding, tensors) go to the transformers tokenizer."""
        if set(kwargs) & _DELEGATED_OPTIONS or any(not isinstance(t, dict) for t in tools or ()):
            return self.hf.apply_chat_template(
                conversation,
                tools=tools,
                documents=documents,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=tokenize,
                return_dict=return_dict,
                **kwargs,
            )
        template = self.get_chat_template(chat_template, tools)
        if isinstance(conversation, (list, tuple)) and len(conversation) == 0:
            raise ValueError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        batched = isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages")
        conversations = conversation if batched else [conversation]
        # Keys whose value is None are dropped (OpenAI clients send content=None).
        conversations = [
            [{k: v for k, v in m.items() if v is not None} for m in getattr(c, "messages", c)]
            for c in conversations
        ]
        variables = {**self.special_tokens_map, **kwargs}
        rendered = [
            templates.render(template, c, tools, documents, add_generation_prompt, variables)
            for c in conversations
        ]
        if not tokenize:
            return rendered if batched else rendered[0]
        out = self(rendered if batched else rendered[0], add_special_tokens=False)
        return out if return_dict else out["input_ids"]


# apply_chat_template options handled by the transformers tokenizer (see its docstring).
_DELEGATED_OPTIONS = frozenset(
    {
        "continue_final_message",
        "return_assistant_tokens_mask",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "tokenizer_kwargs",
    }
)


def _clean_up(text: str) -> str:
    """transformers' `clean_up_tokenization`: no space before punctuation and clitics."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


def _as_qwen2(backend: Tokenizer, add_prefix_space) -> None:
    """Qwen2Tokenizer's pipeline around the file's BPE model: NFC, its regex split then
    byte-level, byte-level decoding (the file's own normalizer is not used)."""
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(add_prefix_space), use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()


def _chat_template(path: Path, config: dict):
    """The chat template as transformers 5 finds it: `chat_template.jinja` first, else the
    config's entry (a string, or a list of named templates)."""
    file = path / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    value = config.get("chat_template")
    if isinstance(value, list):
        return {t["name"]: t["template"] for t in value}
    return value
