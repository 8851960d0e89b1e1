"""The ``fedepth`` command: clustering, data, benchmark and fleet tools behind one entry point."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedepth import __version__


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2."""


def _load_descriptors(path: Path) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types for a corrupt archive
        raise CliError(f"{path}: not a readable .npz archive ({exc})") from exc
    with data:
        missing = [k for k in ("means", "variances") if k not in data.files]
        if missing:
            raise CliError(
                f"{path}: missing array(s) {', '.join(missing)} "
                f"(found: {', '.join(data.files) or 'none'})"
            )
        means = np.asarray(data["means"], dtype=np.float64)
        variances = np.asarray(data["variances"], dtype=np.float64)
        names = [str(x) for x in data["names"]] if "names" in data.files else None
    if means.ndim != 2 or variances.ndim != 2 or means.shape != variances.shape:
        raise CliError(
            f"{path}: means {means.shape} and variances {variances.shape} must both "
            "be N x D with the same shape"
        )
    if means.shape[0] == 0 or means.shape[1] == 0:
        raise CliError(f"{path}: empty descriptors (shape {means.shape})")
    if not np.isfinite(means).all():
        raise CliError(f"{path}: means contain NaN or Inf")
    if not np.isfinite(variances).all():
        raise CliError(f"{path}: variances contain NaN or Inf")
    if (variances <= 0).any():
        n_bad = int((variances <= 0).sum())
        raise CliError(f"{path}: {n_bad} variance(s) are zero or negative; variances must be > 0")
    if names is not None and len(names) != means.shape[0]:
        raise CliError(f"{path}: {len(names)} names for {means.shape[0]} clients")
    return means, variances, names


def cmd_cluster(args: argparse.Namespace) -> int:
    from fedepth import clustering

    if args.tau is not None and (not np.isfinite(args.tau) or args.tau < 0):
        raise CliError(f"--tau must be a finite number >= 0, got {args.tau}")
    if args.overlap is not None and not 0.0 <= args.overlap <= 1.0:
        raise CliError(f"--overlap must lie in [0, 1], got {args.overlap}")
    means, variances, names = _load_descriptors(Path(args.descriptors))
    A = clustering.jeffreys_matrix(means, variances)
    result = (
        clustering.soft_clustering(A, args.tau)
        if args.tau is not None
        else clustering.calibrate(A, args.overlap)
    )
    label: Callable[[int], Any] = (lambda i: names[i]) if names else (lambda i: i)
    out = {
        "tau": result.tau,
        "num_clients": int(means.shape[0]),
        "K": result.num_clusters,
        "overlap_ratio": result.overlap,
        "target_overlap": args.overlap,
        "clusters": [[label(i) for i in c] for c in result.clusters()],
        "memberships": {str(label(i)): m for i, m in enumerate(result.memberships())},
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _methods(text: str) -> tuple[str, ...]:
    from fedepth.bench import ALL_METHODS
    from fedepth.strategies import list_strategies

    if text == "all":
        return ALL_METHODS
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in list_strategies()]
    if unknown or not names:
        raise CliError(
            f"unknown method(s) {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(list_strategies())} or 'all'"
        )
    return names


def _sweep(text: str | None) -> tuple[float, ...]:
    from fedepth.bench import SWEEP

    if not text:
        return ()
    if text == "paper":
        return SWEEP
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError as exc:
        raise CliError(
            f"--sweep takes comma-separated ratios in [0, 1] or 'paper': {exc}"
        ) from exc
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise CliError("--sweep ratios must lie in [0, 1]")
    return values


