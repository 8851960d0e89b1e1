"""The benchmark: every method on one scenario, written as results.json + report.md + pictures.

``run_benchmark`` prepares, for every seed, the scenario (generated once and cached), the initial
checkpoint (pretrained once on the scenario's pretraining split and cached, or a user's weights
file), the fleet's descriptors, then runs each method through :class:`fedepth.sim.Simulation`
and writes:

- ``results.json``: ``methods.<name>.{abs_rel, sq_rel, rmse, rmse_log, d1, d2, d3}`` (mean over
  the last rounds, then over the seeds) with ``<metric>_std`` (sample standard deviation over
  the seeds) and every seed's numbers under ``seeds``, plus per-group numbers, per-round
  curves, bytes per round, timing, the overlap sweep and, for every clustered run, its
  cluster ``composition`` (members with their labels, co-member label shares, the routed
  test sequences; :mod:`~fedepth.bench.composition`); ``config.json``: the resolved
  configuration;
- ``report.md``: tables laid out like the paper's (Table 1/2, 3a, 3b, 3c), the clusters'
  composition and the figures;
- ``curves.png``, ``clusters.png`` (Jeffreys matrix and FeDepth's cluster map, each cluster
  labelled by its composition),
  ``predictions.png`` (RGB / ground truth / prediction per test sequence and method);
- ``state/seed<S>/``: every finished run and the checkpoint of the running one, so that the
  same benchmark on the same output continues where it stopped (see :func:`state_dir`).

The package's modules, one job each (everything public is importable from ``fedepth.bench``):
:mod:`~fedepth.bench.spec` (what to run, each profile's sizes), :mod:`~fedepth.bench.inputs`
(the cached data and initial checkpoint), :mod:`~fedepth.bench.outdir` (the output directory,
its recorded settings and the resume check), :mod:`~fedepth.bench.runner` (the runs of every
seed), :mod:`~fedepth.bench.combine` (results over seeds), :mod:`~fedepth.bench.composition` (who
is in each cluster), :mod:`~fedepth.bench.report` (the tables), :mod:`~fedepth.bench.figures`
(the pictures), :mod:`~fedepth.bench.fleet_summary` (what those need of a seed's fleet),
:mod:`~fedepth.bench.demo` (``fedepth demo``).
"""

from fedepth.bench.combine import beyond_spread, combine_seeds
from fedepth.bench.composition import run_composition, with_composition
from fedepth.bench.demo import (
    DEMO_METHODS,
    DEMO_SPREAD,
    MeasuredSpread,
    demo_config,
    demo_key,
    demo_verdict,
)
from fedepth.bench.figures import write_figures
from fedepth.bench.fleet_summary import FleetSummary
from fedepth.bench.inputs import check_weights, ensure_data, ensure_weights
from fedepth.bench.outdir import (
    ADDED_SETTINGS,
    OUTPUTS,
    OutConflictError,
    check_out,
    clear_out,
    run_config,
    state_dir,
)
from fedepth.bench.report import MARK, curve_change, format_table, render_report
from fedepth.bench.runner import is_pooled, round_line, run_benchmark
from fedepth.bench.spec import (
    ALL_METHODS,
    SCENARIO_SIM_SIZES,
    SIM_SIZES,
    SWEEP,
    BenchSpec,
    scenario_defaults,
    sim_config,
    sweep_name,
)

__all__ = [
    "ADDED_SETTINGS",
    "ALL_METHODS",
    "DEMO_METHODS",
    "DEMO_SPREAD",
    "MARK",
    "OUTPUTS",
    "SCENARIO_SIM_SIZES",
    "SIM_SIZES",
    "SWEEP",
    "BenchSpec",
    "FleetSummary",
    "MeasuredSpread",
    "OutConflictError",
    "beyond_spread",
    "check_out",
    "check_weights",
    "clear_out",
    "combine_seeds",
    "curve_change",
    "demo_config",
    "demo_key",
    "demo_verdict",
    "ensure_data",
    "ensure_weights",
    "format_table",
    "is_pooled",
    "render_report",
    "round_line",
    "run_benchmark",
    "run_composition",
    "run_config",
    "scenario_defaults",
    "sim_config",
    "state_dir",
    "sweep_name",
    "with_composition",
    "write_figures",
]
