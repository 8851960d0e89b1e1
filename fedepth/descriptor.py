"""Client descriptor (FeDepth, Sec. 3.3): GeM pooling of frozen-encoder features, then a diagonal
Gaussian (channel-wise mean and variance) over n sampled frames.

The descriptor is all a robot ever sends about its data: D means and D variances.
:func:`check_descriptor` (one descriptor) and :func:`check_descriptors` (N of them, as arrays)
are the one rule of a descriptor's validity. torch is imported where features are pooled, not
with the module: the checks and the moments serve torch-free callers (``fedepth cluster``,
:mod:`fedepth.jeffreys`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

#: Default variance floor. A channel that does not vary over the sampled frames (a single frame,
#: or a ReLU channel that never fires, whose GeM value is the clamp eps on every frame) has zero
#: empirical variance; the Jeffreys divergence divides by variances, so every variance is raised
#: to at least this value (in squared feature units; GeM outputs are >= eps = 1e-6).
VAR_FLOOR = 1e-6


def gem(x: torch.Tensor, p: float = 3.0, eps: float = 1e-6) -> torch.Tensor:
    """Generalized-mean pooling over the spatial axes: (B, C, H, W) -> (B, C).

    ``g = (mean_{h,w} clamp(z, eps)^p)^(1/p)``, computed in float32 whatever the input dtype
    (p = 1 is average pooling, p -> inf approaches max pooling).
    """
    if x.ndim != 4:
        raise ValueError(f"gem expects a (B, C, H, W) feature map, got shape {tuple(x.shape)}")
    if p <= 0:
        raise ValueError(f"gem needs p > 0, got {p}")
    z = x.float().clamp(min=eps)
    return z.pow(p).mean(dim=(-2, -1)).pow(1.0 / p)


def _check_values(m: np.ndarray, v: np.ndarray, what: str) -> None:
    """The rule on a descriptor's values, for one or many: finite means and variances, every
    variance > 0 (``what`` names them in the message)."""
    for name, arr in (("means", m), ("variances", v)):
        if not np.isfinite(arr).all():
            raise ValueError(f"{what} {name} contain NaN or Inf")
    bad = int((v <= 0).sum())
    if bad:
        raise ValueError(
            f"{what} variances must be > 0: {bad} are zero or negative (apply the descriptor's "
            "variance floor)"
        )


def check_descriptor(
    mean: npt.ArrayLike, var: npt.ArrayLike, num_frames: int | None = None
) -> None:
    """Raise a one-line ValueError unless ``(mean, var)`` is a valid descriptor: 1-D arrays of
    one length, finite, variances > 0 (and, when given, ``num_frames`` > 0).

    The one check of a descriptor's validity: :class:`Descriptor` runs it on construction, the
    coordinator's serde and fleet registry map its error to INVALID_ARGUMENT;
    :func:`check_descriptors` applies the same rule to N descriptors held as arrays.
    """
    m, v = np.asarray(mean), np.asarray(var)
    if m.ndim == 1 and v.ndim == 1 and m.size != v.size:
        raise ValueError(
            f"malformed descriptor: {m.size} means but {v.size} variances (they must have the "
            "same length)"
        )
    if m.shape != v.shape or m.ndim != 1:
        raise ValueError(
            f"descriptor mean {m.shape} and variance {v.shape}: both must be 1-D with equal shape"
        )
    _check_values(m, v, "descriptor")
    if num_frames is not None and num_frames <= 0:
        raise ValueError(f"descriptor num_frames must be > 0, got {num_frames}")


def check_descriptors(
    means: npt.ArrayLike,
    variances: npt.ArrayLike,
    what: str = "descriptors",
    *,
    empty: bool = True,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """N descriptors held as (N, D) arrays of means and variances, checked by the rule of
    :func:`check_descriptor` (and, with ``empty=False``, refused when N or D is 0); returns
    them as float64. Raises a one-line ValueError that starts with ``what``."""
    m = np.asarray(means, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if m.ndim != 2 or v.ndim != 2 or m.shape != v.shape:
        problem = "differ in shape" if m.ndim == v.ndim == 2 else "are not both 2-D"
        raise ValueError(
            f"{what}: means {m.shape} and variances {v.shape} {problem}: they must both be "
            "N x D with the same shape"
        )
    if not empty and 0 in m.shape:
        raise ValueError(f"{what}: empty descriptors (shape {m.shape})")
    _check_values(m, v, f"{what}:")
    return m, v


@dataclass(frozen=True)
class Descriptor:
    """A client's Gaussian descriptor: mean and variance (D,) over ``num_frames`` GeM vectors."""

    mean: npt.NDArray[np.float64]
    var: npt.NDArray[np.float64]
    num_frames: int

    def __post_init__(self) -> None:
        check_descriptor(self.mean, self.var)

    @property
    def dim(self) -> int:
        return int(self.mean.size)


