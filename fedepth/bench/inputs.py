"""The inputs of a seed's runs: the scenario's data and the initial checkpoint, made once.

:func:`ensure_data` generates the scenario into the cache (or takes the given one);
:func:`ensure_weights` pretrains the initial checkpoint into the cache (or takes the user's,
which :func:`check_weights` loads before a long run, to fail fast).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from fedepth.atomic import atomic_path
from fedepth.bench.spec import BenchSpec
from fedepth.data.scenario import Scenario
from fedepth.models import load_weights, save_weights
from fedepth.sim import SimConfig, pretrain

log = logging.getLogger(__name__)


def ensure_data(
    spec: BenchSpec,
    note: Callable[[str], None] = log.info,
    *,
    pretraining_only: bool = False,
) -> Path:
    """The scenario directory: the given one, or generated once into the cache (``note``:
    one line before the generation starts, one when it is done; default: logged at INFO).

    ``pretraining_only``: what pretraining alone needs, the scenario's pretraining split (the
    same frames; a whole scenario already in the cache serves too), generated into its own
    ``-pretrain`` directory so that a benchmark never takes it for the whole scenario."""
    if spec.data_dir is not None:
        return spec.data_dir
    from fedepth.data.synth.generate import GENERATOR_VERSION, synthesize

    whole = (
        spec.cache_dir
        / "data"
        / f"{spec.scenario}-{spec.profile}-s{spec.sim.seed}-g{GENERATOR_VERSION}"
    )
    if pretraining_only and (whole / "manifest.json").is_file():
        return whole
    root = whole.with_name(whole.name + "-pretrain") if pretraining_only else whole
    if not (root / "manifest.json").is_file():
        # every core: the output does not depend on the number of worker processes
        workers = len(os.sched_getaffinity(0))
        what = "the pretraining split of " if pretraining_only else ""
        note(
            f"seed {spec.sim.seed}: generating {what}the {spec.scenario}/{spec.profile} "
            f"scenario into {root} ({workers} processes)"
        )
        t0 = time.perf_counter()
        synthesize(
            spec.scenario,
            spec.profile,
            spec.sim.seed,
            root,
            progress=spec.progress,
            workers=workers,
            pretraining_only=pretraining_only,
        )
        note(f"seed {spec.sim.seed}: generated in {_minutes(t0)}")
    return root


def ensure_weights(
    spec: BenchSpec, scenario: Scenario, note: Callable[[str], None] = log.info
) -> Path:
    """The initial checkpoint: the user's weights, or pretrained once and cached (``note``:
    one line before the pretraining starts, one when it is done; default: logged at INFO)."""
    if spec.weights is not None:
        return spec.weights
    c = spec.sim
    data = _data_tag(spec, scenario)
    name = (
        f"{spec.scenario}-{spec.profile}{data}-{c.model}-{c.image_size[0]}x{c.image_size[1]}"
        f"-{c.pretrain_steps}steps-s{c.seed}-{c.pretrain_key()}.safetensors"
    )
    path = spec.cache_dir / "pretrain" / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        note(
            f"seed {c.seed}: pretraining {c.model} for {c.pretrain_steps} steps on "
            f"{c.pretrain_threads} thread{'s' if c.pretrain_threads > 1 else ''} into {path}"
        )
        t0 = time.perf_counter()
        model = pretrain(scenario, c, progress=spec.progress)
        with atomic_path(path) as tmp:  # two processes pretraining at once: both whole
            save_weights(model, tmp)
        note(f"seed {c.seed}: pretrained in {_minutes(t0)}")
    return path


def _minutes(since: float) -> str:
    return f"{(time.perf_counter() - since) / 60:.1f} min"


def _data_tag(spec: BenchSpec, scenario: Scenario) -> str:
    """What names the pretraining data in a cache entry's name: ``-g<generator version>`` for
    the scenario this project's generator makes for the spec's scenario, profile and seed
    (generated here, or given with ``--data`` and its manifest says so: the same frames, the
    same checkpoint), else ``-d<hash of its manifest>``, so that two different data
    directories of one scenario, profile and seed never share a checkpoint."""
    from fedepth.data.synth.generate import GENERATOR_VERSION

    generated = f"-g{GENERATOR_VERSION}"
    if spec.data_dir is None:
        return generated
    raw = (scenario.root / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    made_here = manifest.get("generator_version") == GENERATOR_VERSION and (
        manifest.get("scenario"),
        manifest.get("profile"),
        manifest.get("seed"),
    ) == (spec.scenario, spec.profile, spec.sim.seed)
    return generated if made_here else f"-d{hashlib.sha256(raw).hexdigest()[:10]}"


def check_weights(config: SimConfig, weights: Path) -> None:
    """Load a user's weights file into the configured model before a long run (fails fast)."""
    load_weights(config.build_model(), weights)
