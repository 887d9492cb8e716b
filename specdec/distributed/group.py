"""The tensor-parallel process group: set-up from torchrun's environment, the few
collectives the engine needs, failure reporting and shutdown.

SPMD: every rank runs the same engine on the same requests; only the model's forward
passes are collective. Whatever the engine decides from local state (timings, fresh random
seeds) is decided by rank 0 and broadcast (`specdec.distributed.spmd`).

Failures. A rank that raises posts its error to the rendezvous store. A follower then
exits (status 1), which closes its connections: the collective rank 0 is waiting in fails
at once ("connection reset by peer") instead of at the timeout, and rank 0 raises
`DistributedError("tensor parallelism: rank 1 failed: ValueError: ...")` from what was
posted. A rank that dies without a word (killed) is reported as such at once, one that
hangs after the group's timeout (`SPECDEC_TP_TIMEOUT_S`, default 300 s). When rank 0
fails, it raises its own error and leaves; the followers' collectives then fail and they
exit. torchrun (`--max-restarts 0`, its default) stops the remaining workers once one
exits with an error, so no rank is left waiting. That stop is a SIGTERM, which can reach
rank 0 while it is still turning the broken collective into the follower's error: rank 0
lets it finish (`_defer_termination`), within a few seconds.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from specdec.errors import DistributedError, InvalidParameterError, SpecdecError

DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this means a rank is hung
TIMEOUT_ENV = "SPECDEC_TP_TIMEOUT_S"
GRACE_S = 2.0  # how long rank 0 waits for the others' error reports
_KEY = "specdec/"

_current: TPGroup | None = None


@dataclass
class TPGroup:
    """This process's place in the tensor-parallel group (all of WORLD: one TP group)."""

    rank: int
    world_size: int
    device: torch.device  # this rank's device: cpu, or cuda:LOCAL_RANK
    store: dist.Store  # the rendezvous store: error reports travel through it
    timeout_s: float
    owns_group: bool = True  # created here, so destroyed here
    failed: bool = field(default=False, init=False)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    # -- collectives (all ranks call them in the same order) -------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (in place where `x` is contiguous); returns the sum.

        The backends sum raw storage element by element: a transposed view on one rank
        (what `Linear`'s `mv_mm` kernel returns, and ranks may tune different kernels)
        would be added to another rank's rows in the wrong order, so views are copied
        to row-major first."""
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` concatenated along the last dimension, in rank order."""
        return self.all_gather(x, dim=-1)

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's `x` concatenated along `dim`, in rank order."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=dim)

    def broadcast_int(self, value: int) -> int:
        """Rank 0's `value` on every rank."""
        t = torch.tensor([value], dtype=torch.long, device=self._comm_device)
        dist.broadcast(t, src=0)
        return int(t.item())

    def broadcast_object(self, obj=None):
        """Rank 0's `obj` (any picklable object) on every rank; the others pass None.

        The way a leader hands step inputs (new requests, parameters) to its followers.
        """
        box = [obj if self.is_leader else None]
        dist.broadcast_object_list(box, src=0, device=self._comm_device)
        return box[0]

    @property
    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    # -- failures and shutdown -------------------------------------------------------------

    def fail(self, err: BaseException) -> BaseException:
        """Report `err` (raised on this rank) to the group; on rank 0, return what to raise.

        Every rank posts its error to the store. A follower then prints it and exits at
        once: its connections close, so the collective rank 0 is blocked in fails now
        rather than at the timeout (gloo offers no other way to interrupt a peer's
        collective). Rank 0 turns a failed collective into a `DistributedError` naming the
        rank that failed first and why; its own errors it raises as they are.
        """
        if self.failed:
            return err
        self.failed = True
        own = not _is_comm_error(err)
        summary = _summary(err)
        _quietly(self.store.set, f"{_KEY}error/{self.rank}", f"{int(own)}|{summary}")
        if not self.is_leader:
            _exit_follower(self.rank, err, own)
        self._destroy()
        if own:
            return err
        reports = self._reports()
        causes = [f"rank {r} failed: {msg}" for r, (was_own, msg) in reports.items() if was_own]
        if causes:
            message = "; ".join(causes)
        else:
            others = [r for r in range(1, self.world_size) if r not in reports]
            message = (
                f"lost contact with rank(s) {others or list(reports)}, which reported no "
                f"error: a process was killed or hung longer than the {self.timeout_s:g} s "
                f"collective timeout (${TIMEOUT_ENV})"
            )
        return DistributedError(
            f"tensor parallelism: {message} (rank 0's collective ended with: {summary})"
        )

    def _reports(self) -> dict[int, tuple[bool, str]]:
        """Error reports of the other ranks, waiting up to GRACE_S for them to arrive."""
        reports: dict[int, tuple[bool, str]] = {}
        deadline = time.monotonic() + GRACE_S
        while True:
            for r in range(1, self.world_size):
                key = f"{_KEY}error/{r}"
                if r not in reports and _quietly(self.store.check, [key]):
                    flag, _, msg = (
                        _quietly(self.store.get, key, default=b"0|?").decode().partition("|")
                    )
                    reports[r] = (flag == "1", msg)
            if any(own for own, _ in reports.values()) or time.monotonic() > deadline:
                return reports
            time.sleep(0.05)

    def close(self) -> None:
        """Leave the group cleanly: wait for every rank, then destroy the process group."""
        global _current
        if not self.failed and self.owns_group and dist.is_initialized():
            dist.barrier()
        self._destroy()
        if _current is self:
            _current = None

    def _destroy(self) -> None:
        if self.owns_group and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _exit_follower(rank: int, err: BaseException, own: bool) -> None:
    """A failed follower's last words (rank 0 reports the failure), then exit status 1."""
    if own and not isinstance(err, SpecdecError):
        traceback.print_exception(err, file=sys.stderr)
    print(f"specdec: rank {rank} stopped: {_summary(err)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def current() -> TPGroup | None:
    """The group this process joined, if any."""
    return _current


def init_tensor_parallel(
    tp: int, device: str | torch.device = "cpu", timeout_s: float | None = None
) -> TPGroup | None:
    """Join the tensor-parallel group of `tp` ranks that torchrun started (None for tp = 1).

    Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (torchrun sets them, on
    one node or many). Refuses, before anything is loaded, a `tp` that is not the number of
    processes launched. Backend: gloo on CPU, NCCL on CUDA (each rank on cuda:LOCAL_RANK).
    Reuses a group this process already joined.
    """
    global _current
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if tp < 1:
        raise InvalidParameterError(f"tp must be >= 1, got {tp}")
    if tp != world:
        launched = (
            "it was started as a single process (WORLD_SIZE is unset)"
            if "WORLD_SIZE" not in os.environ
            else f"torchrun started WORLD_SIZE={world} processes"
        )
        raise InvalidParameterError(
            f"--tp {tp} needs exactly {tp} processes but {launched}: launch with "
            f"`torchrun --nproc-per-node {tp} -m specdec.cli COMMAND --tp {tp} ...` "
            f"(or --nnodes/--node-rank/--rdzv-endpoint across machines)"
        )
    if tp == 1:
        return None
    if _current is not None:
        return _current
    timeout_s = float(os.environ.get(TIMEOUT_ENV, timeout_s or DEFAULT_TIMEOUT_S))
    timeout = timedelta(seconds=timeout_s)
    device = torch.device(device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():  # joined by the caller: use it, leave its lifetime to them
        store = dist.distributed_c10d._get_default_store()
        rank, owns = dist.get_rank(), False
    else:
        # Joining may wait on slow starters longer than a collective may take.
        joining = timedelta(seconds=max(timeout_s, DEFAULT_TIMEOUT_S))
        store, rank, world = next(dist.rendezvous("env://", timeout=joining))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        owns = True
    _current = TPGroup(rank, world, device, store, timeout_s, owns_group=owns)
    if rank == 0 and owns:
        _defer_termination(GRACE_S + 3.0)
    return _current


def _defer_termination(grace_s: float) -> None:
    """Rank 0: a SIGTERM ends the process `grace_s` later instead of at once.

    When a follower fails it posts its error and exits, and torchrun then stops the other
    workers with SIGTERM, possibly while rank 0 is still reading that error to raise it
    (racing it made rank 0 die without a word now and then). A SIGTERM from anyone else
    still stops rank 0, within `grace_s`. Python runs the handler between bytecodes, so a
    rank blocked in a collective takes it once the collective fails, as it does here."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame) -> None:
        timer = threading.Timer(grace_s, os._exit, args=(128 + signum,))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_term)


@contextlib.contextmanager
def tensor_parallel(
    tp: int, device: str | torch.device = "cpu", timeout_s: float | None = None
) -> Iterator[TPGroup | None]:
    """`init_tensor_parallel` for a block: errors inside it are reported across ranks
    (rank 0 raises a `DistributedError` naming the rank that failed), and the group is
    shut down on the way out."""
    joined = _current is not None
    group = init_tensor_parallel(tp, device, timeout_s)
    if group is None:
        yield None
        return
    try:
        yield group
    except (Exception, KeyboardInterrupt) as err:
        raised = group.fail(err)
        if raised is err:
            raise
        raise raised from err
    finally:
        if not joined:  # nested in a block that joined the group: leave it to that block
            group.close()


def reports_failures(keep: tuple[type[BaseException], ...] = ()) -> Callable:
    """Decorator for methods of an object with a `tp` attribute (a `TPGroup` or None): an
    exception leaving the method is reported across ranks (`TPGroup.fail`), so the others
    do not wait on this rank. Exceptions of the `keep` types are raised alike on every rank
    (deterministic input validation) and leave the group usable."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except keep:
                raise
            except (Exception, KeyboardInterrupt) as err:
                group = getattr(self, "tp", None)
                raised = err if group is None else group.fail(err)
                if raised is err:
                    raise
                raise raised from err

        return wrapper

    return decorate


def _is_comm_error(err: BaseException) -> bool:
    """A failed collective (a peer died, hung or left), as opposed to this rank's own error."""
    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        s in text for s in ("gloo", "NCCL", "Connection", "Timed out", "timed out", "Socket")
    )


def _summary(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if text.startswith("[") and "] " in text:  # gloo's "[.../pair.cc:553] Connection ..."
        text = text.split("] ", 1)[1]
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


def _quietly(fn, *args, default=None):
    """Store calls on a failure path: the store's host may be gone already."""
    try:
        return fn(*args)
    except Exception:
        return default
