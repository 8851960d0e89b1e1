"""The benchmark's tables: report.md in the paper's layout, and the table for the terminal.

:func:`render_report` writes mean ± std and marks differences from FeDepth beyond the combined
spread (:data:`MARK`) when several seeds ran, and who is in each cluster of every clustered
method (from results.json's ``composition``); :func:`format_table` is the fixed-width table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedepth.bench.combine import beyond_spread
from fedepth.bench.fleet_summary import describe_machine
from fedepth.bench.spec import sweep_name
from fedepth.sim import TABLE_METRICS

#: The mark of a difference from FeDepth beyond the combined spread over seeds.
MARK = "*"


def _cell(vals: Mapping[str, Any], col: str, spread: bool) -> str:
    """``mean`` (one seed) or ``mean ± std`` (several), ``-`` when missing."""
    v = vals.get(col)
    if not isinstance(v, (int, float)):
        return "-"
    std = vals.get(f"{col}_std")
    return f"{v:.3f} ± {std:.3f}" if spread and isinstance(std, (int, float)) else f"{v:.3f}"


def _table(
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    cols: Sequence[str],
    header: Sequence[str] | None = None,
    *,
    spread: bool = False,
    ref: Mapping[str, Any] | None = None,
) -> str:
    """A markdown table; with ``spread``, cells are mean ± std and every cell of a row other
    than ``ref`` (FeDepth's) that differs from it beyond the combined spread is marked."""
    head = header or cols
    lines = [
        "| Method | " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head) + " |",
    ]
    for name, vals in rows:
        cells = []
        for c in cols:
            cell = _cell(vals, c, spread)
            marked = (
                spread
                and ref is not None
                and vals is not ref
                and isinstance(vals.get(c), (int, float))
                and isinstance(ref.get(c), (int, float))
                and beyond_spread(vals, ref, c)
            )
            cells.append(f"{cell} {MARK}" if marked else cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_report(results: dict[str, Any]) -> str:
    """Markdown report with the paper's table layout (mean ± std when several seeds ran)."""
    m = results["methods"]
    seeds = list(results.get("seeds") or [results["seed"]])
    spread = len(seeds) > 1
    ref = m.get("fedepth")
    arrows = [
        "Abs Rel ↓",
        "Sq Rel ↓",
        "RMSE ↓",
        "RMSE log ↓",
        "δ<1.25 ↑",
        "δ<1.25² ↑",
        "δ<1.25³ ↑",
    ]
    table_no = "1" if results["scenario"] == "hpe" else "2"
    out = [
        f"# fedepth benchmark: {results['scenario'].upper()} ({results['profile']} profile)",
        "",
        f"Backbone `{results['backbone']}`, "
        + (f"seeds {', '.join(map(str, seeds))}, " if spread else f"seed {results['seed']}, ")
        + f"{results['num_clients']} clients, {results['num_test_sequences']} unseen test "
        f"sequences; numbers are means over the last rounds (see config.json). "
        f"Wall time {results['wall_seconds'] / 60:.1f} min (this command; runs that an "
        "earlier one finished are loaded from state/, not rerun). "
        + (
            f"Every number is the mean ± the sample standard deviation (ddof = 1) over the "
            f"{len(seeds)} seeds; each seed generates its own scenario (unless `--data` is "
            "given), pretrains its own initial model (unless `--weights`) and trains every "
            "method with its own seed. "
            + (
                f"{MARK} marks a difference from FeDepth larger than the combined spread, "
                "|mean_FeDepth - mean_method| > std_FeDepth + std_method; unmarked differences "
                "lie within the spread."
                if ref is not None
                else "FeDepth did not run, so no difference is marked."
            )
            if spread
            else "One seed: no spread is measured and no difference is marked "
            "(`--seeds 0,1,2` gives mean ± std)."
        ),
        "",
    ]
    out += _provenance(results)
    out += _given_params(m)
    if results.get("transport") == "grpc":
        local = [k for k, v in m.items() if v.get("transport") != "grpc"]
        out += [
            "Transport: **gRPC**. Each method ran through a real `fedepth-coordinator` process "
            "with one robot process per client on loopback; for the same seed the numbers are "
            "those of the in-process run, and time now includes the wire "
            "(see docs/coordinator.md)."
            + (f" Run in-process (not a fleet): {', '.join(local)}." if local else ""),
            "",
        ]
    out += [
        f"## Table {table_no}: methods",
        "",
        _table([(k, v) for k, v in m.items()], TABLE_METRICS, arrows, spread=spread, ref=ref),
        "",
    ]
    out += _thresholds(m)
    out += [
        "## Convergence: Abs Rel over the last five evaluated rounds",
        "",
        "| Method | first | last | relative change |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {k} | {c[0]:.3f} | {c[1]:.3f} | {c[2]:+.1%} |"
            for k, c in ((k, curve_change(v["curves"]["abs_rel"])) for k, v in m.items())
            if c is not None
        ),
        "",
        "A curve has flattened where the relative change is small against the differences "
        "between methods" + (" (curves averaged over the seeds)." if spread else "."),
        "",
    ]
    if "hard" in m and "fedepth" in m:
        out += [
            "## Table 3a: hard vs soft clustering at the same tau",
            "",
            _table(
                [("Hard clustering", m["hard"]), ("Soft clustering (FeDepth)", m["fedepth"])],
                ["abs_rel"],
                ["Abs Rel ↓"],
                spread=spread,
                ref=m["fedepth"],
            ),
            "",
        ]
    out += _averaged_routes(m)
    sweep = results.get("overlap_sweep") or {}
    out += _sweep_table(
        "Table 3b: overlap ratio sweep (FeDepth)",
        "Overlap target",
        {r: f"{float(r):.0%}" for r in sweep},
        ("overlap_sweep", sweep, results.get("chosen"), spread),
        "100 % means one cluster holding every client (tau = infinity); a "
        "target is met by the smallest tau whose merged map comes closest to it."
        + (" K per seed where the seeds differ." if spread else ""),
    )
    rule_sweep = results.get("rule_sweep") or {}
    out += _sweep_table(
        "FeDepth's rules (rule sweep)",
        "Rules",
        {p: f"`{p}`" for p in rule_sweep},
        ("rule_sweep", rule_sweep, results.get("chosen"), spread),
        "Each point is FeDepth with its configured parameters and the one rule replaced; "
        "tau is calibrated (or matched) on the map of each point's own merge rule.",
    )
    out += _validation(results, spread)
    group_names = sorted({g for v in m.values() for g in v["groups"]})
    if group_names:
        cols = [*group_names, "all"]
        rows = [(k, _group_row(v)) for k, v in m.items()]
        out += [
            "## Table 3c: Abs Rel per platform and environment of the test sequences",
            "",
            _table(
                rows,
                cols,
                [g.split(":", 1)[1] for g in group_names] + ["All"],
                spread=spread,
                ref=dict(rows)["fedepth"] if ref is not None else None,
            ),
            "",
        ]
    out += _composition(m)
    out += [
        "## Communication and time",
        "",
        "| Method | download / client / round | upload / client / round | train s | "
        "descriptors s | clustering s | aggregation s | wire s | per-round overhead | "
        "overhead |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, v in m.items():
        b, t = v["bytes_per_round"], v["timing"]
        out.append(
            f"| {k} | {b['download_mean'] / 2**20:.2f} MiB | "
            f"{b['upload_mean'] / 2**20:.2f} MiB | {t['train_seconds']:.1f} | "
            f"{t['descriptor_seconds']:.1f} | {t['setup_seconds']:.2f} | "
            f"{t['aggregate_seconds']:.2f} | {t['wire_seconds']:.2f} | "
            f"{t['round_overhead_fraction']:.1%} | {t['overhead_fraction']:.1%} |"
        )
    out += [
        "",
        "Overhead = descriptors of the fleet (computed once, before round 1) + clustering "
        "(strategy set-up) + per round the strategy's aggregation and the wire format (each "
        "distinct model encoded once, every upload encoded, decoded and checked for finite "
        "values, as the coordinator does). *Per-round overhead* leaves out the one-time "
        "descriptors and clustering; *overhead* includes them. Clients train one after another "
        "here, so both fractions compare the server's work with the fleet's summed training time."
        + (" Times and bytes are means over the seeds." if spread else ""),
        "",
        "## Figures",
        "",
        *(
            [
                f"Curves: the mean over the {len(seeds)} seeds, shaded ± one sample standard "
                f"deviation; the cluster map and the predictions are those of seed {seeds[0]}.",
                "",
            ]
            if spread
            else []
        ),
        "![convergence](curves.png)",
        "",
        "![Jeffreys matrix and cluster map](clusters.png)",
        "",
        "![predictions](predictions.png)",
        "",
    ]
    return "\n".join(out)


def _sweep_table(
    title: str,
    header: str,
    labels: Mapping[str, str],
    rows: tuple[str, Mapping[str, Any], Any, bool],
    note: str,
) -> list[str]:
    """A sweep's table (one column per point, ``labels``: its heading), its validation rows
    and ``note``; nothing when the sweep has no point. ``rows``: what
    :func:`_validation_rows` takes (the sweep's key, the sweep, the chosen point, spread)."""
    if not labels:
        return []
    _, sweep, _, spread = rows
    points = list(labels)
    return [
        f"## {title}",
        "",
        f"| {header} | " + " | ".join(labels[p] for p in points) + " |",
        "| --- | " + " | ".join("---:" for _ in points) + " |",
        "| Abs Rel ↓ | " + " | ".join(_cell(sweep[p], "abs_rel", spread) for p in points) + " |",
        "| clusters K | " + " | ".join(_clusters_k(sweep[p]) for p in points) + " |",
        *_validation_rows(*rows),
        "",
        note,
        "",
    ]


def _validation_rows(
    sweep: str, points: Mapping[str, Mapping[str, Any]], chosen: Any, spread: bool
) -> list[str]:
    """A sweep table's validation Abs Rel row and its 'chosen (validation)' mark (none
    without a validation split)."""
    if not any("validation" in v for v in points.values()):
        return []
    picked = chosen.get("point") if isinstance(chosen, dict) and chosen["sweep"] == sweep else None
    return [
        "| validation Abs Rel ↓ | "
        + " | ".join(_cell(v.get("validation") or {}, "abs_rel", spread) for v in points.values())
        + " |",
        "| chosen (validation) | "
        + " | ".join("**chosen**" if p == picked else "" for p in points)
        + " |",
    ]


def _validation(results: Mapping[str, Any], spread: bool) -> list[str]:
    """The validation split's section: every run's validation Abs Rel beside its test Abs Rel,
    and the sweep point chosen on validation (none without a validation split)."""
    rows: list[tuple[str, Mapping[str, Any]]] = list(results["methods"].items())
    rows += [(sweep_name(float(r)), v) for r, v in (results.get("overlap_sweep") or {}).items()]
    rows += [(f"fedepth {p}", v) for p, v in (results.get("rule_sweep") or {}).items()]
    rows = [(k, v) for k, v in rows if "validation" in v]
    if not rows:
        return []
    chosen = results.get("chosen")
    out = [
        "## Validation split: the held-out tails of the clients' own sequences",
        "",
        "Every training client's validation frames (the tail of each of its sequences, held "
        "out of its training and its descriptor; `--validation-share`) scored with the model "
        "it downloads, in the evaluated rounds; the numbers are the mean over clients, "
        "averaged over the last rounds like the test numbers. The sweep point of lowest "
        "validation Abs Rel is the one chosen; the test sequences only score.",
        "",
        "| Run | validation Abs Rel ↓ | test Abs Rel ↓ | |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, v in rows:
        mark = "chosen (validation)" if isinstance(chosen, dict) and chosen["name"] == name else ""
        out.append(
            f"| {name} | {_cell(v['validation'], 'abs_rel', spread)} | "
            f"{_cell(v, 'abs_rel', spread)} | {mark} |"
        )
    out.append("")
    if isinstance(chosen, dict):
        out += [
            f"Chosen (validation): **{chosen['name']}**, validation Abs Rel "
            f"{chosen['validation_abs_rel']:.3f}; its test Abs Rel "
            + (
                f"{chosen['test_abs_rel']:.3f}"
                if isinstance(chosen["test_abs_rel"], (int, float))
                else "-"
            )
            + " is reported, not used to choose.",
            "",
        ]
    return out


def curve_change(
    curve: Sequence[float | None], rounds: int = 5
) -> tuple[float, float, float] | None:
    """First and last value of the last ``rounds`` evaluated points of a curve, and the
    relative change between them (None when fewer than two points were evaluated)."""
    points = [float(v) for v in curve if v is not None][-rounds:]
    if len(points) < 2:
        return None
    return points[0], points[-1], (points[-1] - points[0]) / points[0]


#: Strategy parameters the threshold lines already report (:func:`_thresholds`).
_THRESHOLD_PARAMS = frozenset(
    {"tau", "threshold", "threshold_rule", "overlap", "match", "rules", "merge", "routing"}
)


def _given_params(m: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line naming the strategy parameters a run was given besides the cluster thresholds
    (``fedepth bench --method-param``: FedDyn's alpha, a server optimizer, CL's schedule), so
    the report says what it measured."""
    given = []
    for name, entry in m.items():
        first = next(iter((entry.get("seeds") or {"": entry}).values()))
        params = first.get("params") or entry.get("params") or {}
        shown = {k: v for k, v in params.items() if k not in _THRESHOLD_PARAMS}
        if shown:
            given.append(
                f"{name} " + ", ".join(f"`{k}={json.dumps(v)}`" for k, v in shown.items())
            )
    return [f"Strategy parameters: {'; '.join(given)}.", ""] if given else []


def _thresholds(m: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per clustered method: its threshold (first seed), how it was set (runs recorded
    before ``threshold_rule`` existed say nothing of it), K, and the merge and routing rules
    (FeDepth's and hard clustering's; older runs, all by the paper's rules, name none)."""
    lines = []
    for name, entry in m.items():
        first = next(iter((entry.get("seeds") or {"": entry}).values()))
        params = first.get("params") or {}
        value = params.get("tau", params.get("threshold"))
        if value is None or not first.get("clusters"):
            continue
        unit = "" if "tau" in params else " degrees"
        rule = f" ({params['threshold_rule']})" if "threshold_rule" in params else ""
        k = _clusters_k(entry)
        rules = "".join(f", {key} {params[key]}" for key in ("merge", "routing") if key in params)
        lines.append(f"- {name}: threshold {float(value):.4g}{unit}{rule}, K = {k}{rules}")
    if not lines:
        return []
    return ["Cluster thresholds (the first seed's):", "", *lines, ""]


def _averaged_routes(m: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A table of every test sequence that a method served with the average of several
    cluster models (FeDepth's soft routing), against each of those models alone, per seed:
    whether averaging the candidates helped that sequence, or one of them (the nearest by
    divergence, where it is known) would have served it better."""
    rows = []
    averaged_best = nearest_best = with_scores = 0
    for name, entry in m.items():
        for seed, run in (entry.get("seeds") or {"-": entry}).items():
            for seq, c in (run.get("route_candidates") or {}).items():
                averaged = c["averaged"]["abs_rel"]
                alone = {k: v["abs_rel"] for k, v in c["alone"].items()}
                scores = {k: v["jeffreys"] for k, v in c["alone"].items() if "jeffreys" in v}
                best = min(alone.values())
                averaged_best += averaged <= best
                nearest = "-"
                if len(scores) == len(alone):
                    k_near = min(scores, key=lambda k: scores[k])
                    nearest = f"{k_near}: {alone[k_near]:.3f}"
                    with_scores += 1
                    nearest_best += alone[k_near] == best
                cells = ", ".join(
                    f"{k}: {v:.3f}" + (f" (S {scores[k]:.4g})" if k in scores else "")
                    for k, v in alone.items()
                )
                rows.append(
                    f"| {name} | {seed} | {seq} | {averaged:.3f} | {cells} | {best:.3f} | "
                    f"{nearest} |"
                )
    if not rows:
        return []
    return [
        "## Averaged routes against their clusters alone",
        "",
        "Test sequences served by the average of several cluster models (every cluster whose "
        "mean divergence S to the sequence is within tau), Abs Rel over the averaged rounds: "
        "the averaged model, each candidate cluster's model alone, the best of them, and the "
        "nearest one (lowest S).",
        "",
        "| Method | seed | test sequence | averaged | each cluster alone | best alone | "
        "nearest alone |",
        "| --- | --- | --- | ---: | --- | ---: | ---: |",
        *rows,
        "",
        f"The average was at least as good as its best candidate on {averaged_best} of "
        f"{len(rows)} routes"
        + (
            f"; the nearest candidate was the best one on {nearest_best} of {with_scores}."
            if with_scores
            else "."
        ),
        "",
    ]


def _share(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def _share_spread(values: Sequence[Any]) -> str:
    """Mean ± sample std of the seeds' shares that exist ("-" when none)."""
    known = [float(v) for v in values if isinstance(v, (int, float))]
    if not known:
        return "-"
    std = float(np.std(known, ddof=1)) if len(known) > 1 else 0.0
    return f"{float(np.mean(known)):.2f} ± {std:.2f}"


def _composition(m: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Who is in each cluster of every clustered method: the co-member label shares per seed,
    then, for the first seed, each cluster's members by label and each test sequence's routed
    clusters. Nothing for results recorded without ``composition``."""
    keys = ("platform", "environment", "both")
    runs = {
        name: {
            seed: run["composition"]
            for seed, run in (entry.get("seeds") or {"-": entry}).items()
            if run.get("composition")
        }
        for name, entry in m.items()
    }
    runs = {name: per_seed for name, per_seed in runs.items() if per_seed}
    if not runs:
        return []
    out = [
        "## Cluster composition",
        "",
        "Who is in each cluster, by the platform and environment its members have "
        "(results.json: `methods.<name>.composition`, every seed's under "
        "`seeds.<seed>.composition`). Co-member share: for each client, the share of its "
        "co-members (the other members of any cluster it belongs to) with its platform, its "
        "environment, both; the mean over the clients, those without co-members left out "
        "(*alone*). A label not recorded counts neither way.",
        "",
        "| Method | seed | K | same platform | same environment | both | alone |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, per_seed in runs.items():
        for seed, comp in per_seed.items():
            cm = comp["co_members"]
            out.append(
                f"| {name} | {seed} | {len(comp['clusters'])} | "
                + " | ".join(_share(cm.get(k)) for k in keys)
                + f" | {cm.get('alone', '-')} |"
            )
        if len(per_seed) > 1:
            out.append(
                f"| {name} | mean ± std | - | "
                + " | ".join(
                    _share_spread([c["co_members"].get(k) for c in per_seed.values()])
                    for k in keys
                )
                + " | - |"
            )
    out.append("")
    for name, per_seed in runs.items():
        seed, comp = next(iter(per_seed.items()))
        out += [f"### {name}" + ("" if seed == "-" else f" (seed {seed})"), ""]
        for k, cluster in enumerate(comp["clusters"]):
            members = ", ".join(str(c["name"]) for c in cluster["members"])
            out.append(f"- cluster {k} ({len(cluster['members'])}): {cluster['label']}: {members}")
        out.append("")
        routes = comp.get("routes") or {}
        if routes:
            out += [
                "| Test sequence | its labels | routed to | routed clusters' members | "
                "same platform | same environment |",
                "| --- | --- | --- | --- | ---: | ---: |",
            ]
            for seq, r in routes.items():
                own = "/".join(str(r.get(k) or "?") for k in ("platform", "environment"))
                shares = r.get("shares") or {}
                out.append(
                    f"| {seq} | {own if 'platform' in r else '-'} | "
                    f"{', '.join(map(str, r['clusters']))} | {r['label']} | "
                    f"{_share(shares.get('platform'))} | {_share(shares.get('environment'))} |"
                )
            out.append("")
    return out


def _clusters_k(entry: Mapping[str, Any]) -> str:
    """Table 3b's K: one number, or one per seed where the seeds differ."""
    ks = [len(s["clusters"]) or 1 for s in (entry.get("seeds") or {"": entry}).values()]
    return str(ks[0]) if len(set(ks)) == 1 else " / ".join(map(str, ks))


def _group_row(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Table 3c's cells of one method: Abs Rel (and its spread) per group and overall."""
    row: dict[str, Any] = {}
    for g, vals in entry["groups"].items():
        row[g] = vals["abs_rel"]
        if "abs_rel_std" in vals:
            row[f"{g}_std"] = vals["abs_rel_std"]
    row["all"] = entry["abs_rel"]
    if "abs_rel_std" in entry:
        row["all_std"] = entry["abs_rel_std"]
    return row


def _provenance(results: dict[str, Any]) -> list[str]:
    """Where each seed started: its initial checkpoint's checksum and the machine."""
    seeds = {s: v for s, v in (results.get("seeds") or {}).items() if v.get("weights_sha256")}
    if not seeds:
        return []
    places = {describe_machine(v.get("machine") or {}) for v in seeds.values()} - {""}
    sums = ", ".join(f"seed {s} `{v['weights_sha256'][:12]}`" for s, v in seeds.items())
    where = f", prepared on {' and '.join(sorted(places))}" if places else ""
    return [
        f"Initial checkpoints (SHA-256 of the weights): {sums}{where}. A seed gives the same "
        "numbers on the same machine; a CPU whose kernels round differently pretrains another "
        "checkpoint and gives other numbers (as another draw would).",
        "",
    ]


def format_table(results: dict[str, Any]) -> str:
    """The methods table as fixed-width text for the terminal."""
    rows = [f"{'method':<20}" + "".join(f"{k:>10}" for k in TABLE_METRICS)]
    entries = list(results["methods"].items())
    entries += [(sweep_name(float(r)), v) for r, v in results.get("overlap_sweep", {}).items()]
    entries += [(f"fedepth {p}", v) for p, v in results.get("rule_sweep", {}).items()]
    for name, v in entries:
        rows.append(f"{name:<20}" + "".join(f"{v[k]:>10.3f}" for k in TABLE_METRICS))
    seeds = results.get("seeds") or {}
    if len(seeds) > 1:
        rows.append(f"(means over seeds {', '.join(seeds)}; report.md gives mean ± std)")
    return "\n".join(rows)