def _seeds(args: argparse.Namespace) -> tuple[int, ...]:
    """The seeds of a benchmark: ``--seeds LIST`` or ``--seed S`` (default 0), not both."""
    if args.seeds is not None and args.seed is not None:
        raise CliError("give --seed S (one seed) or --seeds LIST (several), not both")
    if args.seeds is None:
        seed = 0 if args.seed is None else args.seed
        if seed < 0:
            raise CliError(f"--seed must be >= 0, got {seed}")
        return (seed,)
    parts = [p.strip() for p in args.seeds.split(",")]
    if not any(parts):
        raise CliError("--seeds is empty; give comma-separated integers >= 0, e.g. 0,1,2")
    seeds: list[int] = []
    for part in parts:
        try:
            seed = int(part)
        except ValueError:
            raise CliError(
                f"--seeds {args.seeds}: {part!r} is not an integer (give e.g. 0,1,2)"
            ) from None
        if seed < 0:
            raise CliError(f"--seeds {args.seeds}: {seed} is negative; seeds must be >= 0")
        if seed in seeds:
            raise CliError(f"--seeds {args.seeds}: {seed} is given twice")
        seeds.append(seed)
    return tuple(seeds)


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise CliError(f"--image-size takes HxW, e.g. 48x64, got {text!r}") from exc
    if h % 16 or w % 16 or h <= 0 or w <= 0:
        raise CliError(f"--image-size {text}: both sides must be positive multiples of 16")
    return (h, w)


def _bench_spec(
    args: argparse.Namespace, methods: tuple[str, ...], sweep: tuple[float, ...]
) -> Any:
    from fedepth.bench import BenchSpec, check_weights, sim_config
    from fedepth.models import list_models

    seeds = _seeds(args)
    if args.backbone not in list_models():
        raise CliError(
            f"unknown backbone {args.backbone!r}; choose from {', '.join(list_models())}"
        )
    cfg = sim_config(
        args.scenario,
        args.profile,
        model=args.backbone,
        seed=seeds[0],
        rounds=args.rounds,
        local_steps=args.local_steps,
        round_schedule=args.round_schedule,
        image_size=_size(args.image_size),
        pretrain_steps=args.pretrain_steps,
        pretrain_threads=args.pretrain_threads,
    )
    weights = Path(args.weights) if args.weights else None
    if weights is not None:
        if not weights.is_file():
            raise CliError(f"--weights {weights}: no such file")
        try:
            check_weights(cfg, weights)
        except Exception as exc:
            raise CliError(f"--weights {weights} does not fit {args.backbone}: {exc}") from exc
    data = Path(args.data) if args.data else None
    if data is not None and not (data / "manifest.json").is_file():
        raise CliError(f"--data {data}: no manifest.json (make one with `fedepth data synth`)")
    return BenchSpec(
        scenario=args.scenario,
        profile=args.profile,
        methods=methods,
        out=Path(args.out),
        sim=cfg,
        data_dir=data,
        cache_dir=Path(args.cache),
        weights=weights,
        sweep=sweep,
        executor=args.executor,
        progress=not args.quiet,
        transport=args.transport,
        seeds=seeds,
        fresh=args.fresh,
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from fedepth.bench import OutConflictError, check_out, format_table, run_benchmark

    spec = _bench_spec(args, _methods(args.methods), _sweep(args.sweep))
    if spec.transport == "grpc" and spec.executor != "sequential":
        raise CliError(
            "--transport grpc trains in one process per robot; --executor does not apply"
        )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} exists and is not a directory")
    try:
        if not spec.fresh:
            check_out(spec)  # before any data, pretraining or descriptors
        results = run_benchmark(spec, echo=lambda line: print(line, file=sys.stderr))
    except OutConflictError as exc:
        raise CliError(str(exc)) from None
    print(format_table(results))
    print(f"wrote {spec.out / 'results.json'}, {spec.out / 'report.md'} and figures")
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from fedepth.bench import sim_config
    from fedepth.data.scenario import load_scenario
    from fedepth.models import save_weights
    from fedepth.sim import pretrain

    if not args.data:
        raise CliError("--data DIR is required: the scenario whose pretraining split to use")
    root = Path(args.data)
    if not (root / "manifest.json").is_file():
        raise CliError(f"--data {root}: no manifest.json (make one with `fedepth data synth`)")
    cfg = sim_config(
        args.scenario,
        args.profile,
        model=args.backbone,
        seed=args.seed,
        image_size=_size(args.image_size),
        pretrain_steps=args.steps,
        pretrain_threads=args.threads,
    )
    scenario = load_scenario(root)
    try:
        model = pretrain(scenario, cfg, progress=not args.quiet)
    finally:
        scenario.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(model, out)
    print(f"wrote {out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from fedepth.bench import (
        DEMO_METHODS,
        DEMO_SPREAD,
        BenchSpec,
        OutConflictError,
        check_out,
        demo_config,
        demo_key,
        demo_verdict,
        format_table,
        run_benchmark,
    )

    seeds = _seeds(args)
    out = Path(args.out or "runs/demo")
    spec = BenchSpec(
        scenario="hpe",
        profile="small",
        methods=DEMO_METHODS,
        out=out,
        sim=demo_config(seeds[0]),
        cache_dir=Path(args.cache),
        executor=args.executor,
        seeds=seeds,
    )
    print(
        "fedepth demo: FedAvg vs FeDepth on the synthetic HPE scenario (41 robots, 11 unseen "
        f"test sequences), seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; "
        "data and pretraining are cached, a rerun on the same --out resumes",
        file=sys.stderr,
    )
    try:
        check_out(spec)
        results = run_benchmark(spec, echo=lambda line: print(line, file=sys.stderr))
    except OutConflictError as exc:
        raise CliError(str(exc)) from None
    print(format_table(results))
    measured = DEMO_SPREAD if DEMO_SPREAD and DEMO_SPREAD.key == demo_key(spec.sim) else None
    print(demo_verdict(results, measured))
    print(f"report: {out / 'report.md'} (figures: predictions.png, curves.png, clusters.png)")
    return 0


