"""Training losses: scale-invariant log loss (SILog) and the head-specific terms.

SILog as coded in AdaBins / NeWCRFs, over the valid pixels of the whole batch,
``10 * sqrt(mean(g^2) - lambda * mean(g)^2)`` with ``g = log(pred) - log(gt)`` and lambda = 0.85;
the paper's un-rooted form ``mean(d^2) - lambda * mean(d)^2`` is :func:`si_loss`. A batch without
any valid pixel gives a zero loss that still back-propagates (zero gradients).
"""

from __future__ import annotations

import torch

#: Floor under the SILog radicand: sqrt has an infinite slope at 0 (a perfect prediction).
_SQRT_FLOOR = 1e-12


def valid_mask(gt: torch.Tensor, min_depth: float, max_depth: float) -> torch.Tensor:
    """Pixels with usable ground truth: finite and strictly inside (min_depth, max_depth).

    Datasets mark missing depth with 0 (or +inf, NaN), which this excludes.
    """
    return torch.isfinite(gt) & (gt > min_depth) & (gt < max_depth)


def _log_error(log_pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    if log_pred.shape != gt.shape or valid.shape != gt.shape:
        raise ValueError(
            f"prediction {tuple(log_pred.shape)}, ground truth {tuple(gt.shape)} and mask "
            f"{tuple(valid.shape)} must have the same shape"
        )
    m = valid.bool()
    return log_pred.float()[m] - torch.log(gt.float()[m])


def _zero(like: torch.Tensor) -> torch.Tensor:
    return like.float().sum() * 0.0


def silog_from_log(
    log_pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor, *, variance_focus: float = 0.85
) -> torch.Tensor:
    """SILog of a log-depth prediction: ``10 * sqrt(mean(g^2) - lambda * mean(g)^2)``."""
    g = _log_error(log_pred, gt, valid)
    if g.numel() == 0:
        return _zero(log_pred)
    dg = (g * g).mean() - variance_focus * g.mean() ** 2
    return 10.0 * torch.sqrt(dg.clamp_min(_SQRT_FLOOR))


def silog_loss(
    pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor, *, variance_focus: float = 0.85
) -> torch.Tensor:
    """SILog (AdaBins / NeWCRFs) of a positive metric-depth prediction on valid pixels."""
    return silog_from_log(torch.log(pred.float()), gt, valid, variance_focus=variance_focus)


def si_loss(
    pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor, *, variance_focus: float = 0.85
) -> torch.Tensor:
    """The paper's scale-invariant loss ``1/T sum d^2 - lambda/T^2 (sum d)^2`` (no root, no 10)."""
    d = _log_error(torch.log(pred.float()), gt, valid)
    if d.numel() == 0:
        return _zero(pred)
    return (d * d).mean() - variance_focus * d.mean() ** 2


def bin_chamfer_loss(centers: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """AdaBins' bin-centre chamfer loss: squared 1-D chamfer distance between each image's bin
    centres (B, N) and its valid ground-truth depths, averaged over the images that have any.

    Per image ``mean_n min_t (c_n - y_t)^2 + mean_t min_n (c_n - y_t)^2``, the value pytorch3d's
    ``chamfer_distance`` gives upstream; computed exactly by sorting and binary search (1-D nearest
    neighbours are adjacent in sorted order), so memory is O(N + T) instead of O(N T).
    """
    if centers.ndim != 2 or centers.shape[0] != gt.shape[0]:
        raise ValueError(
            f"bin centres must be (B, N) for B={gt.shape[0]}, got {tuple(centers.shape)}"
        )
    c_all = centers.float()
    terms = []
    for b in range(c_all.shape[0]):
        y = gt[b].float()[valid[b].bool()]
        if y.numel() == 0:
            continue
        c_sorted = torch.sort(c_all[b]).values
        y_sorted = torch.sort(y).values
        terms.append(_nearest_sq(y, c_sorted).mean() + _nearest_sq(c_sorted, y_sorted).mean())
    if not terms:
        return _zero(centers)
    return torch.stack(terms).mean()


def _nearest_sq(points: torch.Tensor, sorted_ref: torch.Tensor) -> torch.Tensor:
    """Squared distance from each point to its nearest element of the sorted 1-D ``sorted_ref``."""
    n = sorted_ref.numel()
    hi = torch.searchsorted(sorted_ref.detach().contiguous(), points.detach().contiguous())
    lo = (hi - 1).clamp(0, n - 1)
    hi = hi.clamp(0, n - 1)
    d_lo = (points - sorted_ref[lo]) ** 2
    d_hi = (points - sorted_ref[hi]) ** 2
    return torch.minimum(d_lo, d_hi)


def frequency_sparsity(coeffs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """DCDepth's frequency-sparsity term: ``mean over patches of sum_k w_k |c_k|``.

    ``coeffs`` is (..., P*P) DCT coefficients per patch, ``weight`` (P*P,) with higher weight on
    higher frequencies (DCDepth: ``1.2^(u+v) - 1``, normalised to sum 1).
    """
    return (coeffs.float().abs() * weight).sum(-1).mean()
