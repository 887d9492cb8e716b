"""The engine on its own thread, fed by the server's event loop.

The `Engine` is single-threaded and steps in a loop; HTTP handlers live on asyncio. They
meet through two one-way channels: a command queue (add a request, abort one) that the
engine thread drains between steps, and per-request asyncio queues that the engine thread
fills with `loop.call_soon_threadsafe`. The engine never blocks the event loop and the
event loop never touches the engine's state.

A failing step (a bug, out of memory) fails the requests in flight with a server error and
resets the engine; the thread and the server keep going.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import random
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from specdec.engine import Completion, Engine, LiveSequence
from specdec.params import SamplingParams
from specdec.serving.metrics import ServerMetrics

log = logging.getLogger("specdec.serve")


class QueueFullError(Exception):
    """More requests waiting than the server's `--max-queue`."""


@dataclass
class Event:
    """What the engine thread tells a request after a step."""

    index: int  # which choice of the request (n > 1)
    token_ids: list[int]  # all tokens generated so far
    trace: list[tuple[int, int, int]] = field(default_factory=list)  # steps since the last
    completion: Completion | None = None  # set once finished
    error: str | None = None  # set when the engine failed


@dataclass(eq=False)
class RequestHandle:
    """One sequence in flight, as the event loop sees it."""

    prompt_ids: list[int]
    params: SamplingParams
    events: asyncio.Queue
    index: int = 0
    key: int = 0  # names the sequence in commands (which may cross process boundaries)
    seq: LiveSequence | None = None  # set by the engine thread
    sent_tokens: int = 0
    sent_steps: int = 0  # entries of seq.trace already published
    done: bool = False
    request_id: str | None = None


