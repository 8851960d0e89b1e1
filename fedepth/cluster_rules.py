"""FeDepth's merge and routing rules, by name: the paper's (``paper``) and the alternatives.

A *merge rule* turns the soft map ``M = A <= tau`` (N x N; row i is client i's neighbourhood,
the clients within tau of it) into the merged map ``M*`` (K x N). Every rule returns each
client in at least one cluster, rows in the canonical order of :func:`canonical_order`, and
depends on nothing but ``M`` (deterministic):

- ``subsets`` (the paper's): a row equal to or a proper subset of another row is absorbed by
  it; the maximal distinct neighbourhoods remain (:func:`merge_subsets`).
- ``duplicates``: only exact duplicate rows are merged; a proper subset stays its own cluster
  (:func:`merge_duplicates`).
- ``cliques``: a cluster holds only clients that are mutually within tau: a greedy cover of
  the tau graph by maximal cliques, seeded by the tightest neighbourhoods
  (:func:`merge_cliques`).

A *routing rule* picks the clusters an unseen sequence is served by from ``S_k``, its mean
divergence to the members of cluster k (:func:`cluster_scores`); the sequence gets the plain
mean of those clusters' models:

- ``within-tau`` (the paper's): every k with ``S_k <= tau``, else the single nearest cluster.
- ``nearest``: the single cluster of least ``S_k``.
- ``near-nearest``: every k with ``S_k <= min_j S_j + tau``.

:data:`RULES` names presets of a (merge, routing) pair; ``paper`` is the default everywhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt
from scipy import sparse

from fedepth.jeffreys import FloatArray

BoolArray = npt.NDArray[np.bool_]


def _as_map(M: npt.ArrayLike) -> BoolArray:
    m = np.asarray(M, dtype=bool)
    if m.ndim != 2:
        raise ValueError(f"the cluster map must be 2-D (K x N), got shape {m.shape}")
    return m


def _distinct_rows(M: npt.ArrayLike) -> np.ndarray:
    """The distinct non-empty rows of the map ``M`` (0/1 uint8, K x N; K may be 0)."""
    m = _as_map(M)
    n = m.shape[1]
    m = m[m.any(axis=1)]
    if m.shape[0] == 0:
        return np.zeros((0, n), dtype=np.uint8)
    return np.unpackbits(np.unique(np.packbits(m, axis=1), axis=0), axis=1, count=n)


def merge_subsets(M: npt.ArrayLike) -> BoolArray:
    """Merge redundant clusters: the K x N map of the maximal distinct rows of ``M``.

    A row whose client set equals another row's, or is a proper subset of another row's, is
    absorbed by that row. The paper repeats this until nothing changes; since "is a subset of"
    is transitive, one pass that keeps exactly the maximal sets is already that fixed point.
    Rows are returned in a canonical order (by their smallest member, then by size), so the
    result depends on the client order only through the relabelling of the columns. Empty rows
    are dropped. Every client that belongs to a row of ``M`` belongs to a row of the result.
    """
    rows = _distinct_rows(M)
    if rows.shape[0] == 0:
        return rows.astype(bool)
    keep = maximal_rows(sparse.csr_matrix(rows, dtype=np.int32))
    return canonical_order(rows[keep].astype(bool))


def merge_duplicates(M: npt.ArrayLike) -> BoolArray:
    """The distinct non-empty rows of ``M`` in canonical order: duplicates merged, nothing else.

    A neighbourhood that lies inside a wider one stays a cluster of its own, so a tight group
    (every member's neighbourhood the same few clients) keeps its model even where one client
    near everyone has a neighbourhood holding it. Every client of a row of ``M`` stays.
    """
    return canonical_order(_distinct_rows(M).astype(bool))


def merge_cliques(M: npt.ArrayLike) -> BoolArray:
    """A cover of the tau graph by maximal cliques: clusters of mutually similar clients.

    The paper forms clusters to group clients of similar data and lets a client join several
    clusters where its data lies between domains. A neighbourhood row holds the clients within
    tau of its seed, not of each other: a client near two domains (a car next to both the
    Falcon and the Spot forest drives) has a star-shaped neighbourhood whose leaves are far
    apart, and subset merging lets that star absorb the tight groups inside it. Here a cluster
    must be a clique of the graph ``M & M.T`` (every two members within tau), so the star
    splits into its tight parts and the client between them is in each: the overlap.

    The cover, exactly: clients are taken in order of neighbourhood size (smallest first, then
    index), the most specific first; a client not yet in a cluster seeds one, grown greedily
    from ``{seed}`` by adding, of the clients within tau of every member so far, the one with
    the most neighbours among those candidates (lowest index on ties), until none is left.
    Each cluster is a maximal clique holding a client no earlier cluster holds, so the
    clusters are distinct and none lies inside another; every client is in one at least. Ties
    go to the lowest index, so unlike ``subsets`` a relabelling of tied clients can change
    the cover. ``M`` must be square (N x N); its diagonal is taken as set.
    """
    m = _as_map(M)
    n = m.shape[0]
    if m.shape[1] != n:
        raise ValueError(f"the clique rule needs the square soft map (N x N), got {m.shape}")
    adj = m & m.T
    np.fill_diagonal(adj, True)
    order = np.lexsort((np.arange(n), adj.sum(axis=1)))
    covered = np.zeros(n, dtype=bool)
    cliques = []
    for seed in order:
        if covered[seed]:
            continue
        row = np.zeros(n, dtype=bool)
        row[seed] = True
        cand = adj[seed] & ~row
        while cand.any():
            idx = np.flatnonzero(cand)
            inner = adj[np.ix_(idx, idx)].sum(axis=1)
            v = int(idx[int(np.argmax(inner))])  # first maximum: the lowest index
            row[v] = True
            cand &= adj[v]
            cand[v] = False
        covered |= row
        cliques.append(row)
    return canonical_order(np.array(cliques, dtype=bool).reshape(-1, n))


def maximal_rows(S: sparse.csr_matrix) -> np.ndarray:
    """Indices of the rows of a binary sparse map that no other row dominates.

    Row i is dominated by row j if it is a proper subset of j, or equal to j with j < i (so one
    row of each group of duplicates survives). Both are read off the intersection counts
    ``C = S S^T``: ``C[i, j] == |i|`` means i is contained in j. The cost is that of the sparse
    product, small when clusters are small compared with the fleet.
    """
    S = sparse.csr_matrix(S)
    size = np.diff(S.indptr)
    C = (S @ S.T).tocsr()
    rows = np.repeat(np.arange(S.shape[0]), np.diff(C.indptr))
    inside = C.data == size[rows]  # row i is contained in row j (i == j included)
    i, j = rows[inside], C.indices[inside]
    dominated = (size[j] > size[i]) | ((size[j] == size[i]) & (j < i))
    drop = np.zeros(S.shape[0], dtype=bool)
    drop[i[dominated]] = True
    drop |= size == 0
    return np.flatnonzero(~drop)


def canonical_order(m: BoolArray) -> BoolArray:
    """Rows sorted by (first member, larger first, membership bytes): a total order, since the
    rows of a merged map are distinct."""
    if m.shape[0] <= 1:
        return m
    return m[canonical_rows(sparse.csr_matrix(m))]


def canonical_rows(S: sparse.csr_matrix) -> np.ndarray:
    """The row order of :func:`canonical_order` for a sparse map without empty rows; the bytes
    are compared only within ties of the first two keys."""
    S = sparse.csr_matrix(S)
    S.sort_indices()
    size = np.diff(S.indptr)
    first = S.indices[S.indptr[:-1]]
    order = np.lexsort((-size, first))
    key = np.stack([first[order], size[order]], axis=1)
    starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(axis=1), True])
    for a, b in itertools.pairwise(starts):
        if b - a > 1:  # equal first member and size: order by the membership bytes
            tied = order[a:b]
            packed = np.packbits(S[tied].toarray().astype(bool), axis=1)
            order[a:b] = tied[sorted(range(b - a), key=lambda r: packed[r].tobytes())]
    return order


#: The merge rules by name: soft map (N x N) -> merged map M* (K x N), canonical order.
MERGE_RULES: dict[str, Callable[[npt.ArrayLike], BoolArray]] = {
    "subsets": merge_subsets,
    "duplicates": merge_duplicates,
    "cliques": merge_cliques,
}


def _within_tau(scores: FloatArray, tau: float) -> list[int]:
    chosen = np.flatnonzero(scores <= tau)
    return chosen.tolist() if chosen.size else [int(np.argmin(scores))]


def _nearest(scores: FloatArray, tau: float) -> list[int]:
    return [int(np.argmin(scores))]


def _near_nearest(scores: FloatArray, tau: float) -> list[int]:
    return np.flatnonzero(scores <= scores.min() + tau).tolist()


#: The routing rules by name: (S (K,), tau) -> the chosen clusters, ascending. ``within-tau``:
#: every k with S_k <= tau, else argmin S (the paper's). ``nearest``: argmin S alone (lowest
#: index on ties). ``near-nearest``: every k with S_k <= min S + tau, i.e. the clusters no
#: farther from the sequence than the nearest one by more than the clustering's own threshold
#: (always the nearest; the within-tau clusters too, since S >= 0).
ROUTING_RULES: dict[str, Callable[[FloatArray, float], list[int]]] = {
    "within-tau": _within_tau,
    "nearest": _nearest,
    "near-nearest": _near_nearest,
}

#: Named (merge, routing) presets; ``paper`` is the paper's pair and the default.
RULES: dict[str, tuple[str, str]] = {"paper": ("subsets", "within-tau")}


def _known(kind: str, name: object, known: Mapping[str, object]) -> str:
    if not isinstance(name, str) or name not in known:
        raise ValueError(f"unknown {kind} rule {name!r}; known: {', '.join(known)}")
    return name


def check_merge(name: str) -> str:
    """``name`` if it names a merge rule, else a ValueError listing the known ones."""
    return _known("merge", name, MERGE_RULES)


def check_routing(name: str) -> str:
    """``name`` if it names a routing rule, else a ValueError listing the known ones."""
    return _known("routing", name, ROUTING_RULES)


def resolve_rules(
    rules: str = "paper", merge: str | None = None, routing: str | None = None
) -> tuple[str, str]:
    """The (merge, routing) names: the preset ``rules``, with ``merge`` / ``routing`` (when
    given) in place of its own; every name checked."""
    if not isinstance(rules, str) or rules not in RULES:
        raise ValueError(f"unknown rules preset {rules!r}; known: {', '.join(RULES)}")
    preset_merge, preset_routing = RULES[rules]
    return check_merge(merge or preset_merge), check_routing(routing or preset_routing)


def merge(M: npt.ArrayLike, rule: str = "subsets") -> BoolArray:
    """The merged map M* of the soft map ``M`` by the merge rule named ``rule``."""
    return MERGE_RULES[check_merge(rule)](M)


def cluster_scores(divergences_to_clients: npt.ArrayLike, M_star: npt.ArrayLike) -> FloatArray:
    """``S_k``: the mean divergence to the members of each cluster (K,)."""
    m = np.asarray(M_star, dtype=bool)
    d = np.asarray(divergences_to_clients, dtype=np.float64).reshape(-1)
    return np.asarray((m @ d) / m.sum(axis=1), dtype=np.float64)


def route(
    divergences_to_clients: npt.ArrayLike,
    M_star: npt.ArrayLike,
    tau: float,
    rule: str = "within-tau",
) -> list[int]:
    """Clusters an unseen sequence is routed to, ascending (paper, Sec. 3.3 "Inference").

    ``S_k`` is the mean divergence from the sequence to the members of cluster k; the routing
    rule ``rule`` (:data:`ROUTING_RULES`) picks from them. The default, the paper's: every k
    with ``S_k <= tau``, else the single nearest cluster (lowest index on ties).
    """
    choose = ROUTING_RULES[check_routing(rule)]
    d = np.asarray(divergences_to_clients, dtype=np.float64).reshape(-1)
    m = np.asarray(M_star, dtype=bool)
    if m.ndim != 2 or m.shape[0] == 0:
        raise ValueError(f"the cluster map must be K x N with K > 0, got shape {m.shape}")
    if m.shape[1] != d.size:
        raise ValueError(f"{d.size} divergences given for a map of {m.shape[1]} clients")
    if np.isnan(d).any():
        raise ValueError("divergences contain NaN")
    counts = m.sum(axis=1)
    if (counts == 0).any():
        raise ValueError("the cluster map has an empty cluster")
    return choose((m @ d) / counts, tau)
