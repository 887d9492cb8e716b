"""The light tokenizer (tokenizer.json + tokenizer_config.json, no transformers) gives exactly
what `transformers.AutoTokenizer` gives, on tiny tokenizers of each kind it loads itself;
anything else is loaded by AutoTokenizer."""

import json
import re

import jinja2
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from specdec.errors import InvalidParameterError, ModelNotFoundError
from specdec.light_tokenizer import LightTokenizer
from specdec.tokenization import encode_chat, load_tokenizer

from tiny import tiny_tokenizer
from tokenizer_checks import CONVERSATIONS, TEXTS, TOOLS, assert_same

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A template using what Hub templates use: a system message, tools through `tojson`,
# loop controls, a namespace, `raise_exception`, indented block tags (trim/lstrip), the
# special tokens as variables, reasoning under another name, and the generation prompt.
TEMPLATE = """{{ bos_token }}
{% set ns = namespace(users=0) %}
{% if tools %}
    <tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>
{% endif %}
{% for message in messages %}
    {% if message.role not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('unknown role ' + message.role) }}
    {% endif %}
    {% if message.role == 'user' %}{% set ns.users = ns.users + 1 %}{% endif %}
    {% if message.content == 'STOP' %}{% break %}{% endif %}
    <|im_start|>{{ message.role }}
{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}
{{ message.content }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant ({{ ns.users }} turns)
{% endif %}"""


def byte_bpe(post_processor=None) -> Tokenizer:
    """A byte-level BPE (the Qwen2 / SmolLM2 kind) trained on a few lines."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [t * 20 for t in TEXTS] + ["the quick brown fox jumps over the lazy dog"] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    if post_processor is not None:
        tok.post_processor = post_processor
    return tok


def save(tmp_path, name, backend, model_type=None, template=TEMPLATE, edit=None, **special):
    """A model directory as transformers 5 saves it (plus a config.json naming the model
    type, which decides the tokenizer class AutoTokenizer builds)."""
    out = tmp_path / name
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    if template is not None:
        hf.chat_template = template
    hf.save_pretrained(out)
    if model_type is not None:
        (out / "config.json").write_text(json.dumps({"model_type": model_type}))
    if edit is not None:
        file = out / "tokenizer_config.json"
        file.write_text(json.dumps(edit(json.loads(file.read_text()))))
    return out


def test_byte_level_bpe_is_loaded_as_transformers_loads_it(tmp_path):
    path = save(
        tmp_path,
        "bpe",
        byte_bpe(),
        "llama",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    light, _ = assert_same(path)
    assert light.eos_token_id == 2 and light.bos_token_id == 1


def test_qwen2_models_get_qwen2s_own_pipeline(tmp_path):
    """AutoTokenizer builds Qwen2Tokenizer for a qwen2 model whatever the config names:
    NFC normalization (the file has none), Qwen's split, its special-token defaults."""
    path = save(tmp_path, "qwen", byte_bpe(), "qwen2", eos_token="<|im_end|>")
    light, _ = assert_same(path)
    assert light("e\u0301")["input_ids"] == light("é")["input_ids"]
    assert light.pad_token == "<|endoftext|>" and light.bos_token is None


