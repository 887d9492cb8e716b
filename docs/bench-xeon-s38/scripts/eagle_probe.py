"""Would a one-layer head over the target's features (EAGLE, Li et al. 2024) reach 2 tokens
per pass on held-out chat where the MLP heads plateau at 1.3-1.5? An offline probe, in
phases that each resume from what is on disk under OUT:

  states  ShareGPT text (the trainer's split: held-out prompts first) through the bf16
          target, 4 x 256 positions a batch: tokens, final-normed states, and the target's
          greedy choice after each prefix; shards of 8 batches, until --states-minutes.
  eval    the trainer's 8 held-out prompts, the target's greedy 48-token continuations
          (the engine), and the states of prompt + continuation.
  train   the head, teacher-forced over the shards (epochs), until --train-minutes;
          checkpoint every 50 steps. (stop 42 added --anneal: the rate falls linearly to
          a tenth over the run's minutes; a resumed run starts its fall afresh.)
  score   chains of k drafted tokens from every continuation position, against the
          target's own continuation: 1 + mean accepted = tokens per target pass.
          (stop 42 added walked_kN: windows only where the last one ended, as the engine
          drafts. The mean over every position weighs the easy stretches once per token,
          where the engine crosses them in a few passes, so it reads higher.)

The head: input at position j is fc([embed(x_{j+1}), f_j]) (f: the target's final-normed
state, x: tokens); one Qwen2 decoder layer over those inputs (causal, RoPE); its output
f^_{j+1} regresses f_{j+1} (smooth L1) and is scored by the target's lm_head rows of a
16,384-id draft vocabulary (cross-entropy against the target's greedy choice). Drafting
feeds f^ back in as the next input's feature.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

MODEL = "qwen2.5-coder-1.5b-instruct"
MLP_HEADS = Path("~/.cache/specdec/runs/qwen15-heads-amx").expanduser()


def load_target():
    from specdec.models.loading import load_transformer
    from specdec.models.registry import resolve
    from specdec.tokenization import eos_token_ids, load_tokenizer

    path = resolve(MODEL, "bf16")
    tok = load_tokenizer(path)
    target = load_transformer(path, "bf16", torch.device("cpu")).eval().requires_grad_(False)
    return target, tok, eos_token_ids(path, tok)


def corpus_split(tok):
    from specdec.speculator.train import Corpus, document_order, load_records

    corpus = Corpus(load_records("sharegpt"), tok, chat=True)
    order = document_order(len(corpus), 0)
    return corpus, order[:8], order[8:]


# --- phases: data ---------------------------------------------------------------------


def phase_states(out: Path, minutes: float) -> None:
    from specdec.speculator.train import PackedStream, TargetStates, target_labels

    target, tok, _ = load_target()
    corpus, _, train_docs = corpus_split(tok)
    stream = PackedStream(corpus, train_docs, 4, 256, tok.eos_token_id)
    states = TargetStates(target)
    shards = sorted(out.glob("shard-*.safetensors"))
    for _ in range(len(shards) * 8):  # skip the text already in shards
        stream.next_batch()
    started = time.perf_counter()
    n = first = len(shards)
    while time.perf_counter() - started < minutes * 60:
        toks, hids, labs = [], [], []
        for _ in range(8):
            tokens = stream.next_batch()
            hidden = states(tokens)
            toks.append(tokens)
            hids.append(hidden)
            labs.append(target_labels(target, hidden, tokens))
        tensors = {
            "tokens": torch.cat(toks),
            "hidden": torch.cat(hids).contiguous(),
            "labels": torch.cat(labs),
        }
        file = out / f"shard-{n:05d}.safetensors"
        save_file(tensors, str(file.with_suffix(".tmp")))
        file.with_suffix(".tmp").rename(file)
        n += 1
        rate = (n - first) * 8 * 1024 / max(1e-9, time.perf_counter() - started)
        print(f"shard {n}: {n * 8 * 1024} positions, {rate:.0f}/s (this run)", flush=True)


def phase_eval_data(out: Path) -> None:
    from specdec.config import SamplingParams
    from specdec.engine import Engine
    from specdec.speculator.train import TargetStates

    file = out / "eval.safetensors"
    if file.is_file():
        return
    target, tok, eos = load_target()
    corpus, eval_docs, _ = corpus_split(tok)
    prompts = [p for p in (corpus.prompt_ids(i) for i in eval_docs) if 1 <= len(p) <= 512]
    engine = Engine(target, tok, eos, max_batch=8)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
    states = TargetStates(target)
    tensors = {}
    for j, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        seq = torch.tensor(p + o.token_ids)[None]
        tensors[f"tokens.{j}"] = seq[0]
        tensors[f"hidden.{j}"] = states(seq)[0].contiguous()
        tensors[f"prompt.{j}"] = torch.tensor(len(p))
    save_file(tensors, str(file))


# --- the head -----------------------------------------------------------------------


def rope(positions: torch.Tensor, head_dim: int, theta: float):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = positions[..., None].float() * inv  # [..., D/2]
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class EagleHead(nn.Module):
    def __init__(self, cfg, embed: torch.Tensor, head_rows: torch.Tensor, inter: int) -> None:
        super().__init__()
        E = cfg.hidden_size
        self.E, self.H, self.Hkv, self.D = E, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.theta, self.eps = cfg.rope_theta, cfg.rms_norm_eps
        self.register_buffer("embed", embed, persistent=False)  # [V, E] frozen
        self.register_buffer("head_rows", head_rows, persistent=False)  # [N, E] frozen
        self.fc = nn.Linear(2 * E, E)
        self.norm1 = nn.RMSNorm(E, eps=self.eps)
        self.q = nn.Linear(E, self.H * self.D)
        self.k = nn.Linear(E, self.Hkv * self.D)
        self.v = nn.Linear(E, self.Hkv * self.D)
        self.o = nn.Linear(self.H * self.D, E, bias=False)
        self.norm2 = nn.RMSNorm(E, eps=self.eps)
        self.gate_up = nn.Linear(E, 2 * inter, bias=False)
        self.down = nn.Linear(inter, E, bias=False)
        self.norm = nn.RMSNorm(E, eps=self.eps)  # f^ lives where f does: final-normed
        with torch.no_grad():  # start as the identity on the feature: f^_{j+1} = f_j
            self.fc.weight.zero_()
            self.fc.weight[:, E:] = torch.eye(E)
            self.fc.bias.zero_()
            self.o.weight.mul_(0.1)
            self.down.weight.mul_(0.1)

    def inputs(self, tokens_next: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        e = self.embed[tokens_next].to(feats.dtype)
        return self.fc(torch.cat([e, feats], -1))

    def qkv(self, x, positions):
        x = self.norm1(x)
        B, T, _ = x.shape
        cos, sin = rope(positions, self.D, self.theta)
        cos, sin = cos[:, :, None].to(x.dtype), sin[:, :, None].to(x.dtype)
        q = rotate(self.q(x).view(B, T, self.H, self.D), cos, sin)
        k = rotate(self.k(x).view(B, T, self.Hkv, self.D), cos, sin)
        v = self.v(x).view(B, T, self.Hkv, self.D)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q, k, v, mask=None, causal=False):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
        )
        B, _, T, _ = out.shape
        return self.o(out.transpose(1, 2).reshape(B, T, self.H * self.D))

    def mlp(self, x):
        """The MLP block and the final norm: the residual stream -> f^."""
        gate, up = self.gate_up(self.norm2(x)).chunk(2, -1)
        return self.norm(x + self.down(F.silu(gate) * up))

    def forward(self, tokens_next, feats, positions):
        """Teacher-forced: [B, T] next tokens, [B, T, E] features -> [B, T, E] f^."""
        x = self.inputs(tokens_next, feats)
        q, k, v = self.qkv(x, positions)
        return self.mlp(x + self.attend(q, k, v, causal=True))

    def logits(self, f):
        # As rows (stop 40): a strided [B, T, E] slice went through a batched product that
        # copied the vocabulary table per sequence, half the training step's time.
        out = F.linear(f.reshape(-1, f.shape[-1]), self.head_rows.to(f.dtype))
        return out.view(*f.shape[:-1], out.shape[-1])


# --- phases: train and score ----------------------------------------------------------


def build_head(target, inter: int):
    from safetensors import safe_open  # noqa: I001

    with safe_open(str(MLP_HEADS / "model.safetensors"), "pt") as f:
        vocab_map = f.get_tensor("vocab_map").long()  # [N] target ids, sorted
    embed = target.embed_tokens.weight.detach()
    rows = target.lm_head.weight.detach()[vocab_map]
    head = EagleHead(target.config, embed, rows, inter)
    with torch.no_grad():
        head.norm.weight.copy_(target.norm.weight.float())
    to_draft = torch.full((target.config.vocab_size,), -100, dtype=torch.long)
    to_draft[vocab_map] = torch.arange(len(vocab_map))
    return head, vocab_map, to_draft


def phase_train(
    out: Path,
    minutes: float,
    inter: int,
    lr: float,
    w_cls: float,
    unroll: int,
    tag: str,
    init: str,
    anneal: bool = False,
) -> None:
    target, _, _ = load_target()
    head, _, to_draft = build_head(target, inter)
    shards = sorted(out.glob("shard-*.safetensors"))
    data = [load_file(str(s)) for s in shards]
    tokens = torch.cat([d["tokens"] for d in data])  # [R, 256]
    hidden = torch.cat([d["hidden"] for d in data])  # [R, 256, E] bf16
    labels = torch.cat([d["labels"] for d in data])
    del data
    R, T = tokens.shape
    print(
        f"{R} rows x {T}: {R * T} positions; feature RMS {hidden.float().pow(2).mean().sqrt():.3f}"
    )
    opt = torch.optim.AdamW(
        [p for p in head.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95)
    )
    ckpt = out / f"head-{tag}.pt"
    step, log = 0, out / f"train-{tag}.jsonl"
    if ckpt.is_file() or init:
        saved = torch.load(ckpt if ckpt.is_file() else out / f"head-{init}.pt")
        head.load_state_dict(saved["head"], strict=False)
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
    B = 4
    steps_per_epoch = R // B
    positions = torch.arange(T - 1)[None].expand(B, -1)
    noise = 0.1 * float(hidden[:64].float().pow(2).mean().sqrt())
    started = time.perf_counter()
    g = torch.Generator().manual_seed(step)
    while time.perf_counter() - started < minutes * 60:
        epoch, i = divmod(step, steps_per_epoch)
        perm = torch.randperm(R, generator=torch.Generator().manual_seed(epoch))
        rows = perm[i * B : (i + 1) * B]
        f = hidden[rows].float()  # [B, T, E]
        x = tokens[rows]
        y = to_draft[labels[rows][:, 2:]]  # [B, T-2]: the target's choice after position j+1
        feats_in = f[:, :-1] + (torch.rand(f[:, :-1].shape, generator=g) * 2 - 1) * noise
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            steps = unrolled(head, x[:, 1:], feats_in, positions, unroll)
            logits = head.logits(steps[0][:, :-1])  # [B, T-2, N]
        reg = F.smooth_l1_loss(steps[0].float(), f[:, 1:])
        cls = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
        for s_, pred_s in enumerate(steps[1:], start=2):  # step s at input positions >= s-1
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits_s = head.logits(pred_s[:, s_ - 1 : -1])
            reg = reg + F.smooth_l1_loss(pred_s[:, s_ - 1 :].float(), f[:, s_:])
            y_s = to_draft[labels[rows][:, s_ + 1 :]]
            cls = cls + F.cross_entropy(
                logits_s.float().flatten(0, 1), y_s.flatten(), ignore_index=-100
            )
        loss = reg + w_cls * cls
        lr_now = lr * min(1.0, (step + 1) / 50)
        if anneal:  # linearly down to a tenth over this run's minutes
            lr_now *= 1 - 0.9 * min(1.0, (time.perf_counter() - started) / (minutes * 60))
        for group in opt.param_groups:
            group["lr"] = lr_now
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        opt.step()
        step += 1
        with torch.no_grad():
            acc = (logits.argmax(-1) == y)[y >= 0].float().mean()
        if step % 10 == 0:
            row = {
                "step": step,
                "epoch": round(step / steps_per_epoch, 3),
                "reg": round(float(reg), 4),
                "cls": round(float(cls), 4),
                "acc1": round(float(acc), 4),
                "pos_per_s": round(B * (T - 1) / (time.perf_counter() - t0)),
            }
            print(json.dumps(row), flush=True)
            with log.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
        if step % 50 == 0:
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)


def unrolled(head, tokens_next, feats, positions, unroll: int) -> list[torch.Tensor]:
    """Predictions of draft steps 1..unroll at every input position, each `[B, T, E]`
    (training-time test, as HASS / EAGLE-3): step s at position p reads the step s-1
    prediction made at p-1 and the true next token (the case that matters: the earlier
    drafts were right), attending to the true entries at positions <= p-s+1 and to the
    entries steps 2..s made on its own chain (position p-(s-i) for step i)."""
    x = head.inputs(tokens_next, feats)
    q, k, v = head.qkv(x, positions)
    preds = [head.mlp(x + head.attend(q, k, v, causal=True))]
    T = x.shape[1]
    p = torch.arange(T)
    keys, values = [k], [v]
    for s in range(2, unroll + 1):
        prev = torch.cat([preds[-1][:, :1], preds[-1][:, :-1]], 1)  # step s-1 at p-1
        xs = head.inputs(tokens_next, prev)
        qs, ks, vs = head.qkv(xs, positions)
        keys.append(ks)
        values.append(vs)
        blocks = [p[None, :] <= p[:, None] - s + 1]  # true entries
        blocks += [p[None, :] == p[:, None] - (s - i) for i in range(2, s + 1)]
        mask = torch.cat(blocks, 1)  # [T, T * (s)]
        att = head.attend(qs, torch.cat(keys, 2), torch.cat(values, 2), mask=mask)
        preds.append(head.mlp(xs + att))
    return preds


@torch.no_grad()
def phase_score(out: Path, inter: int, ks: list[int], tag: str) -> dict:
    from specdec.speculator.train import walked_windows

    target, _, _ = load_target()
    head, vocab_map, _ = build_head(target, inter)
    ckpt = out / f"head-{tag}.pt"
    saved = torch.load(ckpt)
    head.load_state_dict(saved["head"], strict=False)
    head.eval()
    data = load_file(str(out / "eval.safetensors"))
    K = max(ks)
    accepted = {k: [] for k in ks}
    walked = {k: [0, 0] for k in ks}  # tokens, passes along the engine's own walk
    first_right = []
    for j in range(sum(n.startswith("tokens.") for n in data)):
        x, f, p = data[f"tokens.{j}"], data[f"hidden.{j}"].float(), int(data[f"prompt.{j}"])
        S = len(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inp = head.inputs(x[None, 1:], f[None, :-1])  # [1, S-1, E]
            q, k, v = head.qkv(inp, torch.arange(S - 1)[None])
            step1 = head.mlp(inp + head.attend(q, k, v, causal=True))  # [1, S-1, E]
        # drafts start after the committed token x_{t+1}, t + 1 >= p (in the continuation)
        runs = {}
        for t in range(p - 1, S - 2):
            fh = step1[:, t : t + 1]
            drafts = []
            kk, vv = k[:, :, : t + 1], v[:, :, : t + 1]
            for i in range(K):
                d = int(vocab_map[head.logits(fh.float()).argmax(-1)])
                drafts.append(d)
                if i == K - 1:
                    break
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    xi = head.inputs(torch.tensor([[d]]), fh.float())
                    qi, ki, vi = head.qkv(xi, torch.tensor([[t + 1 + i]]))
                    kk, vv = torch.cat([kk, ki], 2), torch.cat([vv, vi], 2)
                    fh = head.mlp(xi + head.attend(qi, kk, vv))
            truth = x[t + 2 : t + 2 + K].tolist()
            run = 0
            for a, b in zip(drafts, truth, strict=False):
                if a != b:
                    break
                run += 1
            runs[t] = run
            first_right.append(bool(truth) and drafts[0] == truth[0])
            for kq in ks:
                if t + 2 + kq <= S:  # the whole window lies in the continuation
                    accepted[kq].append(min(run, kq))
        for kq in ks:  # the engine's windows start only where its last one ended
            fits = torch.tensor([runs[t] for t in range(p - 1, S - 1 - kq)])  # whole windows
            tokens, passes = walked_windows((torch.arange(kq)[None] < fits[:, None]).long())
            walked[kq][0] += tokens
            walked[kq][1] += passes
    result = {
        "step": saved["step"],
        "tag": tag,
        "top1_first": round(sum(first_right) / len(first_right), 4),
        **{f"tokens_per_pass_k{k}": round(1 + sum(a) / len(a), 4) for k, a in accepted.items()},
        **{f"walked_k{k}": round(n / passes, 4) for k, (n, passes) in walked.items()},
        "positions": {k: len(a) for k, a in accepted.items()},
    }
    print(json.dumps(result), flush=True)
    with (out / "scores.jsonl").open("a") as fh:
        fh.write(json.dumps(result) + "\n")
    return result


def phase_export(out: Path, inter: int, tag: str, to: Path, n_predict: int) -> None:
    """The checkpoint as a head directory `specdec --draft` and `bench --heads` load."""
    from safetensors import safe_open

    from specdec.speculator.eagle import build_eagle

    target, _, _ = load_target()
    with safe_open(str(MLP_HEADS / "model.safetensors"), "pt") as f:
        vocab_map = f.get_tensor("vocab_map").long()
    head = build_eagle(target, vocab_map, inter, n_predict=n_predict)
    saved = torch.load(out / f"head-{tag}.pt")
    missing, unexpected = head.load_state_dict(saved["head"], strict=False)
    assert missing == ["vocab_map"] and not unexpected, (missing, unexpected)
    head.save(to)
    print(f"wrote {to} (step {saved['step']})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["states", "eval", "train", "score", "export"])
    ap.add_argument("--to", default=None, help="export: the head directory to write")
    ap.add_argument("--out", default="bench-out/s38/eagle")
    ap.add_argument("--states-minutes", type=float, default=12)
    ap.add_argument("--train-minutes", type=float, default=20)
    ap.add_argument("--inter", type=int, default=8960)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--w-cls", type=float, default=0.1)
    ap.add_argument("--ks", default="1,2,3,4,5")
    ap.add_argument("--unroll", type=int, default=1, help="draft steps trained per position")
    ap.add_argument("--tag", default=None, help="checkpoint name (default: --inter)")
    ap.add_argument("--init", default="", help="start from checkpoint head-INIT.pt")
    ap.add_argument("--anneal", action="store_true", help="train: rate down to a tenth by the end")
    args = ap.parse_args()
    out = Path(args.out)
    tag = args.tag or str(args.inter)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if args.phase == "states":
        phase_states(out, args.states_minutes)
    elif args.phase == "eval":
        phase_eval_data(out)
    elif args.phase == "train":
        phase_train(
            out,
            args.train_minutes,
            args.inter,
            args.lr,
            args.w_cls,
            args.unroll,
            tag,
            args.init,
            args.anneal,
        )
    elif args.phase == "export":
        phase_export(
            out, args.inter, tag, Path(args.to).expanduser(), max(map(int, args.ks.split(",")))
        )
    else:
        phase_score(out, args.inter, [int(k) for k in args.ks.split(",")], tag)


if __name__ == "__main__":
    main()
