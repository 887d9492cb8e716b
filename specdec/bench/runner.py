"""Measures one point: builds the prompts and the method's engine, times `generate`.

Models are loaded once per run (the target with its draft through `LLM`, transformers'
copies and llama.cpp only when a peer point asks for them). Each point gets a fresh engine
and, for `auto`, a fresh window, so what it learned at one point never helps another. The
`-auto-warm` methods are `auto` as a user's repeated processes run it: each run starts from
the costs and acceptance the point's previous run ended with, passed through the cost
cache's JSON (`CostModel.to_json`, `AdaptiveWindow.acceptance_state`); an unmeasured full
run first, so the first timed run starts warm too.

A run is the point's prompts in rounds of `batch`, one `generate` call each on the run's
engine (a fresh one per run), so a round is a batch of requests decoded together; the
run's time is the sum of its rounds' wall clocks, and tokens/s is generated tokens over
it, prefill included, as a user waiting for each batch sees it. With `repeats` > 1 the
point runs that many times, in turns with its group's other methods (`measure_group`:
round by round, or with `interleave="steps"` our engines step by step), and the median
run is kept (every run's tokens/s is recorded, in run
order): on a shared CPU one run can be slowed several-fold by a neighbour. TPOT and TTFT
are per request, from the engine's own `SpecStats` (peers report neither).

Tensor parallelism (`tp` > 1, under torchrun): every rank runs the same points in lockstep,
since each forward pass is collective. What is recorded from local timing (a point's row,
the measured costs) is rank 0's, broadcast, so every rank holds the same results and
makes the same decisions from them; `auto`'s k is rank 0's each step. Peers load the
whole model in one process and are skipped.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec import data as workloads
from specdec.bench import edits, peers
from specdec.bench.costs import measure_costs
from specdec.bench.memory import peak_rss_bytes, reset_peak
from specdec.bench.plan import INTERLEAVES, Point, is_peer, vllm_draft_k
from specdec.bench.rows import (
    decode_rate,
    result_row,
    round_or_none,
    threads_scaling,
)
from specdec.bench.turn_log import TurnLog, Turns
from specdec.distributed import shared_window
from specdec.drafters import EagleDrafter, NgramDrafter
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.drafters.mlp_heads import SpeculatorDrafter
from specdec.drafters.suffix import SuffixStore, suffix_factory
from specdec.engine import Engine
from specdec.errors import InvalidParameterError, SpecdecError
from specdec.heads.eagle import EagleHead
from specdec.heads.eagle3 import Eagle3Head
from specdec.llm import LLM, build_acceptor, build_window, tuned_layers
from specdec.params import SamplingParams
from specdec.tokenization import encode_prompt
from specdec.window import CostModel


class Skip(Exception):
    """A point that cannot be measured here (a peer not installed, a prompt too long)."""


# A run in progress: yields after each round (a batch of the point's prompts), then
# returns (token ids, stats or None, prefill s) of the whole run.
Rounds = Generator[None, None, tuple]


@dataclass
class Trial:
    """A point being measured: its prompts, `rounds()` (one run, round by round) and the
    timed runs so far (wall s, CPU s, token ids, stats, prefill s), in the order they ran."""

    point: Point
    prompts: list[list[int]]
    rounds: Callable[[], Rounds]
    runs: list[tuple] = field(default_factory=list)
    peak_rss: int = 0  # bytes: the process's highest RSS while the point warmed up and ran


@dataclass
class _Timing:
    """One run being timed round by round: its rounds, and their wall and CPU seconds."""

    rounds: Rounds
    wall: float = 0.0
    cpu: float = 0.0
    result: tuple | None = None

    def advance(self) -> bool:
        """Time the next round; False once the run has returned its result."""
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            next(self.rounds)
            done = False
        except StopIteration as end:
            self.result, done = end.value, True
        self.wall += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        return not done


class Runner:
    def __init__(
        self,
        model: str,
        draft: str | None,
        dtype: str,
        device: str,
        k_max: int,
        max_tokens: int,
        prompts_per_point: int,
        ignore_eos: bool = False,
        synthetic_source: str = "sharegpt",
        draft_quant: str | None = None,
        draft_vocab: int | None = None,
        quant: str = "none",
        repeats: int = 1,
        heads: str | None = None,
        heads_tree: tuple[int, ...] | None = None,
        heads_candidates: int | None = None,
        tp: int = 1,
        draft_tp: int = 1,
        cuda_graphs: bool = True,
        vllm_python: str | None = None,
        prefix_cache_tokens: int = 4096,
        interleave: str = "rounds",
        prefill_chunk: int | str | None = "auto",
    ) -> None:
        if interleave not in INTERLEAVES:
            raise InvalidParameterError(
                f"interleave must be one of {', '.join(INTERLEAVES)}, got {interleave!r}"
            )
        self.interleave = interleave
        self.model_name, self.draft_name = model, draft
        self.dtype, self.device, self.k_max = dtype, device, k_max
        self.max_tokens, self.prompts_per_point = max_tokens, prompts_per_point
        self.ignore_eos, self.synthetic_source = ignore_eos, synthetic_source
        self.repeats = max(1, repeats)
        self.tp = tp
        self.llm = LLM(
            model,
            draft=draft,
            k_max=k_max,
            quant=quant,
            draft_quant=draft_quant,
            draft_vocab=draft_vocab,
            dtype=dtype,
            device=device,
            tp=tp,
            draft_tp=draft_tp,
            cuda_graphs=cuda_graphs,
            prefix_cache_tokens=prefix_cache_tokens,
            prefill_chunk=prefill_chunk,
        )
        # Trained speculator heads on the same target (the heads-* methods), beside --draft.
        self.speculator = None
        if heads is not None:
            from specdec.drafters.kinds import heads_kind
            from specdec.heads.eagle import load_eagle
            from specdec.heads.eagle3 import load_eagle3
            from specdec.heads.mlp import load_speculator

            kind = heads_kind(Path(heads).expanduser())
            load = {"eagle": load_eagle, "eagle3": load_eagle3}.get(kind, load_speculator)
            spec = load(heads, self.llm.model, self.llm.model.dtype, device)
            # drafts as `LLM` would run them: on measured kernels, in the draft's format
            self.speculator = tuned_layers(spec.for_drafting(self.llm.draft_quant))
        self.heads_tree, self.heads_candidates = heads_tree, heads_candidates
        self._prompts: dict[str, list[list[int]]] = {}
        self._hf: dict[str, object] = {}
        self.vllm_python = vllm_python
        self._vllm: tuple[int, object] | None = None  # (draft k, VllmPeer): one alive at a time
        self._warm: set[tuple[str, int]] = set()
        # point key -> what its last run left for the next ("costs", "acceptance"): the
        # `-auto-warm` methods' stand-in for the cost cache a fresh process reads.
        self._carried: dict[str, dict] = {}
        self._llamacpp: tuple[int, object] | None = None  # (context, its model)

    # ------------------------------------------------------------------ prompts

    def prompts(self, point: Point) -> list[list[int]]:
        """The group's prompt ids (the same for every method): a whole number of batches,
        at least `prompts_per_point`."""
        n = point.batch * max(1, math.ceil(self.prompts_per_point / point.batch))
        key = f"{point.workload}|{point.prompt_len}|{n}"
        if key not in self._prompts:
            # Under tensor parallelism rank 0's prompts (ShareGPT is installed on demand:
            # by one process, on one machine).
            group = self.llm.tp
            leads = group is None or group.is_leader
            made = self._make_prompts(point.workload, point.prompt_len, n) if leads else None
            self._prompts[key] = made if group is None else group.broadcast_object(made)
        return self._prompts[key]

    def _make_prompts(self, workload: str, length: int | None, n: int) -> list[list[int]]:
        tok = self.llm.tokenizer
        chat = bool(getattr(tok, "chat_template", None))
        if workload == "code":
            texts = [workloads.CODE_PROMPTS[i % len(workloads.CODE_PROMPTS)] for i in range(n)]
            return [encode_prompt(tok, t, chat) for t in texts]
        if workload == "sharegpt":
            return [encode_prompt(tok, t, chat) for t in workloads.sharegpt_prompts(n, seed=0)]
        if workload == "edits":
            return [encode_prompt(tok, t, chat) for t in edits.edit_texts(n)]
        texts = None if self.synthetic_source == "sharegpt" else workloads.CODE_PROMPTS
        return [workloads.synthetic_prompt(tok, length, seed=i, texts=texts) for i in range(n)]

    def params(self, point: Point, n: int) -> list[SamplingParams]:
        """Greedy, or temperature sampling with a seed per request (repeatable)."""
        return [
            SamplingParams(
                temperature=point.temperature,
                max_tokens=self.max_tokens,
                seed=i if point.temperature > 0 else None,
                ignore_eos=self.ignore_eos,
            )
            for i in range(n)
        ]

    # ------------------------------------------------------------------ costs

    def costs(self, point: Point, ks: tuple[int, ...]) -> dict:
        """Verify curve and draft step cost at this point's batch size, at the context a
        step sees half way through the generation."""
        prompts = self.prompts(point)
        context = round(statistics.mean(len(p) for p in prompts)) + self.max_tokens // 2
        context = min(context, self.llm.model.config.max_position_embeddings - max(ks) - 2)
        draft = getattr(self.llm, "draft_model", None)
        measured = measure_costs(
            self.llm.model,
            draft,
            point.batch,
            context,
            ks,
            heads=self.speculator,
            **self.llm.engine_options,
        )
        return self._rank0s(measured)

    def _rank0s(self, measured: dict) -> dict:
        """Under tensor parallelism, rank 0's measurement on every rank (timings differ
        between ranks; what is recorded and decided from them must not)."""
        group = self.llm.tp
        return measured if group is None else group.broadcast_object(measured)

    # ------------------------------------------------------------------ measuring

    def measure_group(
        self, points: list[Point], turn_log: TurnLog | None = None
    ) -> list[dict | Exception]:
        """Points that differ only in the method, measured in turns, round by round: the
        first round (batch of requests) of every method's first run, then every method's
        second round, and so on, each round starting one method later; then the second
        runs alike, in the reverse order, and the third starting one method later than the
        first: every two turns each pair of methods meets in both orders (two methods:
        AB, BA, BA, AB; three: all six orders in six turns), so a method is not
        systematically the later one of a pair (with turns rotated only, a
        method followed plain in 5 of 7 turns, and the later run of a turn read slower).

        Why: on a shared CPU the speed drifts, so a method measured after another can read
        a few percent apart with the same steps (a measurement of `auto`, which never
        drafted, at 0.94x plain that way). Turns of whole runs were not fine enough: on the
        2-core EPYC the int4 1.5B's plain step read 23 ms in one run and 31 ms in the
        next, with runs of 8 s, so one method's run and plain's in the same turn still
        saw different minutes (per-turn ratios of one method 0.79-1.30). Rounds taken in
        turns are a second or two apart. `analysis` pairs each method's run with plain's
        of the same turn. vLLM keeps one process per draft setting, so its points run on
        their own, back to back. Returns each point's row, or the error that kept it from
        being measured.

        With `interleave="steps"` our engines take turns step by step (`_engine_runner`):
        at batch 4 a round is a whole run, and at 1,024-token prompts on the int4 1.5B a
        run lasts 30-60 s, in which this Xeon's CPU time for the same prefill varied
        5.0-11.2 s; one method's step is then tens of milliseconds from the
        other's. A run's time is still the sum of its own steps' wall clocks.

        With a `turn_log`, each finished turn's runs are saved there, and the turns it
        already holds are taken instead of run again: a stopped group resumes at its next
        turn (the caller clears the log once the rows are stored).
        """
        results: dict[Point, dict | Exception] = {}
        trials = []
        for point in points:
            try:
                trial = self.start(point)
            except (Skip, SpecdecError) as err:
                results[point] = err
                continue
            if vllm_draft_k(point.method) is None:
                trials.append(trial)
            else:
                results[point] = self._back_to_back(trial)
        turns = time.strftime("%Y-%m-%dT%H:%M:%S") if len(trials) > 1 else None
        first = 0
        saved = turn_log.load() if turn_log is not None else None
        if saved is not None:
            first, turns = min(saved.done, self.repeats), saved.started
            self._carried.update(saved.carried)
            for trial in trials:
                trial.runs = saved.runs.get(trial.point.key, [])[:first]
                if trial.point.key in saved.errors:
                    results[trial.point] = SpecdecError(saved.errors[trial.point.key])
        for i in range(first, self.repeats):
            runs = {trial.point: _Timing(trial.rounds()) for trial in trials}
            going = [trial for trial in trials if trial.point not in results]
            for r in itertools.count():
                if not going:
                    break
                shift = (r + i // 2) % len(going)
                order = going[shift:] + going[:shift]
                for trial in order[::-1] if i % 2 else order:
                    try:
                        if not runs[trial.point].advance():
                            self._record(trial, runs[trial.point])
                            going.remove(trial)
                    except SpecdecError as err:
                        results[trial.point] = err
                        going.remove(trial)
            if turn_log is not None:
                turn_log.save(self._turns(trials, results, i + 1, turns))
        for trial in trials:
            if trial.point not in results:
                results[trial.point] = self.finish(trial, turns)
        return [results[p] for p in points]

    def _turns(self, trials: list[Trial], results: dict, done: int, started: str | None) -> Turns:
        """What `done` finished turns of `trials` leave for a resumed group."""
        failed = {t.point.key: str(results[t.point]) for t in trials if t.point in results}
        keys = [t.point.key for t in trials]
        return Turns(
            done=done,
            started=started,
            runs={t.point.key: t.runs for t in trials if t.point.key not in failed},
            errors=failed,
            carried={key: self._carried[key] for key in keys if key in self._carried},
        )

    def _back_to_back(self, trial: Trial) -> dict | Exception:
        """`repeats` runs of one point in a row: its row, or the error that stopped it."""
        try:
            for _ in range(self.repeats):
                self.run_once(trial)
        except SpecdecError as err:
            return err
        return self.finish(trial)

    def start(self, point: Point) -> Trial:
        """The point's prompts and rounds, warmed up (raises `Skip` where it cannot run)."""
        if self.tp > 1 and is_peer(point.method):
            raise Skip(
                f"{point.method} runs the whole model in one process: not under tensor "
                f"parallelism (--tp {self.tp})"
            )
        if self.tp > 1 and point.warm_start:
            raise Skip(
                f"{point.method}: the cost cache it stands for is per process, and a "
                "tensor-parallel LLM keeps none"
            )
        reset_peak()  # its model loads and warm-up count in the method's peak
        prompts = self.prompts(point)
        params = self.llm.spmd_params(self.params(point, len(prompts)), len(prompts))
        if point.method in ("hf-generate", "hf-assisted"):
            warm, rounds = self._hf_runner(point, prompts)
        elif point.method == "llamacpp":
            warm, rounds = self._llamacpp_runner(point, prompts)
        elif vllm_draft_k(point.method) is not None:
            warm, rounds = self._vllm_runner(point, prompts)
        else:
            warm, rounds = self._engine_runner(point, prompts, params)
        warm_key = (point.method, point.batch)
        if point.warm_start:  # a full run leaves the state the first timed run starts from
            for _ in rounds():
                pass
        elif warm_key not in self._warm:  # first calls of a shape are slower: one short run
            warm()
            self._warm.add(warm_key)
        return Trial(point, prompts, rounds, peak_rss=peak_rss_bytes())

    def run_once(self, trial: Trial) -> None:
        """One timed run of the trial's point, its rounds back to back."""
        reset_peak()
        timing = _Timing(trial.rounds())
        while timing.advance():
            pass
        trial.peak_rss = max(trial.peak_rss, peak_rss_bytes())
        self._record(trial, timing)

    @staticmethod
    def _record(trial: Trial, timing: _Timing) -> None:
        token_ids, stats, prefill_s = timing.result
        trial.runs.append((timing.wall, timing.cpu, token_ids, stats, prefill_s))

    def finish(self, trial: Trial, turns: str | None = None) -> dict:
        """The row of the median run (by wall time); every run's tokens/s in run order,
        and `turns`, the start of the group's turns when the runs alternated with other
        methods' (rows of the same turns pair run by run)."""
        point, prompts, runs = trial.point, trial.prompts, trial.runs
        # The median run by wall time (outputs are the same in every run: seeded sampling).
        wall, cpu, token_ids, stats, prefill_s = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        row = result_row(point, prompts, token_ids, stats, wall, prefill_s, self.tp)
        generated = row["generated_tokens"]
        row["runs_tokens_per_s"] = [round(generated / r[0], 3) for r in runs]
        if stats:  # the decode phase of each run: its wall time less its prefills
            row["runs_decode_tokens_per_s"] = [
                round_or_none(decode_rate(generated, len(prompts), r[0], r[4]), 3) for r in runs
            ]
            row["runs_request_tokens_per_s"] = [  # each request's own, to pair by prompt
                [round(s.generated / s.elapsed_s, 3) if s.elapsed_s > 0 else None for s in r[3]]
                for r in runs
            ]
        row["turns"] = turns
        row["peak_rss_mb"] = round(trial.peak_rss / 1e6, 1)  # this process's (not vLLM's)
        # CPU seconds this process used: with --threads 1 that is the work done, whatever
        # share of the cores neighbours took (a shared machine stretches wall time, not CPU
        # time); with more threads it also counts threads spinning at barriers.
        # Not under tensor parallelism: a rank waiting on the others' collectives uses no
        # CPU, so its CPU time is not the work a step costs (cpu_s is rank 0's alone).
        # Not for vLLM either: it decodes in a process of its own.
        counted = self.tp == 1 and vllm_draft_k(point.method) is None
        row["cpu_s"] = round(cpu, 4) if counted else None
        row["cpu_tokens_per_s"] = round(generated / cpu, 4) if cpu > 0 and counted else None
        if counted:  # every run's, so the CPU-time ratio pairs runs of a turn as wall time does
            row["runs_cpu_tokens_per_s"] = [
                round(generated / r[1], 3) if r[1] > 0 else None for r in runs
            ]
        # Other processes' load while it ran (1-minute average, all CPUs): a point measured
        # under load above the core count shares its CPUs and is slower than it should be.
        row["load_1m"] = round(os.getloadavg()[0], 2)
        if point.method.startswith("vllm"):  # its own dtype where the CPU lacks ours
            from specdec.bench.vllm_peer import vllm_dtype

            row["peer_dtype"] = vllm_dtype(self.dtype, str(self.device))
        # Whether this process's threads had cores of their own when the point finished:
        # a 2-vCPU VM's vCPUs were at times one core's hardware threads (half the FMAs,
        # `host.SHARED_CORES_SCALING`), which the load average does not show.
        row["threads_scaling"] = threads_scaling() if self.tp == 1 else None
        row["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        return self._rank0s(row)

    def _engine(self, point: Point) -> Engine:
        """A fresh engine on the loaded weights for this method and batch size."""
        llm = self.llm
        tree_nodes = 0
        if point.method == "plain":
            factory, window = None, build_window(0, self.k_max)
        elif point.method.startswith("heads"):
            factory, window, tree_nodes = self._heads(point)
        else:
            if point.method.startswith("ngram"):
                factory = _ngram_factory
            elif point.method.startswith("suffix"):  # each run starts with an empty store
                factory = suffix_factory(SuffixStore())
            else:
                factory = llm.engine.drafter_factory
                if factory is None:
                    raise Skip("no draft model given (--draft)")
            window = build_window(point.window, self.k_max)
        if point.warm_start and point.key in self._carried:
            carried = json.loads(json.dumps(self._carried[point.key]))  # as stored on disk
            window.costs = CostModel.from_json(carried["costs"])
            window.start_from(carried["acceptance"])
        window = shared_window(window, llm.tp)  # auto: rank 0's k on every rank
        acceptor = build_acceptor("rejection")
        return Engine(
            llm.model,
            llm.tokenizer,
            llm.eos_ids,
            point.batch,
            factory,
            acceptor,
            window,
            max_tree_nodes=tree_nodes,
            prefix_cache_tokens=llm.prefix_cache_tokens,
            prefill_chunk=llm.prefill_chunk,
            **llm.engine_options,
        )

    def _heads(self, point: Point):
        """(drafter factory, window, tree nodes) for a heads-* method: at most n heads'
        tokens per step; heads-tree drafts the `--heads-tree` candidate tree at depth n."""
        spec = self.speculator
        if spec is None:
            raise Skip("no speculator heads given (--heads)")
        n, k = spec.config.n_predict, point.window
        tree = self.heads_tree if k == "tree" else None
        if k == "tree" and tree is None:
            raise Skip("no candidate tree given (--heads-tree)")
        if tree is not None and len(tree) > n:
            raise Skip(f"--heads-tree has {len(tree)} levels, the heads draft {n} tokens")
        if isinstance(k, int) and k > n:
            raise Skip(f"k = {k} exceeds the {n} tokens the heads draft")
        device = self.llm.model.device

        def factory(max_batch: int, max_len: int) -> SpeculatorDrafter | EagleDrafter:
            if isinstance(spec, Eagle3Head):  # one layer over three layers' inputs
                return Eagle3Drafter(spec, max_batch, max_len, tree, self.heads_candidates)
            if isinstance(spec, EagleHead):  # one layer over the target's states
                return EagleDrafter(spec, max_batch, max_len, tree, self.heads_candidates)
            return SpeculatorDrafter(
                spec,
                max_batch,
                device,
                tree=tree,
                n_candidates=self.heads_candidates,
                **self.llm.engine_options,
            )

        if tree is not None:
            return factory, build_window(len(tree), len(tree)), factory(1, 1).max_nodes
        return factory, build_window(k, min(self.k_max, n)), 0

    def _engine_runner(self, point: Point, prompts, params) -> tuple[Callable, Callable]:
        """(warm-up, rounds) of one of our methods: a fresh engine per run, so `auto`
        learns from scratch at every point, each round a `generate` over `batch` prompts."""
        limit = self.llm.model.config.max_position_embeddings
        if max(len(p) for p in prompts) + self.max_tokens + self.k_max + 2 > limit:
            raise Skip(f"prompt + {self.max_tokens} tokens exceed the context of {limit}")
        b = point.batch

        def warm() -> None:  # kernels warm up on short prompts: a long prefill is paid once
            sampling = [SamplingParams(temperature=point.temperature, max_tokens=4, seed=0)]
            self._engine(point).generate([p[:64] for p in prompts[:b]], sampling * b)

        def rounds() -> Rounds:
            engine = self._engine(point)
            outs = []
            starts = range(0, len(prompts), b)
            for i in starts:
                if self.interleave == "steps":  # a turn is one engine step
                    outs += yield from engine.generate_steps(prompts[i : i + b], params[i : i + b])
                else:
                    outs += engine.generate(prompts[i : i + b], params[i : i + b])
                if i == starts[-1]:
                    result = self._engine_done(point, engine, outs)
                    # Freed inside the run's own last round, before another method's run
                    # starts: a run that started while the turn's earlier engines (caches,
                    # activations) were still held read 4-5% slower per engine held
                    # (1024-token prompts x batch 4), which is an artefact of the turns.
                    del engine
                yield
            return result

        return warm, rounds

    def _engine_done(self, point: Point, engine: Engine, outs: list) -> tuple:
        """A finished run's (token ids, stats, prefill s); a warm-start point also keeps
        what a process saves at exit (`LLM.save_costs`)."""
        if point.warm_start:
            window = engine.window
            self._carried[point.key] = {
                "costs": window.costs.to_json(),
                "acceptance": window.acceptance_state(),
            }
        return [o.token_ids for o in outs], [o.stats for o in outs], engine.prefill_s

    def _hf_model(self, name: str):
        if name not in self._hf:
            import transformers

            from specdec.hub import resolve
            from specdec.models.loading import torch_dtype

            path = resolve(name, self.dtype)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch_dtype(self.dtype)
            )
            self._hf[name] = model.to(self.device).eval()
        return self._hf[name]

    def _hf_runner(self, point: Point, prompts) -> tuple[Callable, Callable]:
        target = self._hf_model(self.model_name)
        assistant = None
        if point.method == "hf-assisted":
            if self.draft_name is None:
                raise Skip("no draft model given (--draft)")
            assistant = self._hf_model(self.draft_name)
        eos = None if self.ignore_eos else sorted(self.llm.eos_ids)
        batches = [prompts[i : i + point.batch] for i in range(0, len(prompts), point.batch)]

        def generate(i: int, n: int) -> list[list[int]]:
            temperature = point.temperature
            return peers.hf_generate(target, batches[i], n, eos, temperature, assistant, seed=i)

        def rounds() -> Rounds:
            out = []
            for i in range(len(batches)):
                out += generate(i, self.max_tokens)
                yield
            return out, None, 0.0

        return lambda: generate(0, 4), rounds

    def _llamacpp_runner(self, point: Point, prompts) -> tuple[Callable, Callable]:
        if not peers.llamacpp_available():
            raise Skip("llama-cpp-python is not installed (pip install llama-cpp-python)")
        from specdec.hub import REGISTRY, cache_root

        spec = REGISTRY.get(self.model_name)
        gguf = cache_root() / "gguf" / spec.gguf_file if spec else None
        if gguf is None or not gguf.is_file():
            raise Skip(f"no GGUF file for {self.model_name} (registry models only)")
        context = max(len(p) for p in prompts) + self.max_tokens + 8
        if self._llamacpp is None or self._llamacpp[0] < context:  # loaded outside the timing
            try:
                self._llamacpp = (context, peers.llamacpp_model(gguf, context))
            except RuntimeError as err:
                raise Skip(str(err)) from err
        model = self._llamacpp[1]

        def rounds() -> Rounds:  # one prompt at a time, as its high-level API decodes
            out = []
            for i, prompt in enumerate(prompts):
                n, temperature = self.max_tokens, point.temperature
                out += peers.llamacpp_generate(model, [prompt], n, temperature, first=i)
                yield
            return out, None, 0.0

        return lambda: peers.llamacpp_generate(model, prompts[:1], 4, point.temperature), rounds

    def _vllm_runner(self, point: Point, prompts) -> tuple[Callable, Callable]:
        """vLLM in its own environment (`vllm_peer`): plain, or `vllm-draft-kN` with its
        draft-model speculation of N tokens on the same draft model as ours."""
        if self.vllm_python is None:
            raise Skip(
                "vLLM runs from a virtual environment of its own: give its interpreter with "
                "--vllm-python (see specdec.bench.vllm_peer)"
            )
        k = vllm_draft_k(point.method)
        if k and self.draft_name is None:
            raise Skip("no draft model given (--draft)")
        if self._vllm is None or self._vllm[0] != k:
            from specdec.bench.vllm_peer import VllmError, VllmPeer, vllm_dtype
            from specdec.hub import resolve

            self.close()  # one vLLM process at a time: each holds its models and KV cache
            context = self.llm.model.config.max_position_embeddings
            try:
                peer = VllmPeer(
                    self.vllm_python,
                    resolve(self.model_name, self.dtype),
                    resolve(self.draft_name, self.dtype) if k else None,
                    k=k,
                    max_model_len=min(8192, context),
                    threads=torch.get_num_threads(),
                    dtype=vllm_dtype(self.dtype, str(self.device)),
                )
            except VllmError as err:
                raise Skip(str(err)) from None
            self._vllm = (k, peer)
        peer = self._vllm[1]
        stops = sorted(self.llm.eos_ids)

        def generate(chosen: list, n: int) -> list[list[int]]:
            return peer.generate(chosen, n, point.temperature, stops, self.ignore_eos, point.batch)

        def rounds() -> Rounds:  # one round: vLLM batches the requests itself
            out = generate(prompts, self.max_tokens)
            yield
            return out, None, 0.0

        return lambda: generate(prompts[:1], 4), rounds

    def close(self) -> None:
        """Stop a peer process this runner started."""
        if self._vllm is not None:
            self._vllm[1].close()
            self._vllm = None


def _ngram_factory(max_batch: int, max_len: int) -> NgramDrafter:
    return NgramDrafter()