def test_character_level_tokenizer_with_clean_up_and_dict_tokens(tmp_path):
    """tests/tiny.py's tokenizer, with the clean-up of spaces before punctuation (applied:
    not a BPE) and a special token stored as an AddedToken dict."""

    def edit(config):
        config["clean_up_tokenization_spaces"] = True
        config["eos_token"] = {
            "__type": "AddedToken",
            "content": "<eos>",
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        return config

    backend = tiny_tokenizer().backend_tokenizer
    path = save(
        tmp_path,
        "chars",
        backend,
        template=TEMPLATE.replace("{{ bos_token }}", ""),
        edit=edit,
        unk_token="<unk>",
        eos_token="<eos>",
    )
    light, _ = assert_same(path, texts=[t for t in TEXTS if t.isascii()])
    assert light.decode(light("a , b ?")["input_ids"]) == "a, b?"


def test_post_processor_adds_bos_as_the_file_says(tmp_path):
    """A bos the file's post-processor adds is added with special tokens, never without;
    add_bos_token in the config does not change it (transformers ignores it when there is
    a tokenizer.json)."""
    post = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", 0)]
    )

    def edit(config):
        config["add_bos_token"] = False
        return config

    path = save(
        tmp_path,
        "bos",
        byte_bpe(post),
        "llama",
        edit=edit,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    light, _ = assert_same(path)
    assert light("hi")["input_ids"][0] == 0
    assert light("hi", add_special_tokens=False)["input_ids"][0] != 0


def test_named_templates_and_the_jinja_file(tmp_path):
    """Several templates by name (tools pick `tool_use`); a chat_template.jinja overrides
    the config's entry, as transformers 5 saves and reads it."""

    def named(config):
        config["chat_template"] = [
            {"name": "default", "template": "D:{% for m in messages %}{{ m.content }}{% endfor %}"},
            {"name": "tool_use", "template": "T:{{ tools | length }}"},
        ]
        return config

    path = save(
        tmp_path, "named", byte_bpe(), "llama", template=None, edit=named, eos_token="<|im_end|>"
    )
    light, _ = assert_same(path)
    assert light.apply_chat_template(CONVERSATIONS[0], tokenize=False) == "D:hi there"
    assert light.apply_chat_template(CONVERSATIONS[0], tools=TOOLS, tokenize=False) == "T:1"
    path = save(tmp_path, "file", byte_bpe(), "llama", eos_token="<|im_end|>")
    assert (path / "chat_template.jinja").is_file()
    assert LightTokenizer.from_directory(path).chat_template == TEMPLATE


def test_template_errors_and_sandbox(tmp_path):
    path = save(tmp_path, "errors", byte_bpe(), "llama", eos_token="<|im_end|>")
    light = load_tokenizer(path)
    assert isinstance(light, LightTokenizer)
    bad = [{"role": "robot", "content": "x"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role robot"):
        light.apply_chat_template(bad, tokenize=False)
    with pytest.raises(InvalidParameterError, match="unknown role robot"):
        encode_chat(light, bad)
    with pytest.raises(ValueError, match="empty conversation"):
        light.apply_chat_template([], tokenize=False)
    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        light.apply_chat_template(CONVERSATIONS[0], chat_template=escape, tokenize=False)
    with pytest.raises(jinja2.exceptions.SecurityError):
        light.apply_chat_template(
            CONVERSATIONS[0], chat_template="{% set ns = namespace(_x=1) %}", tokenize=False
        )
    year = light.apply_chat_template(
        CONVERSATIONS[0], chat_template="{{ strftime_now('%Y') }}", tokenize=False
    )
    assert year.isdigit() and len(year) == 4


def test_other_directories_go_to_autotokenizer(tmp_path):
    path = save(
        tmp_path,
        "llama_class",
        byte_bpe(),
        "llama",
        eos_token="<|im_end|>",
        edit=lambda c: {**c, "tokenizer_class": "LlamaTokenizer"},
    )
    assert LightTokenizer.from_directory(path) is None
    assert isinstance(load_tokenizer(path), transformers.PreTrainedTokenizerBase)
    unknown = save(
        tmp_path,
        "unknown",
        byte_bpe(),
        "llama",
        eos_token="<|im_end|>",
        edit=lambda c: {**c, "image_token": "<img>"},
    )
    assert LightTokenizer.from_directory(unknown) is None
    (unknown / "tokenizer.json").unlink()
    assert LightTokenizer.from_directory(unknown) is None
    with pytest.raises(ModelNotFoundError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path / "missing")
    broken = save(tmp_path, "broken", byte_bpe(), "llama", eos_token="<|im_end|>")
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelNotFoundError, match="cannot load a tokenizer"):
        load_tokenizer(broken)


def test_rare_uses_reach_the_transformers_tokenizer(tmp_path):
    """What the light tokenizer does not reproduce is served by the full one, loaded then."""
    path = save(tmp_path, "rare", byte_bpe(), "llama", eos_token="<|im_end|>")
    light = LightTokenizer.from_directory(path)
    assert light._hf is None
    assert light.padding_side == transformers.AutoTokenizer.from_pretrained(path).padding_side
    assert isinstance(light.hf, transformers.PreTrainedTokenizerBase)
    ids = light.apply_chat_template(
        CONVERSATIONS[0] + [{"role": "assistant", "content": "hel"}],
        continue_final_message=True,
        tokenize=False,
    )
    assert ids.endswith("hel")


def test_special_tokens_the_file_lacks_are_added_as_special(tmp_path):
    """A tokenizer.json written by `tokenizers` alone, whose special tokens are plain vocab
    entries: transformers makes the config's named tokens special (matched whole in text,
    skipped in decoding)."""
    path = save(
        tmp_path,
        "bare",
        tiny_tokenizer().backend_tokenizer,
        template=None,
        unk_token="<unk>",
        eos_token="<eos>",
    )
    bare = Tokenizer(models.WordLevel(vocab=tiny_tokenizer().get_vocab(), unk_token="<unk>"))
    bare.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    bare.decoder = decoders.Fuse()
    bare.save(str(path / "tokenizer.json"))
    assert not Tokenizer.from_file(str(path / "tokenizer.json")).get_added_tokens_decoder()
    light, _ = assert_same(path, texts=["ab<eos>c", "x <unk> y"])
    assert light("a<eos>")["input_ids"][-1] == 1
    assert light.decode(light("a<eos>")["input_ids"], skip_special_tokens=True) == "a"


def test_grammars_over_a_light_tokenizer_need_no_transformers(tmp_path):
    """llguidance reads the light tokenizer's own JSON (transformers is not loaded for it),
    a regex grammar admits exactly the tokens that keep the text inside it, and the mask is
    the one a transformers tokenizer gives."""
    from specdec.grammar import GrammarCompiler, allowed
    from specdec.params import Grammar

    path = save(tmp_path, "grammar", byte_bpe(), "llama", eos_token="<|im_end|>")
    light = load_tokenizer(path)
    masks = []
    for tok in (light, transformers.AutoTokenizer.from_pretrained(path)):
        grammars = GrammarCompiler(tok, len(light), frozenset({light.eos_token_id}))
        masks.append(allowed(grammars.matcher(Grammar("regex", "ab+")), len(light)))
    assert light._hf is None  # never loaded
    assert torch.equal(masks[0], masks[1])
    ok = {i for i in range(len(light)) if masks[0][i]}
    assert ok and all(re.fullmatch("ab*", light.decode([i])) for i in ok)
    assert light.convert_tokens_to_ids("a") in ok
    assert light.convert_tokens_to_ids("b") not in ok


def test_streamed_text_is_the_same_over_either_tokenizer(tmp_path):
    """The server's incremental detokenizer (tokenizers' DecodeStream over the backend, stop
    strings cut) sends the same pieces over a light tokenizer as over AutoTokenizer's."""
    from specdec.serving.detokenizer import IncrementalDetokenizer

    path = save(tmp_path, "stream", byte_bpe(), "qwen2", eos_token="<|im_end|>")
    light, hf = (
        LightTokenizer.from_directory(path),
        transformers.AutoTokenizer.from_pretrained(path),
    )
    ids = hf("naïve café 世界 🙂 done.<|im_end|> the end")["input_ids"]
    pieces = []
    for tok in (light, hf):
        detok = IncrementalDetokenizer(tok, stop=("the e",))
        pieces.append([detok.delta(ids[: i + 1]) for i in range(len(ids))] + [detok.finish(ids)])
    assert pieces[0] == pieces[1]
    assert "".join(pieces[0]) == "naïve café 世界 🙂 done. "
