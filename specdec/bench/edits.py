"""The `edits` workload: the same code files edited across a sequence of requests, as
code-editing assistants and agents send them (traffic that repeats itself across requests).

Each file answers one of the bench's code prompts (`workloads.CODE_PROMPTS`); request i
asks for one edit to a file and quotes the file, as the request before it on that file
did, and asks for the whole file back. The files take turns, so a request's answer
repeats the answers of earlier requests (on its file) rather than only the one before.
The instruction comes before the file, so requests share no long prefix for a prefix
cache to skip: what a drafter gains here is decoding, not prefill.
"""

from __future__ import annotations

from specdec.data import CODE_PROMPTS

# (the code prompt a file answers, the file's name, its text)
FILES = (
    (
        CODE_PROMPTS[1],
        "lru_cache.py",
        '''from collections import OrderedDict


class LRUCache:
    """A least-recently-used cache holding at most `capacity` items."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items = OrderedDict()

    def get(self, key):
        if key not in self.items:
            return -1
        self.items.move_to_end(key)
        return self.items[key]

    def put(self, key, value) -> None:
        if key in self.items:
            self.items.move_to_end(key)
        self.items[key] = value
        if len(self.items) > self.capacity:
            self.items.popitem(last=False)
''',
    ),
    (
        CODE_PROMPTS[11],
        "account.py",
        """from dataclasses import dataclass


class InsufficientFunds(Exception):
    pass


@dataclass
class BankAccount:
    owner: str
    balance: float = 0.0

    def deposit(self, amount: float) -> float:
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        return self.balance

    def withdraw(self, amount: float) -> float:
        if amount <= 0:
            raise ValueError("withdrawal must be positive")
        if amount > self.balance:
            raise InsufficientFunds(f"balance {self.balance} < {amount}")
        self.balance -= amount
        return self.balance
""",
    ),
    (
        CODE_PROMPTS[7],
        "word_count.py",
        """import sys
from collections import Counter


def count_words(path: str) -> Counter:
    counts = Counter()
    with open(path) as f:
        for line in f:
            for word in line.lower().split():
                counts[word.strip(".,;:!?\\"'()")] += 1
    return counts


def main() -> None:
    counts = count_words(sys.argv[1])
    for word, n in counts.most_common(10):
        print(f"{word}: {n}")


if __name__ == "__main__":
    main()
""",
    ),
)

# Edits any of the files can take.
EDITS = (
    "Add type hints to every function and method that lacks them.",
    "Add a docstring to every function and method.",
    "Add logging with the logging module: log every public call at debug level.",
    "Rename the main class or function to a clearer name and update every use.",
    "Add input validation that raises ValueError with a clear message on bad arguments.",
    "Add a __repr__ or a helper that prints the current state, and use it.",
    "Make the code thread-safe with a threading.Lock.",
    "Add a small unittest test case at the end of the file.",
)


def edit_texts(n: int) -> list[str]:
    """The first n requests: files in turn, each file's edits in order."""
    texts = []
    for i in range(n):
        prompt, name, code = FILES[i % len(FILES)]
        edit = EDITS[(i // len(FILES)) % len(EDITS)]
        texts.append(
            f'{edit}\n\nHere is {name}, written for the task "{prompt}":\n\n'
            f"```python\n{code}```\n\n"
            "Reply with the complete updated file in one code block."
        )
    return texts
