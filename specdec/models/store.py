"""A quantized model written once and memory-mapped at every later load.

Why: building an int4 model from its sources reads the whole bf16 checkpoint (3.1 GB for
the 1.5B), and for a GGUF file its metadata and blocks, then checks and re-quantizes. The
pages read stayed resident (a mapped checkpoint counts in the process's memory), so the
int4 pair peaked at 4 GB for 1.9 GB of weights, and every load paid the reading again.
The store holds every tensor of the quantized model (4-bit blocks, biases, norms, the
embedding table) in one safetensors file that a later load maps as it is: the model's
memory is its own bytes, and only the pages a step reads (an embedding's looked-up rows,
not its whole table) become resident. A layer's blocks are stored in both of the native
kernel's layouts (rows, and the tile layout where the build made one): laying out the
1.5B's tiles took ~6 s of every load (Zen 3), and the layout a layer does not read costs
disk, never memory.

One file per (sources, dtype, quantization, `VERSION`): the key hashes each source file's
path, size and modification time, so a changed checkpoint or GGUF gets a new store (a stale
one is removed when its successor is written). A sidecar `.json`, written last, holds the
CRC-32 of each chunk of the file and the quantization report. A load checks every chunk
before it maps the file whenever the file's inode, size or modification time differ from
those it had when its chunks were last checked (any write, copy or truncation through the
file system changes them), and trusts an unchanged file without reading it: the check costs
~1.6 s of a warm start for the int4 pair on a Zen 3. A store that fails (truncated, flipped
bits, unreadable) is deleted and rebuilt with a warning, never used.
`SPECDEC_MODEL_STORE=0` turns it off (the tests do, except those of the store).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from specdec.kernels.q4 import Q4Weights
from specdec.kernels.quant import Int4Linear
from specdec.models.config import ModelConfig
from specdec.models.transformer import Transformer, on_meta

log = logging.getLogger(__name__)

VERSION = 2  # bump when a stored tensor's meaning or layout changes
CHUNK_BYTES = 64 << 20  # bytes per checksum: chunks are checked in parallel
_Q4 = ("qs", "sc", "mn", "d", "dmin")


def enabled() -> bool:
    return os.environ.get("SPECDEC_MODEL_STORE", "1") != "0"


class ModelStore:
    """Where the quantized model of one set of sources lives (see the module doc)."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.sidecar = file.with_suffix(".json")

    @classmethod
    def for_sources(
        cls, model_dir: Path, dtype: str, quant: str, gguf: Path | None, root: Path
    ) -> ModelStore:
        """The store of the model at `model_dir` (its config and safetensors files), with
        `gguf` where its 4-bit blocks come from a GGUF file, under `root`."""
        model_dir = Path(model_dir)
        sources = sorted([*model_dir.glob("*.safetensors"), model_dir / "config.json"])
        if gguf is not None:
            sources.append(Path(gguf))
        key = [VERSION, dtype, quant]
        for source in sources:
            stat = source.stat()
            key.append((str(source.resolve()), stat.st_size, stat.st_mtime_ns))
        digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
        where = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:8]
        name = "-".join(model_dir.resolve().parts[-2:])  # e.g. qwen2.5-coder-1.5b-instruct-bf16
        return cls(Path(root) / f"{name}.{where}-{quant}-{dtype}-{digest}.safetensors")

    def load(self, cfg: ModelConfig, dtype: torch.dtype) -> Transformer | None:
        """The stored model, its tensors mapped from the file; None where there is no
        store, or it fails its checks (then it is deleted, so the caller rebuilds it)."""
        if not (self.sidecar.is_file() and self.file.is_file()):
            return None
        try:
            meta = json.loads(self.sidecar.read_text())
            problem = self._check(meta)
            if problem is None:
                return self._read(cfg, dtype, meta)
        except Exception as err:  # noqa: BLE001 - whatever is wrong, the store is rebuilt
            problem = f"unreadable ({type(err).__name__}: {err})"
        log.warning("specdec: the stored model %s is %s; rebuilding it", self.file, problem)
        self._remove()
        return None

    def save(self, model: Transformer) -> bool:
        """Write `model`'s tensors, then the sidecar; atomically (a crash leaves no store)
        and at most a warning where the disk refuses (the next load rebuilds). Whether the
        store was written."""
        from safetensors.torch import save_file

        tensors, seen = {}, set()
        tiles = {
            f"{name}.tiles": m.tiles
            for name, m in model.named_modules()
            if isinstance(m, Int4Linear) and m.tiles.numel()
        }
        for name, tensor in {**model.state_dict(), **tiles}.items():
            tensor = tensor.detach().contiguous()
            if tensor.data_ptr() in seen:  # a tied or mapped-twice tensor: its own bytes
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            tensors[name] = tensor
        report = getattr(model, "quant_report", None)
        meta = {
            "version": VERSION,
            "report": None
            if report is None
            else {"exact": report.exact, "requantized": report.requantized},
        }
        partial = self.file.with_suffix(f".{os.getpid()}.partial")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(partial))
            meta |= {"size": partial.stat().st_size, "chunk_bytes": CHUNK_BYTES}
            meta["crc32"] = _checksums(partial, CHUNK_BYTES)
            for stale in self.file.parent.glob(f"{self.file.name.rsplit('-', 1)[0]}-*"):
                if stale != partial:  # this model's stores from older sources
                    stale.unlink(missing_ok=True)
            os.replace(partial, self.file)
            meta["verified"] = _identity(self.file)  # checked: it is what was written
            _write_atomically(self.sidecar, json.dumps(meta))
        except OSError as err:
            log.warning("specdec: could not store the model in %s (%s)", self.file, err)
            partial.unlink(missing_ok=True)
            return False
        return True

    def _check(self, meta: dict) -> str | None:
        if meta.get("version") != VERSION:
            return f"of version {meta.get('version')}, not {VERSION}"
        if self.file.stat().st_size != meta["size"]:
            return f"{self.file.stat().st_size} bytes where {meta['size']} were written"
        if meta.get("verified") == _identity(self.file):
            return None  # unchanged since its checksums were last read (module doc)
        if _checksums(self.file, meta["chunk_bytes"]) != meta["crc32"]:
            return "corrupt (its checksums differ from those written)"
        try:  # the next load of this unchanged file need not read it again
            _write_atomically(self.sidecar, json.dumps(meta | {"verified": _identity(self.file)}))
        except OSError:
            pass
        return None

    def _read(self, cfg: ModelConfig, dtype: torch.dtype, meta: dict) -> Transformer:
        from safetensors import safe_open

        from specdec.kernels.gguf_q4 import QuantReport

        with safe_open(str(self.file), framework="pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        with on_meta():
            model = Transformer(cfg)
        head = type(model.lm_head)  # its own tensor even where the checkpoint ties it
        model.lm_head = head(cfg.hidden_size, cfg.vocab_size, bias=False, device="meta")
        for name in [n.removesuffix(".qs") for n in tensors if n.endswith(".qs")]:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            blocks = Q4Weights(*(tensors[f"{name}.{f}"] for f in _Q4))
            bias = tensors.get(f"{name}.bias")
            tiles = tensors.pop(f"{name}.tiles", True)  # laid out here where not stored
            setattr(parent, attr, Int4Linear.from_blocks(blocks, dtype, bias, tiles))
        model.load_state_dict(tensors, strict=True, assign=True)  # the rest; the same blocks
        report = meta.get("report")
        model.quant_report = None if report is None else QuantReport(**report)
        model.inv_freq = torch.tensor(cfg.inv_freq(), dtype=torch.float32)
        return model.eval().requires_grad_(False)

    def _remove(self) -> None:
        self.sidecar.unlink(missing_ok=True)
        self.file.unlink(missing_ok=True)


def _checksums(path: Path, chunk_bytes: int) -> list[int]:
    """CRC-32 of each `chunk_bytes` of the file, chunks read in parallel (zlib lets go of
    the GIL): ~0.3 s for the 1.5B's 0.9 GB store on two Zen 3 cores."""
    size = path.stat().st_size

    def crc(start: int) -> int:
        with path.open("rb") as f:
            f.seek(start)
            return zlib.crc32(f.read(min(chunk_bytes, size - start)))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(crc, range(0, size, chunk_bytes)))


def _identity(path: Path) -> list[int]:
    """What changes whenever the file is written, replaced or truncated through the file
    system: its inode, size and modification time."""
    stat = path.stat()
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns]


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)