def stack_descriptors(descriptors: Sequence[Descriptor]) -> tuple[np.ndarray, np.ndarray]:
    """(means, variances), each N x D, of a list of descriptors."""
    if not descriptors:
        raise ValueError("no descriptors given")
    return (np.stack([d.mean for d in descriptors]), np.stack([d.var for d in descriptors]))


class RunningMoments:
    """Streaming mean and variance of D-dimensional vectors, merged batch by batch (Chan et al.).

    Holds O(D) state whatever the number of vectors, in float64.
    """

    def __init__(self, dim: int) -> None:
        self.count = 0
        self.mean = np.zeros(dim, dtype=np.float64)
        self._m2 = np.zeros(dim, dtype=np.float64)

    def update(self, batch: npt.ArrayLike) -> None:
        x = np.asarray(batch, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.mean.size:
            raise ValueError(f"expected a (B, {self.mean.size}) batch, got shape {x.shape}")
        nb = x.shape[0]
        if nb == 0:
            return
        mb = x.mean(axis=0)
        m2b = ((x - mb) ** 2).sum(axis=0)
        n = self.count + nb
        delta = mb - self.mean
        self.mean = self.mean + delta * (nb / n)
        self._m2 = self._m2 + m2b + delta**2 * (self.count * nb / n)
        self.count = n

    @property
    def variance(self) -> np.ndarray:
        """Population variance (divides by n): the Gaussian's maximum-likelihood fit."""
        if self.count == 0:
            raise ValueError("no vectors seen")
        return self._m2 / self.count

    def descriptor(self, var_floor: float = VAR_FLOOR) -> Descriptor:
        """The Gaussian descriptor of the vectors seen, every variance raised to ``var_floor``."""
        var = np.maximum(self.variance, var_floor)
        return Descriptor(mean=self.mean.copy(), var=var, num_frames=int(self.count))


def gem_descriptor(vectors: npt.ArrayLike, *, var_floor: float = VAR_FLOOR) -> Descriptor:
    """(n, C) GeM vectors -> their Gaussian descriptor (population variance, floored).

    The one way a descriptor is made from GeM vectors held in memory (a robot's sampled frames,
    depth_node's drift window); :class:`DescriptorExtractor` streams the same moments batch by
    batch. Bit for bit ``x.mean(axis=0)`` and ``np.maximum(x.var(axis=0), var_floor)`` in
    float64.
    """
    x = np.asarray(vectors, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"expected (n >= 1, D) vectors, got shape {x.shape}")
    moments = RunningMoments(x.shape[1])
    moments.update(x)
    return moments.descriptor(var_floor)


def sample_indices(num_available: int, n: int, seed: int) -> np.ndarray:
    """The n_c = min(n, |X_c|) frame indices to describe a client, sorted, drawn without
    replacement by a seeded generator (the same seed always picks the same frames)."""
    if num_available <= 0:
        raise ValueError("a client needs at least one frame to compute a descriptor")
    if n <= 0:
        raise ValueError(f"the number of descriptor frames must be > 0, got {n}")
    rng = np.random.default_rng(seed)
    k = min(n, num_available)
    return np.sort(rng.choice(num_available, size=k, replace=False))


#: a frozen encoder: an RGB batch -> one non-negative feature map, or several (each is
#: GeM-pooled, and the pooled vectors are concatenated)
FeatureFn = Callable[["torch.Tensor"], "torch.Tensor | Sequence[torch.Tensor]"]


class Frames(Protocol):
    """Anything indexable with a length: a list of images, a lazy sequence reader."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> Any: ...


class DescriptorExtractor:
    """Frozen encoder -> GeM -> (mean, variance) over n sampled frames.

    ``encoder`` maps a (B, 3, H, W) float batch in [0, 1] (RGB) to a non-negative feature map
    (B, C, h, w) or a list of them (each GeM-pooled, the vectors concatenated); pass a model's
    ``forward_features``. It runs in eval mode under ``torch.inference_mode`` in batches of
    ``batch_size``, so memory does not grow with n.
    """

    def __init__(
        self,
        encoder: FeatureFn,
        *,
        num_frames: int = 64,
        batch_size: int = 8,
        p: float = 3.0,
        eps: float = 1e-6,
        var_floor: float = VAR_FLOOR,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if var_floor <= 0:
            raise ValueError(f"var_floor must be > 0, got {var_floor}")
        self.encoder = encoder
        self.num_frames = num_frames
        self.batch_size = batch_size
        self.p = p
        self.eps = eps
        self.var_floor = var_floor
        self.seed = seed
        import torch

        self.device = torch.device(device)

    def pooled(self, images: torch.Tensor) -> torch.Tensor:
        """GeM vectors (B, C) of a (B, 3, H, W) batch."""
        import torch

        # the model of a bound method, or of a functools.partial of one
        bound = getattr(self.encoder, "func", self.encoder)
        module = getattr(bound, "__self__", None)
        if isinstance(module, torch.nn.Module):
            module.eval()
        with torch.inference_mode():
            feats = self.encoder(images.to(self.device))
            maps = [feats] if isinstance(feats, torch.Tensor) else list(feats)
            return torch.cat([gem(f, p=self.p, eps=self.eps) for f in maps], dim=1).cpu()

    def _pooled_batches(
        self, frames: Frames, to_tensor: Callable[[Any], torch.Tensor] | None
    ) -> Iterator[np.ndarray]:
        """GeM vectors of the sampled frames, one (b, C) array per batch."""
        import torch

        convert = to_tensor or image_to_tensor
        idx = sample_indices(len(frames), self.num_frames, self.seed)
        for b0 in range(0, idx.size, self.batch_size):
            batch = torch.stack([convert(frames[int(i)]) for i in idx[b0 : b0 + self.batch_size]])
            yield self.pooled(batch).numpy()

    def _descriptor(self, moments: RunningMoments | None) -> Descriptor:
        assert moments is not None  # sample_indices is never empty
        return moments.descriptor(self.var_floor)

    def extract(
        self, frames: Frames, *, to_tensor: Callable[[Any], torch.Tensor] | None = None
    ) -> Descriptor:
        """Descriptor of a client whose frames are ``frames`` (indexable, read lazily).

        Each frame is an (H, W, 3) uint8 RGB array unless ``to_tensor`` converts it to a
        (3, H, W) float tensor in [0, 1]. Memory does not grow with the number of frames.
        """
        moments: RunningMoments | None = None
        for g in self._pooled_batches(frames, to_tensor):
            if moments is None:
                moments = RunningMoments(g.shape[1])
            moments.update(g)
        return self._descriptor(moments)

    def per_frame(
        self, frames: Frames, *, to_tensor: Callable[[Any], torch.Tensor] | None = None
    ) -> np.ndarray:
        """The GeM vectors (n_c, C) of the sampled frames themselves (PACFL's feature matrix)."""
        return self.extract_with_features(frames, to_tensor=to_tensor)[1]

    def extract_with_features(
        self, frames: Frames, *, to_tensor: Callable[[Any], torch.Tensor] | None = None
    ) -> tuple[Descriptor, np.ndarray]:
        """The descriptor and the per-frame GeM vectors (n_c, C, float64) from one pass over the
        frames: what :meth:`extract` and :meth:`per_frame` return, at the cost of one."""
        moments: RunningMoments | None = None
        out = []
        for g in self._pooled_batches(frames, to_tensor):
            if moments is None:
                moments = RunningMoments(g.shape[1])
            moments.update(g)
            out.append(g)
        return self._descriptor(moments), np.concatenate(out).astype(np.float64)


def image_to_tensor(image: Any) -> torch.Tensor:
    """(H, W, 3) uint8 RGB array -> (3, H, W) float32 tensor in [0, 1]."""
    import torch

    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {arr.shape}")
    t = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)
    return t.float().div_(255.0) if arr.dtype == np.uint8 else t.float()