def cmd_data_synth(args: argparse.Namespace) -> int:
    from fedepth.data.synth.generate import MANIFEST, synthesize

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise CliError(f"--out {out} is not empty; pass --force to write into it anyway")
    if args.seed < 0:
        raise CliError(f"--seed must be >= 0, got {args.seed}")
    if args.workers < 1:
        raise CliError(f"--workers must be >= 1, got {args.workers}")
    path = synthesize(
        args.scenario,
        args.profile,
        args.seed,
        out,
        progress=not args.quiet,
        workers=args.workers,
    )
    sys.stdout.write(f"{path if path.name == MANIFEST else out}\n")
    return 0


def _load_scenario(root: str) -> Any:
    from fedepth.data import DataError, load_scenario

    try:
        return load_scenario(root)
    except DataError as exc:
        raise CliError(str(exc)) from exc


def cmd_data_info(args: argparse.Namespace) -> int:
    from fedepth.data import DataError
    from fedepth.data.summary import depth_stats, stats_table

    if args.frames <= 0:
        raise CliError(f"--frames must be > 0, got {args.frames}")
    sc = _load_scenario(args.dir)
    rows = []
    try:
        for c in sc.clients:
            for s in c.sequences:
                rows.append(("train", c.name, s, depth_stats(s, args.frames)))
        for split, seqs in (("test", sc.test), ("pretrain", sc.pretrain)):
            for s in seqs:
                rows.append((split, "-", s, depth_stats(s, args.frames)))
    except DataError as exc:
        raise CliError(str(exc)) from exc
    finally:
        sc.close()
    sys.stdout.write(
        f"scenario {sc.name or '?'}  profile {sc.profile or '?'}  seed {sc.seed}  "
        f"{len(sc.clients)} clients, {len(sc.test)} test, {len(sc.pretrain)} "
        f"pretrain sequences (depth stats over up to {args.frames} frames each)\n"
    )
    sys.stdout.write(stats_table(rows) + "\n")
    return 0


def cmd_data_preview(args: argparse.Namespace) -> int:
    from fedepth.data import DataError
    from fedepth.data.summary import contact_sheet

    sc = _load_scenario(args.dir)
    items = []
    if args.split in ("train", "all"):
        items += [(c.name, c.sequences[0]) for c in sc.clients]
    for split, seqs in (("test", sc.test), ("pretrain", sc.pretrain)):
        if args.split in (split, "all"):
            items += [(f"{split}: {s.name}", s) for s in seqs]
    if not items:
        raise CliError(f"{args.dir}: no {args.split} sequences to preview")
    try:
        out = contact_sheet(items, args.out, columns=args.columns)
    except DataError as exc:
        raise CliError(str(exc)) from exc
    finally:
        sc.close()
    sys.stdout.write(f"{out}\n")
    return 0


