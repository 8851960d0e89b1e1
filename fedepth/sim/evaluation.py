"""Scoring a routed model on an unseen test sequence (metrics and a picture).

:class:`Router` is what evaluation needs of a strategy; :func:`evaluate_sequence` gives a
sequence's mean metrics over its evaluation frames and the :data:`Sample` of the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from fedepth.data.crops import evaluation_crop
from fedepth.data.sequence import Sequence as RGBDSequence
from fedepth.data.torchdata import resize_frame
from fedepth.descriptor import Descriptor
from fedepth.metrics import compute_errors, mean_errors
from fedepth.models import DepthModel
from fedepth.sim.config import SimConfig
from fedepth.strategies import RouteDecision


class Router(Protocol):
    """What evaluation needs of a strategy: routing an unseen sequence to a model (a
    :class:`~fedepth.strategies.Strategy`, or a client of a coordinator running one)."""

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision: ...


#: One test sequence's picture for the report: (rgb, ground truth, prediction).
Sample = tuple[np.ndarray, np.ndarray, np.ndarray]


def eval_indices(n: int, k: int) -> list[int]:
    """k frame indices spread evenly over a sequence of n frames."""
    return sorted({int(i) for i in np.linspace(0, n - 1, min(k, n)).round()})


def evaluate_sequence(
    model: DepthModel, seq: RGBDSequence, config: SimConfig
) -> tuple[dict[str, float], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Mean metrics over a sequence's evaluation frames (at the training resolution, inside
    its source benchmark's crop: :func:`~fedepth.data.crops.evaluation_crop`), and the
    (rgb, gt, pred) of its first evaluation frame for pictures. The model is run where its
    weights are (a GPU after GPU training); metrics are computed on the CPU."""
    rows: list[dict[str, float]] = []
    sample: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    weight = next(model.parameters(), None)
    device = weight.device if weight is not None else torch.device("cpu")
    model.eval()
    with torch.inference_mode():
        for i in eval_indices(len(seq), config.eval_frames):
            rgb, depth = resize_frame(seq[i], config.image_size)
            pred = model(rgb[None].to(device))[0, 0].float().cpu().numpy()
            gt = depth[0].numpy()
            crop = evaluation_crop(seq.meta.source, (gt.shape[0], gt.shape[1]))
            valid = (gt > seq.meta.min_depth) & (gt < seq.meta.max_depth)
            if crop is not None:
                valid &= crop
            if not valid.any():
                continue
            rows.append(
                compute_errors(gt, pred, seq.meta.min_depth, seq.meta.max_depth, mask=crop)
            )
            if not sample:
                sample.append((rgb.permute(1, 2, 0).numpy(), gt, pred))
    if not rows:
        raise ValueError(f"test sequence {seq.name!r} has no valid depth in its eval frames")
    return mean_errors(rows), sample
