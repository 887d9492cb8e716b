"""The tensor-parallel process group: set-up from torchrun's environment, the few
collectives the engine needs, failure reporting and shutdown.

SPMD: every rank runs the same engine on the same requests; only the model's forward
passes are collective. Whatever the engine decides from local state (timings, fresh random
seeds) is decided by rank 0 and broadcast (`specdec.distributed.spmd`).

Failures. A rank that raises posts its error to the rendezvous store, then destroys its
process group: its peers' pending collectives fail at once (gloo: "connection reset by
peer") instead of waiting for the timeout. Rank 0 then reads what the other ranks posted
and raises `DistributedError("rank 1 failed: ValueError: ...")`. A rank that dies without
a word (killed) or hangs is reported as such after the group's timeout. No rank is left
waiting: followers wait at most `RELEASE_S` for rank 0 to print before they exit, and
torchrun (`--max-restarts 0`, its default) stops the remaining workers once one exits with
an error.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from specdec.errors import DistributedError, InvalidParameterError

DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this means a rank is hung
TIMEOUT_ENV = "SPECDEC_TP_TIMEOUT_S"
GRACE_S = 2.0  # how long rank 0 waits for the others' error reports
RELEASE_S = 10.0  # how long a failed follower waits for rank 0 to report before exiting
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
        """Sum over ranks, in place; returns `x`."""
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` concatenated along the last dimension, in rank order."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=-1)

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
        """Report `err` (raised on this rank) to the group and return what to raise.

        Posts the error, destroys the process group so peers blocked in a collective with
        this rank fail at once, and on rank 0 turns a communication failure into a
        `DistributedError` naming the rank that failed first and why.
        """
        if self.failed:
            return err
        self.failed = True
        own = not _is_comm_error(err)
        summary = _summary(err)
        _quietly(self.store.set, f"{_KEY}error/{self.rank}", f"{int(own)}|{summary}")
        self._destroy()
        if not self.is_leader:
            # Stay alive until rank 0 has read the reports (or is gone), so a launcher that
            # stops everyone when one worker exits does not cut rank 0's message short.
            _quietly(self.store.wait, [f"{_KEY}released"], timedelta(seconds=RELEASE_S))
            return err
        atexit.register(_quietly, self.store.set, f"{_KEY}released", "1")
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
            f"`torchrun --nproc-per-node {tp} -m specdec.cli generate --tp {tp} ...` "
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
        store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        owns = True
    _current = TPGroup(rank, world, device, store, timeout_s, owns_group=owns)
    return _current


@contextlib.contextmanager
def tensor_parallel(
    tp: int, device: str | torch.device = "cpu", timeout_s: float | None = None
) -> Iterator[TPGroup | None]:
    """`init_tensor_parallel` for a block: errors inside it are reported across ranks
    (rank 0 raises a `DistributedError` naming the rank that failed), and the group is
    shut down on the way out."""
    group = init_tensor_parallel(tp, device, timeout_s)
    if group is None:
        yield None
        return
    try:
        yield group
    except BaseException as err:
        raised = group.fail(err)
        if raised is err:
            raise
        raise raised from err
    finally:
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
            except BaseException as err:
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
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


def _quietly(fn, *args, default=None):
    """Store calls on a failure path: the store's host may be gone already."""
    try:
        return fn(*args)
    except Exception:
        return default
