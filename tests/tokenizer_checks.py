"""Checks that a tokenizer specdec loads equals `transformers.AutoTokenizer`'s on everything
specdec uses (tests/unit/test_light_tokenizer.py, tests/slow/test_light_tokenizer_real.py)."""

import transformers

from specdec.light_tokenizer import LightTokenizer
from specdec.tokenization import encode_chat, eos_token_ids

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": 'Weather <now> & "later" in a city: ünïcode',
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = [
    [{"role": "user", "content": "hi there"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "what's 2+2?"},
        {"role": "assistant", "content": "4", "reasoning": "easy", "tool_calls": None},
        {"role": "user", "content": "and 3+3?"},
    ],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "STOP"}],
]

TEXTS = [
    "Hello world",
    "e\u0301 héllo wörld 日本語 🎉 ",  # a decomposed é (NFC matters), multi-byte text
    "<|im_start|>user\nhi<|im_end|><|endoftext|>",
    "  spaces\n\n\ttabs ",
    "def f(x):\n    return x ** 2\n",
    "I don't know , right ? <eos>",
    "",
]


def assert_same(path, texts=TEXTS, conversations=CONVERSATIONS):
    light = LightTokenizer.from_directory(path)
    assert light is not None
    hf = transformers.AutoTokenizer.from_pretrained(path)
    for text in texts:
        for special in (True, False):
            ids = light(text, add_special_tokens=special)["input_ids"]
            assert ids == hf(text, add_special_tokens=special)["input_ids"], (text, special)
            for skip in (True, False):
                assert light.decode(ids, skip_special_tokens=skip) == hf.decode(
                    ids, skip_special_tokens=skip
                )
    every = list(range(len(hf)))
    assert light.decode(every) == hf.decode(every)
    assert light.decode(every, skip_special_tokens=True) == hf.decode(
        every, skip_special_tokens=True
    )
    assert light.convert_ids_to_tokens(every) == hf.convert_ids_to_tokens(every)
    assert light.convert_ids_to_tokens(every, skip_special_tokens=True) == (
        hf.convert_ids_to_tokens(every, skip_special_tokens=True)
    )
    tokens = [*hf.get_vocab(), "<not a token>"]
    assert light.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    for name in (
        "bos_token_id",
        "eos_token_id",
        "unk_token_id",
        "pad_token_id",
        "bos_token",
        "eos_token",
        "all_special_tokens",
        "all_special_ids",
        "special_tokens_map",
        "chat_template",
        "vocab_size",
    ):
        assert getattr(light, name) == getattr(hf, name), name
    assert len(light) == len(hf)
    assert light.get_vocab() == hf.get_vocab()
    assert {i: repr(t) for i, t in light.added_tokens_decoder.items()} == {
        i: repr(t) for i, t in hf.added_tokens_decoder.items()
    }
    assert eos_token_ids(path, light) == eos_token_ids(path, hf)
    if hf.chat_template:
        for conv in conversations:
            for tools in (None, TOOLS):
                for prompt in (True, False):
                    args = dict(tools=tools, add_generation_prompt=prompt, tokenize=False)
                    text = light.apply_chat_template(conv, **args)
                    assert text == hf.apply_chat_template(conv, **args)
                assert encode_chat(light, conv, tools) == encode_chat(hf, conv, tools)
        assert light.apply_chat_template(conversations, tokenize=False) == (
            hf.apply_chat_template(conversations, tokenize=False)
        )
    return light, hf
