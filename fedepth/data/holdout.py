"""A validation split carved from the training clients' own sequences: the tail of each one.

:func:`split_tail` cuts one sequence into its head (what the client trains on) and its tail
(held out), as :class:`~fedepth.data.sequence.SubSequence` views; :func:`holdout_validation`
does it for every client of a fleet. The held-out part of a sequence is a contiguous tail, not
random frames: neighbouring frames of a video are near-duplicates, so a random split would put
copies of the validation frames into training. A tail of ``round(share * len)`` frames (halves
up) is held out of every sequence; a client left with no training frame, or with no validation
frame at a share above 0, is refused (:class:`ValidationSplitError`, naming the client).
"""

from __future__ import annotations

import math

import numpy as np

from fedepth.data.scenario import Client
from fedepth.data.sequence import Sequence, SubSequence


class ValidationSplitError(ValueError):
    """A validation share that cannot be carved from a client's sequences."""


def check_share(share: float) -> None:
    """Refuse a validation share outside [0, 1) (1 would hold out every training frame)."""
    if not (isinstance(share, (int, float)) and math.isfinite(share) and 0.0 <= share < 1.0):
        raise ValidationSplitError(f"the validation share must lie in [0, 1), got {share}")


def tail_length(n: int, share: float) -> int:
    """How many of a sequence's ``n`` frames its validation tail holds: ``share * n``
    rounded half up."""
    return min(n, math.floor(share * n + 0.5))


def split_tail(seq: Sequence, share: float) -> tuple[SubSequence, SubSequence]:
    """(head, tail) of ``seq``: the first frames, trained on, under the sequence's own name,
    and the last :func:`tail_length` frames, held out, as ``<name>/validation``."""
    check_share(share)
    n = len(seq)
    cut = n - tail_length(n, share)
    head = SubSequence(seq, np.arange(cut), name=seq.name)
    tail = SubSequence(seq, np.arange(cut, n), name=f"{seq.name}/validation")
    return head, tail


def holdout_validation(
    clients: list[Client], share: float
) -> tuple[list[Client], dict[str, list[Sequence]]]:
    """Every client with the validation tail of each of its sequences held out: (the clients
    over their heads alone, client name -> its tails). A sequence whose head is empty drops
    out of its client's training; one whose tail is empty gives it no validation frame.

    Raises :class:`ValidationSplitError` when a client would train on no frame, or (at a share
    above 0) be validated on none.
    """
    check_share(share)
    train: list[Client] = []
    validation: dict[str, list[Sequence]] = {}
    for client in clients:
        parts = [split_tail(s, share) for s in client.sequences]
        heads = [h for h, _ in parts if len(h)]
        tails: list[Sequence] = [t for _, t in parts if len(t)]
        held = sum(len(t) for t in tails)
        counts = f"(of its {client.num_samples} frames {held} held out)"
        if not heads:
            raise ValidationSplitError(
                f"a validation share of {share:g} leaves client {client.name} no training "
                f"frame {counts}; give a smaller share"
            )
        if share > 0 and not tails:
            raise ValidationSplitError(
                f"a validation share of {share:g} leaves client {client.name} no validation "
                f"frame {counts}; give a larger share"
            )
        train.append(Client(client.name, client.platform, client.environment, list(heads)))
        validation[client.name] = tails
    return train, validation