def cmd_bag_info(args: argparse.Namespace) -> int:
    from fedepth.data.bags import BagError, bag_info

    try:
        info = bag_info(Path(args.bag))
    except BagError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        json.dump(info.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    lines = [
        f"bag:       {info.path}",
        f"storage:   {info.storage}",
        f"messages:  {info.message_count}",
        f"duration:  {info.duration_ns / 1e9:.3f} s",
        f"start:     {info.start_ns} ns",
        f"end:       {info.end_ns} ns",
        "topics:",
    ]
    width = max((len(t.name) for t in info.topics), default=0)
    for t in info.topics:
        rate = f"{t.rate_hz:8.2f} Hz" if t.rate_hz is not None else " " * 11
        image = f"  {t.encoding} {t.resolution[0]}x{t.resolution[1]}" if t.resolution else ""
        lines.append(f"  {t.name:<{width}}  {t.count:>8}  {rate}  {t.msgtype}{image}")
    if info.metadata:
        lines.append("metadata:")
        lines += [f"  {k}: {v}" for k, v in sorted(info.metadata.items())]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _add_bag_writer_options(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that writes an RGB-D bag (see ``_write_bag``)."""
    p.add_argument("--out", required=True, metavar="DIR", help="new rosbag2 directory")
    p.add_argument("--storage", choices=["mcap", "sqlite3"], default="mcap")
    p.add_argument("--frame-id", default="camera", help="header frame_id of every message")
    p.add_argument(
        "--depth-encoding",
        choices=["32FC1", "16UC1"],
        default="32FC1",
        help="32FC1 metres with NaN = invalid, or 16UC1 millimetres with 0 = invalid",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _write_bag(
    frames: Any, args: argparse.Namespace, custom_data: dict[str, str] | None = None
) -> int:
    """Write ``frames`` (objects with rgb, depth, K, stamp_ns) to ``args.out``; print a summary.

    The one path from a frame sequence to a bag: ``bag from-sequence`` / ``bag from-m3ed``
    build a ``fedepth.data`` Sequence and call this.
    """
    from fedepth.data.bag_writer import BagWriteError, write_rgbd_bag

    try:
        summary = write_rgbd_bag(
            frames,
            Path(args.out),
            storage=args.storage,
            frame_id=args.frame_id,
            depth_encoding=args.depth_encoding,
            custom_data=custom_data,
            progress=not args.no_progress,
            description=Path(args.out).name,
        )
    except (BagWriteError, ValueError) as exc:
        raise CliError(str(exc)) from None
    span = (summary.end_ns - summary.start_ns) / 1e9
    sys.stdout.write(
        f"wrote {summary.frames} frames ({span:.3f} s) to {summary.path} ({summary.storage})\n"
    )
    return 0


def cmd_bag_test_scene(args: argparse.Namespace) -> int:
    from fedepth.data.bag_writer import synthetic_frames

    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
        frames = synthetic_frames(
            args.frames, width=width, height=height, rate_hz=args.rate, seed=args.seed
        )
    except ValueError as exc:
        raise CliError(f"--size WxH, --frames, --rate: {exc}") from None
    return _write_bag(frames, args, {"fedepth.source": "test-scene"})


class _Stamped:
    """The frames of a sequence with strictly increasing stamps, read lazily.

    Readers without timestamps (NYUv2's labeled set numbers its images) or whose first stamps do
    not increase get ``index x period`` instead, so the bag replays at ``rate_hz``.
    """

    def __init__(self, seq: Any, rate_hz: float) -> None:
        if not rate_hz > 0:
            raise CliError(f"--rate must be > 0 Hz, got {rate_hz}")
        if len(seq) == 0:
            raise CliError(f"sequence {seq.name!r} has no frames")
        self.seq = seq
        self.period_ns = round(1e9 / rate_hz)
        self.synthetic = seq.meta.source == "nyu" or (
            len(seq) > 1 and seq[1].stamp_ns <= seq[0].stamp_ns
        )

    def __len__(self) -> int:
        return len(self.seq)

    def __iter__(self) -> Any:
        for i, frame in enumerate(self.seq):
            yield (
                dataclasses.replace(frame, stamp_ns=i * self.period_ns)
                if self.synthetic
                else frame
            )


def _write_sequence(seq: Any, args: argparse.Namespace, source: dict[str, str]) -> int:
    from fedepth.data import DataError

    try:
        with seq:
            frames = _Stamped(seq, args.rate)
            meta = seq.meta
            custom = {
                **source,
                "fedepth.sequence": seq.name,
                "fedepth.platform": meta.platform,
                "fedepth.environment": meta.environment,
                "fedepth.split": meta.split,
                "fedepth.min_depth": f"{meta.min_depth:g}",
                "fedepth.max_depth": f"{meta.max_depth:g}",
                "fedepth.synthetic_stamps": str(frames.synthetic).lower(),
            }
            return _write_bag(frames, args, custom)
    except DataError as exc:
        raise CliError(str(exc)) from None


def _m3ed_split(data: Path, given: str | None) -> str:
    """``--split``, else the split a scenario manifest next to the file gives the sequence,
    else ``train`` (with a note saying so)."""
    if given:
        return given
    name = data.name.removesuffix(".h5").removesuffix("_data")
    manifest = data.parent / "manifest.json"
    if manifest.is_file():
        try:
            entries = json.loads(manifest.read_text(encoding="utf-8")).get("sequences", [])
        except (OSError, ValueError, AttributeError):
            entries = []
        for entry in entries:
            if isinstance(entry, dict) and entry.get("name") == name and entry.get("split"):
                return str(entry["split"])
    print(
        f"fedepth bag from-m3ed: split of {name!r} unknown (no manifest entry): recorded as "
        "train; pass --split test for a test sequence",
        file=sys.stderr,
    )
    return "train"


def cmd_bag_from_m3ed(args: argparse.Namespace) -> int:
    from fedepth.data import DataError, M3EDSequence

    try:
        split = _m3ed_split(Path(args.data), args.split)
        seq = M3EDSequence(args.data, args.depth_gt, split=split)
    except (DataError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return _write_sequence(seq, args, {"fedepth.source": "m3ed"})


def cmd_bag_from_sequence(args: argparse.Namespace) -> int:
    from fedepth.data import DataError
    from fedepth.data.scenario import MANIFEST, open_sequence, read_manifest

    root = Path(args.scenario_dir)
    try:
        manifest = read_manifest(root)
        entries = {e.get("name"): e for e in manifest["sequences"]}
        if args.sequence not in entries:
            known = ", ".join(sorted(str(n) for n in entries))
            raise CliError(f"{root / MANIFEST}: no sequence {args.sequence!r} (known: {known})")
        seq = open_sequence(root, entries[args.sequence], root / MANIFEST)
    except (DataError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return _write_sequence(seq, args, {"fedepth.source": seq.meta.source})


def cmd_fleet_status(args: argparse.Namespace) -> int:
    """Print the coordinator's fleet table and cluster map (gRPC is imported only here)."""
    from fedepth_coordinator.client import (
        ClientTls,
        CoordinatorCallError,
        CoordinatorClient,
        open_channel,
    )
    from fedepth_coordinator.report import format_fleet

    token = os.environ.get("FEDEPTH_COORDINATOR_TOKEN")
    if args.token_file:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"--token-file: {exc}") from exc
    if not token:
        raise CliError(
            "no token: pass --token-file FILE or set FEDEPTH_COORDINATOR_TOKEN (create one with "
            "`fedepth-coordinator --add-robot ID --role operator`)"
        )
    tls = None
    if args.ca_file or args.cert_file:
        tls = ClientTls(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)
    client = CoordinatorClient(
        open_channel(args.coordinator, tls=tls), args.principal, token, timeout_s=args.timeout
    )
    with client:
        try:
            status, clusters = client.fleet_status(), client.cluster_map()
        except CoordinatorCallError as exc:
            raise CliError(f"{args.coordinator}: {exc.status}: {exc.details}") from exc
    if args.json:
        out = {"fleet": dataclasses.asdict(status), "clusters": dataclasses.asdict(clusters)}
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_fleet(status, clusters) + "\n")
    return 0


def _add_fleet_parser(sub: Any) -> None:
    """`fedepth fleet ...`: tools that talk to a running coordinator."""
    fleet = sub.add_parser("fleet", help="inspect a running coordinator")
    fsub = fleet.add_subparsers(dest="fleet_command", metavar="FLEET_COMMAND", required=True)
    p = fsub.add_parser(
        "status",
        help="print the fleet table and the cluster map",
        description="Ask a coordinator for its fleet status and cluster map and print them. "
        "Credentials: --principal and --token-file (or FEDEPTH_COORDINATOR_TOKEN).",
    )
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT")
    p.add_argument(
        "--principal",
        default=os.environ.get("FEDEPTH_COORDINATOR_PRINCIPAL", "ops"),
        help="id to authenticate as (default: $FEDEPTH_COORDINATOR_PRINCIPAL or 'ops')",
    )
    p.add_argument("--token-file", help="file holding the principal's token")
    p.add_argument("--ca-file", help="PEM CA of the coordinator's certificate (TLS)")
    p.add_argument("--cert-file", help="PEM client certificate (mutual TLS)")
    p.add_argument("--key-file", help="PEM client key (mutual TLS)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=cmd_fleet_status)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedepth",
        description="Federated monocular depth estimation for heterogeneous robot fleets.",
    )
    parser.add_argument("--version", action="version", version=f"fedepth {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "cluster",
        help="soft-cluster clients from their descriptors (Jeffreys divergence + merging)",
        description="Cluster clients from an .npz holding `means` and `variances` (N x D) and "
        "optionally `names` (N). Prints JSON: tau, K, overlap ratio, clusters, memberships.",
    )
    p.add_argument("--descriptors", required=True, metavar="F.npz", help="descriptor archive")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tau", type=float, help="clustering threshold on the Jeffreys divergence")
    g.add_argument(
        "--overlap",
        type=float,
        help="target overlap ratio in [0, 1]; tau is calibrated to reach it",
    )
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser(
        "data",
        help="robot RGB-D data: synthesise scenarios, inspect them",
        description="Synthesise the HPE (M3ED-like) and BMR (NYUv2 + KITTI-like) scenarios in "
        "the real datasets' formats, print their depth statistics, or draw a preview sheet.",
    )
    dsub = p.add_subparsers(dest="data_command", metavar="DATA_COMMAND", required=True)
    q = dsub.add_parser(
        "synth",
        help="generate a scenario (M3ED h5 pairs, NYUv2 .mat, KITTI tree) plus its manifest",
        description="Render a scenario with the procedural engine and write it in the real "
        "datasets' formats with DIR/manifest.json. The same seed gives the same data.",
    )
    q.add_argument(
        "--scenario",
        required=True,
        choices=("hpe", "bmr"),
        help="hpe: 41 M3ED-like clients + 11 test sequences; bmr: 15 NYUv2-like and "
        "17 KITTI-like clients + test splits (both with a pretraining split)",
    )
    q.add_argument(
        "--profile",
        default="smoke",
        choices=("smoke", "small", "paper"),
        help="smoke: seconds (CI); small: all clients at ~1/10 size (CPU, minutes); "
        "paper: full counts and sizes (hours)",
    )
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--out", required=True, metavar="DIR", help="output directory")
    q.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    q.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes rendering places and drives in parallel (same data for any number)",
    )
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=cmd_data_synth)
    q = dsub.add_parser(
        "info",
        help="table of a scenario's clients and depth statistics",
        description="Per sequence: split, client, platform, environment, "
        "frames, size, valid-depth share and depth median / p95 / max.",
    )
    q.add_argument("dir", metavar="DIR", help="scenario directory (holds manifest.json)")
    q.add_argument(
        "--frames",
        type=int,
        default=16,
        help="frames sampled per sequence for the statistics (default 16)",
    )
    q.set_defaults(func=cmd_data_info)
    q = dsub.add_parser(
        "preview",
        help="a PNG sheet of RGB and colour-mapped depth per client",
        description="One middle frame per client (and test / pretraining "
        "sequence): RGB beside its depth on a log colour scale.",
    )
    q.add_argument("dir", metavar="DIR", help="scenario directory (holds manifest.json)")
    q.add_argument("--out", required=True, metavar="sheet.png")
    q.add_argument("--split", default="all", choices=("train", "test", "pretrain", "all"))
    q.add_argument("--columns", type=int, default=4, help="sequences per row")
    q.set_defaults(func=cmd_data_preview)

    def bench_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--scenario", required=True, choices=("hpe", "bmr"))
        q.add_argument(
            "--profile",
            default="small",
            choices=("smoke", "small", "paper"),
            help="data and run size (default: small)",
        )
        q.add_argument(
            "--backbone",
            default="newcrfs-lite",
            help="model name (default: newcrfs-lite; see docs/models.md)",
        )
        q.add_argument(
            "--seed",
            type=int,
            help="seed of the scenario, the pretraining and the training (default 0)",
        )
        q.add_argument(
            "--data",
            metavar="DIR",
            help="scenario directory (default: generated once into the cache)",
        )
        q.add_argument(
            "--cache",
            default=".cache/fedepth",
            metavar="DIR",
            help="where generated data and pretrained weights are kept",
        )
        q.add_argument("--image-size", metavar="HxW", help="training/eval resolution")
        q.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser(
        "bench",
        help="run FL methods on a scenario: results.json, report.md and figures",
        description="Generate (or reuse) the scenario, pretrain the initial model (or use "
        "--weights), then run each method and write DIR/results.json, DIR/report.md with the "
        "paper's tables, and PNG figures. With --seeds, every seed does all of it anew and "
        "the results are the mean and standard deviation over the seeds. "
        "Resuming: the same command on the same --out continues where it stopped. Finished "
        "(method, seed) runs are kept in DIR/state and loaded instead of run again; an "
        "interrupted method continues from its last finished round (a checkpoint is written "
        "after every round; with --transport grpc it restarts from round 0, finished runs "
        "are still skipped). Adding methods, sweep points or seeds to an existing --out runs "
        "only the missing ones; an --out holding a run with other settings (rounds, steps, "
        "backbone, image size, scenario, profile, transport, --data, --weights, ...) is "
        "refused: use another --out, or --fresh.",
    )
    bench_args(p)
    p.add_argument(
        "--seeds",
        metavar="LIST",
        help="comma-separated seeds, e.g. 0,1,2 (integers >= 0, no repeats; not with --seed): "
        "each generates its own scenario (with --data: the given one), pretrains its own "
        "initial model (with --weights: the given one) and trains every method; results.json "
        "gives each metric's mean over the seeds, its sample standard deviation as "
        "<metric>_std and every seed's numbers under seeds",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: delete what an earlier run left in --out (state/, results, report, "
        "figures, grpc/ logs) instead of resuming it",
    )
    p.add_argument(
        "--methods",
        default="fedavg,pacfl,fedepth",
        help="comma-separated method names or 'all' (default: fedavg,pacfl,fedepth)",
    )
    p.add_argument("--sweep", help="FeDepth overlap ratios to sweep, e.g. 0,0.2,1 or 'paper'")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--weights", help="initial weights (safetensors) instead of pretraining")
    p.add_argument("--rounds", type=int, help="communication rounds")
    p.add_argument("--local-steps", type=int, help="local steps per round")
    p.add_argument(
        "--round-schedule",
        choices=("constant", "cosine"),  # fedepth.recipe.ROUND_SCHEDULES (torch-free here)
        help="learning rate across rounds: constant (default) or cosine (to 0.1 x lr in the "
        "last round)",
    )
    p.add_argument("--pretrain-steps", type=int, help="steps of the cached pretraining")
    p.add_argument(
        "--pretrain-threads",
        type=_positive_int,
        help="torch threads of the pretraining (default 2; the checkpoint depends on it, so "
        "another count is cached under its own name)",
    )
    p.add_argument(
        "--executor",
        default="sequential",
        choices=("sequential", "ray"),
        help="where client training runs (ray: local or existing Ray cluster)",
    )
    p.add_argument(
        "--transport",
        default="inprocess",
        choices=("inprocess", "grpc"),
        help="inprocess (default): the strategy and clients in this process; grpc: each "
        "method through a real fedepth-coordinator subprocess and one process per robot on "
        "loopback (same seed, same weights; slower; CL stays in-process; an interrupted "
        "method restarts from round 0). Logs in DIR/grpc (DIR/grpc/seed<S> with --seeds)",
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "pretrain",
        help="train the initial checkpoint on a scenario's pretraining split",
        description="Train the chosen backbone on the pretraining split (sequences no client "
        "holds) and save it as safetensors; the benchmark starts every method from it.",
    )
    bench_args(p)
    p.add_argument("--steps", type=int, help="training steps (default: the profile's)")
    p.add_argument(
        "--threads",
        type=_positive_int,
        help="torch threads (default 2; the checkpoint depends on the count)",
    )
    p.add_argument("--out", required=True, metavar="weights.safetensors")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser(
        "demo",
        help="the embedded default job: FedAvg vs FeDepth on the HPE scenario",
        description="FedAvg and FeDepth on the synthetic HPE scenario (small profile data, a "
        "shorter federation than `fedepth bench --profile small`), client training on every "
        "core (Ray); prints the table and a verdict of FeDepth vs FedAvg with the seed spread "
        "(this run's with several seeds, else the one measured for this configuration). About "
        "16 minutes the first time on a 2-core CPU, 9 once the data and the pretrained model "
        "are cached.",
    )
    p.add_argument("--seed", type=int, default=None, help="one seed (default 0)")
    p.add_argument(
        "--seeds", default=None, metavar="LIST", help="several seeds, e.g. 0,1,2 (the spread)"
    )
    p.add_argument("--out", help="output directory (default: runs/demo)")
    p.add_argument("--cache", default=".cache/fedepth", metavar="DIR")
    p.add_argument(
        "--executor",
        choices=("ray", "sequential"),
        default="ray",
        help="ray (default): clients on every core; sequential: one after another",
    )
    p.set_defaults(func=cmd_demo)

    bag = sub.add_parser(
        "bag",
        help="rosbag2 tools: inspect bags, write RGB-D sequences as bags",
        description="rosbag2 (mcap or sqlite3) tools. Written bags hold /image (rgb8), "
        "/depth (32FC1 metres, NaN = invalid; or 16UC1 mm, 0 = invalid) and /camera_info, "
        "replayed on robots by the bag_player node.",
    )
    bag_sub = bag.add_subparsers(dest="bag_command", metavar="BAG_COMMAND", required=True)
    p = bag_sub.add_parser("info", help="topics, types, counts and duration of a bag")
    p.add_argument("bag", help="rosbag2 directory or single .mcap / .db3 file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_bag_info)
    p = bag_sub.add_parser(
        "test-scene",
        help="write a small moving RGB-D test scene as a bag (smoke tests of the ROS side)",
    )
    _add_bag_writer_options(p)
    p.add_argument("--frames", type=int, default=50)
    p.add_argument("--size", default="64x48", metavar="WxH")
    p.add_argument("--rate", type=float, default=10.0, help="frame rate in Hz")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_bag_test_scene)
    p = bag_sub.add_parser(
        "from-m3ed",
        help="write an M3ED sequence (RGB + depth reprojected into the RGB camera) as a bag",
    )
    p.add_argument("--data", required=True, metavar="X_data.h5", help="M3ED data file")
    p.add_argument(
        "--depth-gt", required=True, metavar="X_depth_gt.h5", help="M3ED depth ground truth"
    )
    p.add_argument(
        "--split",
        choices=("train", "test", "pretrain"),
        help="the sequence's split, recorded as fedepth.split (default: from a manifest.json "
        "next to --data, else train)",
    )
    _add_bag_writer_options(p)
    p.add_argument(
        "--rate", type=float, default=10.0, help="Hz of synthesised stamps (sequences without)"
    )
    p.set_defaults(func=cmd_bag_from_m3ed)
    p = bag_sub.add_parser(
        "from-sequence",
        help="write any sequence of a scenario manifest (M3ED, NYUv2, KITTI) as a bag",
    )
    p.add_argument("--scenario-dir", required=True, metavar="DIR", help="holds manifest.json")
    p.add_argument("--sequence", required=True, metavar="NAME", help="sequence name")
    _add_bag_writer_options(p)
    p.add_argument(
        "--rate", type=float, default=10.0, help="Hz of synthesised stamps (NYUv2 has none)"
    )
    p.set_defaults(func=cmd_bag_from_sequence)
    _add_fleet_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"fedepth {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
