"""Where the bench suite's 4 ShareGPT prompts fall in the speculator trainer's seed-0 order
of the conversations (stop 36): a prompt the stage-1 stream or stage 2 reached is not held
out. Prints each prompt's position; the trainer uses positions from `eval_prompts` on,
front first."""

from specdec.bench import workloads
from specdec.speculator.train import _messages, document_order, load_records

records = [r for r in load_records("sharegpt") if _messages(r)]
order = document_order(len(records), 0)
where = {doc: pos for pos, doc in enumerate(order)}
firsts = {}
for i, r in enumerate(records):
    user = next((m for m in _messages(r) if m["role"] == "user"), None)
    if user is not None:
        firsts.setdefault(user["content"].strip(), i)
for text in workloads.sharegpt_prompts(4, seed=0):
    i = firsts.get(text.strip())
    print(None if i is None else where[i], repr(text[:60]))