class AsyncEngine:
    def __init__(
        self,
        engine: Engine,
        metrics: ServerMetrics,
        max_queue: int = 256,
        sync: Callable[[list | None], list] | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._handles: dict[LiveSequence, RequestHandle] = {}
        self._by_key: dict[int, RequestHandle] = {}
        self._seqs: dict[int, LiveSequence] = {}  # key -> sequence, for apply_commands
        self._keys = itertools.count()
        # sync(commands) -> commands: under tensor parallelism rank 0 sends each step's
        # commands to the other ranks, which replay them (see `follow`).
        self.sync = sync
        self._pending = 0  # submitted, not yet admitted to the batch
        self._pending_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ---- event-loop side ------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Validate against the context before queueing (raises ContextLengthError...)."""
        self.engine.check_fits(prompt_ids, params)

    def submit(
        self, items: Sequence[tuple[list[int], SamplingParams]], request_id: str
    ) -> tuple[list[RequestHandle], asyncio.Queue]:
        """Queue one sequence per (prompt ids, params) item (the choices and prompts of one
        request), all reporting to one event queue; item i's events carry index i."""
        if self._pending + len(items) > self.max_queue:
            raise QueueFullError(
                f"the server has {self._pending} requests waiting (--max-queue "
                f"{self.max_queue}); retry later"
            )
        for prompt_ids, params in items:
            self.check(prompt_ids, params)
        events: asyncio.Queue = asyncio.Queue()
        handles = [
            RequestHandle(
                list(ids), _seeded(p), events, index=i, request_id=request_id, key=next(self._keys)
            )
            for i, (ids, p) in enumerate(items)
        ]
        self._count_pending(len(handles))
        for h in handles:
            self._by_key[h.key] = h
            self._commands.put(("add", h.key, h.prompt_ids, h.params, request_id))
        return handles, events

    def abort(self, handles: Sequence[RequestHandle]) -> None:
        """Cancel whatever of these is unfinished (a client went away)."""
        for h in handles:
            if not h.done:
                self._commands.put(("abort", h.key))

    def _count_pending(self, change: int) -> None:
        with self._pending_lock:
            self._pending += change
            self.metrics.queue_length.set(self._pending)

    # ---- engine-thread side ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                # Idle time goes to the drafter (a learner trains) while it has a use for
                # it; then commands are only polled, so a request waits one micro-batch.
                idle = not self.engine.has_work
                commands = self._take_commands(block=idle and not self.engine.idle_work())
                if self.sync is not None:
                    commands = self.sync(commands)
                self._apply(commands)
                if self.engine.has_work:
                    self._step()
            except Exception:  # noqa: BLE001 - the server must outlive any failing step
                log.error("engine step failed:\n%s", traceback.format_exc())
                self._fail_all("the engine failed while decoding; see the server log")
        if self.sync is not None:
            self.sync([("stop",)])

    def _take_commands(self, block: bool) -> list[tuple]:
        """What arrived since the last step; waits up to 0.5 s when idle (so an idle
        server still ticks: under TP the other ranks hear from rank 0 at least that often)."""
        commands = []
        while True:
            try:
                command = self._commands.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return commands
            block = False
            if command[0] != "wake":
                commands.append(command)

    def _apply(self, commands: list[tuple]) -> None:
        aborted_waiting = apply_commands(self.engine, commands, self._seqs)
        for command in commands:
            if command[0] == "add":
                handle = self._by_key.pop(command[1])
                handle.seq = self._seqs[command[1]]
                self._handles[handle.seq] = handle
        for seq in aborted_waiting:  # never took a row: finished now
            self._count_pending(-1)
            self._publish(seq)

    def _step(self) -> None:
        waiting_before = len(self.engine.waiting)
        admitted = self.engine.admit()
        self._count_pending(len(self.engine.waiting) - waiting_before)
        for seq in admitted:  # first tokens go out before the decode step
            self._publish(seq)
        touched = self.engine.decode()
        self.metrics.steps.inc()
        self.metrics.batch_size.set(len(self.engine.live))
        self.metrics.window.set(self.engine.last_window)
        for seq in touched:
            self._publish(seq)

    def _publish(self, seq: LiveSequence) -> None:
        handle = self._handles.get(seq)
        if handle is None:
            return
        completion = None
        if seq.finished:
            del self._handles[seq]
            self._seqs.pop(handle.key, None)
            completion = self.engine.completion(seq)
            self.metrics.finished(completion.finish_reason, len(seq.prompt_ids), completion.stats)
        elif len(seq.output_ids) == handle.sent_tokens:
            return
        handle.sent_tokens = len(seq.output_ids)
        trace, handle.sent_steps = seq.trace[handle.sent_steps :], len(seq.trace)
        event = Event(handle.index, list(seq.output_ids), trace, completion)
        self._loop.call_soon_threadsafe(handle.events.put_nowait, event)

    def _fail_all(self, message: str) -> None:
        """Fail every request in flight and start from an empty engine."""
        for seq, handle in list(self._handles.items()):
            self._loop.call_soon_threadsafe(
                handle.events.put_nowait, Event(handle.index, list(seq.output_ids), error=message)
            )
            self.metrics.requests.labels("error").inc()
        self._handles.clear()
        self._seqs.clear()
        self.engine.reset()
        self._count_pending(-self._pending)
        self.metrics.batch_size.set(0)


def apply_commands(
    engine: Engine, commands: list[tuple], seqs: dict[int, LiveSequence]
) -> list[LiveSequence]:
    """Replay one step's commands on an engine: ("add", key, prompt_ids, params,
    request_id) queues a sequence, ("abort", key) stops one. Returns the sequences aborted
    while still waiting (they finish without ever taking a row)."""
    aborted_waiting = []
    for command in commands:
        if command[0] == "add":
            _, key, prompt_ids, params, request_id = command
            seqs[key] = engine.add_request(prompt_ids, params, request_id)
        elif command[0] == "abort" and command[1] in seqs:
            seq = seqs[command[1]]
            waiting = seq in engine.waiting
            engine.abort(seq)
            if waiting:
                aborted_waiting.append(seq)
    return aborted_waiting


def follow(engine: Engine, sync: Callable[[list | None], list]) -> None:
    """The loop of a rank other than 0 under tensor parallelism: receive rank 0's commands,
    replay them, and take the same step (the model's collectives pair up)."""
    seqs: dict[int, LiveSequence] = {}
    while True:
        commands = sync(None)
        if any(c[0] == "stop" for c in commands):
            return
        apply_commands(engine, commands, seqs)
        if engine.has_work:
            for seq in engine.step():
                if seq.finished:
                    seqs.pop(next((k for k, s in seqs.items() if s is seq), None), None)


def _seeded(params: SamplingParams) -> SamplingParams:
    """A concrete seed for an unseeded request (what None means: a fresh random one), so
    every rank of a tensor-parallel server samples alike."""
    if params.seed is not None:
        return params
    return replace(params, seed=random.getrandbits(63))
