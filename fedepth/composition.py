"""Who is in a cluster: its members' labels (platform, environment) and how alike they are.

Plain functions on a K x N boolean cluster map and the clients' label mappings, so that the
benchmark's report, its figures, the coordinator's fleet status and the descriptor study all
describe clusters the same way:

- :func:`composition_counts` / :func:`composition_label`: a set of clients as
  ``"spot/forest x3, car/forest x1"``;
- :func:`co_member_shares`: the mean over clients of the share of their co-members (the other
  members of any cluster they belong to) that share their platform, environment, both;
- :func:`member_shares`: the share of a set of clients sharing a given client's labels (the
  members of the clusters a test sequence is routed to, against the sequence's own labels).

A label a client did not declare (absent, or empty) is unknown: it shows as :data:`UNKNOWN` and
is never counted as shared or as not shared (a client is left out of a label's mean where its
own is unknown, a co-member where its is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

#: The labels compositions are made of, in order (``platform/environment``).
LABELS: tuple[str, ...] = ("platform", "environment")
#: How an undeclared label shows.
UNKNOWN = "?"


def label_of(labels: Mapping[str, str], keys: Sequence[str] = LABELS) -> str:
    """One client's labels as ``platform/environment`` (:data:`UNKNOWN` for an undeclared one)."""
    return "/".join(labels.get(k) or UNKNOWN for k in keys)


def composition_counts(
    members: Iterable[int], labels: Sequence[Mapping[str, str]], keys: Sequence[str] = LABELS
) -> dict[str, int]:
    """How many of ``members`` (indices into ``labels``) carry each ``platform/environment``,
    most frequent first (ties: in the order they first occur)."""
    counts: dict[str, int] = {}
    for m in members:
        key = label_of(labels[int(m)], keys)
        counts[key] = counts.get(key, 0) + 1
    order = {k: i for i, k in enumerate(counts)}
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], order[kv[0]])))


def composition_label(counts: Mapping[str, int], *, most: int | None = None) -> str:
    """Counts as one line, ``"spot/forest x3, car/forest x1"``; with ``most``, the first
    ``most`` groups then ``"+n more"`` (n: the members left out)."""
    items = list(counts.items())
    shown = items if most is None else items[:most]
    text = ", ".join(f"{k} x{n}" for k, n in shown)
    rest = sum(n for _, n in items[len(shown) :])
    return f"{text}, +{rest} more" if rest else text


def _known(labels: Mapping[str, str], key: str) -> str | None:
    return labels.get(key) or None


def member_shares(
    members: Iterable[int],
    labels: Sequence[Mapping[str, str]],
    own: Mapping[str, str],
    keys: Sequence[str] = LABELS,
) -> dict[str, float | None]:
    """The share of ``members`` that share ``own``'s value of each label, and of all of them
    (``both``). Members whose value is unknown are left out; None where nothing compares (an
    unknown ``own`` value, or no member with a known one)."""
    rows = [labels[int(m)] for m in members]
    out: dict[str, float | None] = {}
    for key in keys:
        mine = _known(own, key)
        same = [_known(r, key) == mine for r in rows if _known(r, key) is not None]
        out[key] = float(np.mean(same)) if mine is not None and same else None
    if all(_known(own, k) is not None for k in keys):
        both = [
            all(r[k] == own[k] for k in keys)
            for r in rows
            if all(_known(r, k) is not None for k in keys)
        ]
        out["both"] = float(np.mean(both)) if both else None
    else:
        out["both"] = None
    return out


def co_members(M: npt.ArrayLike, client: int) -> np.ndarray:
    """The other members of every cluster (row of the K x N map ``M``) holding ``client``."""
    m = np.asarray(M, dtype=bool)
    if m.shape[0] == 0:
        return np.zeros(0, dtype=int)
    mates = np.flatnonzero(m[m[:, client]].any(axis=0))
    return mates[mates != client]


def co_member_shares(
    M: npt.ArrayLike, labels: Sequence[Mapping[str, str]], keys: Sequence[str] = LABELS
) -> dict[str, float]:
    """Mean over clients of the share of their co-members (the other members of any of their
    clusters, :func:`co_members`) that share their value of each label, and of all of them
    (``both``); clients without co-members are left out and counted under ``alone``.

    ``M``: the K x N boolean cluster map; ``labels[c]``: client c's labels. A label's mean is
    NaN when no client compares (see :func:`member_shares` for unknown labels).
    """
    m = np.asarray(M, dtype=bool)
    shares: dict[str, list[float]] = {k: [] for k in (*keys, "both")}
    alone = 0
    for c in range(m.shape[1]):
        mates = co_members(m, c)
        if mates.size == 0:
            alone += 1
            continue
        for key, share in member_shares(mates, labels, labels[c], keys).items():
            if share is not None:
                shares[key].append(share)
    out = {k: float(np.mean(v)) if v else float("nan") for k, v in shares.items()}
    out["alone"] = float(alone)
    return out
