"""The Flower ServerApp of fedepth: ``app``, the benchmark run through Flower.

It reads the run config (:mod:`fedepth_flower.settings`: scenario, profile, methods, seed,
paths, federation settings), then runs :func:`fedepth.bench.run_benchmark` with the Flower
transport (:class:`fedepth_flower.runner.FlowerTransport`): the same data preparation, initial
checkpoint, evaluation and writers as ``fedepth bench`` (``results.json``, ``report.md``, the
figures, resumable state in ``out``), with every method's clients being Flower nodes that run
:mod:`fedepth_flower.client_app`. A bad run config stops the run before anything runs, with
one error naming the key.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedepth.bench import format_table, run_benchmark
from fedepth_flower.runner import FlowerTransport
from fedepth_flower.settings import RunConfigError, settings_from_run_config
from fedepth_flower.strategy import log

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the benchmark the run config describes on this Grid's nodes."""
    try:
        settings = settings_from_run_config(context.run_config)
    except RunConfigError as exc:
        log.error("run config: %s", exc)
        raise
    spec = settings.spec
    log.info(
        "fedepth: %s on %s/%s, seed %d, into %s",
        ",".join(spec.methods),
        spec.scenario,
        spec.profile,
        spec.sim.seed,
        spec.out,
    )
    results = run_benchmark(spec, echo=log.info, transport=FlowerTransport(grid, settings))
    for line in format_table(results).splitlines():
        log.info("%s", line)
    log.info("wrote %s, %s and figures", spec.out / "results.json", spec.out / "report.md")
