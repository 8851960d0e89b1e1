"""A benchmark's output directory: what it writes there and whether a run there may resume.

:data:`OUTPUTS` (what ``--fresh`` removes, :func:`clear_out`), the per-seed state
(:func:`state_dir`), the settings recorded as config.json (:func:`run_config`) and the check
that a run found there has the same ones (:func:`check_out`; settings added since, at their
neutral value, :data:`ADDED_SETTINGS`, do not count).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedepth.bench.fleet_summary import file_sha256, weights_sha256
from fedepth.bench.spec import BenchSpec
from fedepth.sim import config_dict


class OutConflictError(ValueError):
    """The output directory holds a run of other settings (or one that cannot be read)."""


#: What ``fedepth bench`` writes into its ``--out`` (what ``--fresh`` removes).
OUTPUTS = (
    "state",
    "grpc",
    "results.json",
    "config.json",
    "report.md",
    "curves.png",
    "clusters.png",
    "predictions.png",
)


def clear_out(out: Path) -> None:
    """Remove what an earlier benchmark wrote into ``out`` (other files stay)."""
    for name in OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def state_dir(out: Path, seed: int) -> Path:
    """Where one seed's runs are kept: ``<key>/summary.json`` + ``samples.safetensors`` once a
    run finished, ``<key>/checkpoint/`` while it runs (key: the method name, or
    ``sweep-<ratio>`` for a point of the overlap sweep), ``fleet.json`` + ``fleet.safetensors``
    for the report (clients, test sequences, descriptors)."""
    return out / "state" / f"seed{seed}"


def run_config(spec: BenchSpec) -> dict[str, Any]:
    """The resolved configuration saved as config.json (``sim.seed``: the first seed)."""
    return {
        "sim": config_dict(replace(spec.sim, seed=spec.seed_list[0])),
        "scenario": spec.scenario,
        "profile": spec.profile,
        "methods": list(spec.methods),
        "sweep": list(spec.sweep),
        "seeds": list(spec.seed_list),
        "executor": spec.executor,
        "transport": spec.transport,
        "inputs": {
            "data": None if spec.data_dir is None else str(spec.data_dir.resolve()),
            "weights": None if spec.weights is None else str(spec.weights.resolve()),
            "weights_sha256": None if spec.weights is None else weights_sha256(spec.weights),
        },
    }


#: SimConfig settings added after runs were recorded, with the value that does what the code
#: did before them: at that value they leave :func:`demo_key` as it was, and a run recorded
#: without them resumes (:func:`check_out`).
ADDED_SETTINGS: dict[str, Any] = {
    "round_schedule": "constant",
    "round_final_lr_fraction": 0.1,
    "max_update_norm": None,
    "max_group_norms": {},
    "descriptor_layers": "deepest",
    "encoder_init": "random",
    "descriptor_encoder": "model",
    "validation_share": 0.0,
}


def _as_before(key: str, value: Any) -> bool:
    """Whether ``key`` is a setting added since runs were recorded, at its neutral value."""
    return key in ADDED_SETTINGS and ADDED_SETTINGS[key] == value


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a saved configuration that must match to resume it: everything that
    changes a run's numbers (not: methods, sweep points and seeds, which may grow, nor the
    executor, whose results are identical)."""
    out = {("backbone" if k == "model" else k): v for k, v in config["sim"].items()}
    out.pop("seed", None)
    out.update({k: config.get(k) for k in ("scenario", "profile", "transport")})
    out.update(config.get("inputs", {}))
    return out


def _show(key: str, value: Any) -> str:
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def check_out(spec: BenchSpec) -> None:
    """Raise :class:`OutConflictError` when ``spec.out`` holds a run whose settings differ."""
    path = spec.out / "config.json"
    if not path.is_file():
        if (spec.out / "state").exists():
            raise OutConflictError(
                f"{spec.out} holds runs in state/ but no config.json to check them against; "
                "use another --out, or --fresh to start over"
            )
        return
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        # a setting added since that run was written did then what its before-value does now
        saved = {**ADDED_SETTINGS, **_settings(config)}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OutConflictError(
            f"{spec.out} holds a config.json that cannot be read ({exc}); "
            "use another --out, or --fresh to start over"
        ) from exc
    current = json.loads(json.dumps(run_config(spec)))  # as it would read back from disk
    wanted = _settings(current)
    if "inputs" not in config:  # written before runs could resume: no inputs recorded
        wanted = {k: v for k, v in wanted.items() if k not in current["inputs"]}
    # a setting added since that run was written, at the value that does what the code did
    # before it, is what the run did: the same run
    wanted = {k: v for k, v in wanted.items() if k in saved or not _as_before(k, v)}
    if spec.weights is not None and saved.get("weights_sha256") == file_sha256(spec.weights):
        wanted["weights_sha256"] = saved["weights_sha256"]  # recorded as the file's bytes
    unset = object()
    keys = [
        k for k in dict.fromkeys([*wanted, *saved]) if saved.get(k, unset) != wanted.get(k, unset)
    ]
    if keys:
        then = ", ".join(_show(k, saved.get(k, "(unset)")) for k in keys)
        now = ", ".join(_show(k, wanted.get(k, "(unset)")) for k in keys)
        raise OutConflictError(
            f"{spec.out} holds a run with {then}; this command has {now}; "
            "use another --out, or --fresh to start over"
        )
