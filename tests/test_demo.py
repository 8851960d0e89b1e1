"""fedepth demo: its configuration and the verdict line it prints."""

from __future__ import annotations

import pytest

from fedepth.bench import (
    DEMO_METHODS,
    DEMO_SPREAD,
    MeasuredSpread,
    demo_config,
    demo_key,
    demo_verdict,
    sim_config,
)
from fedepth_cli.main import main


def _results(fedavg: float, fedepth: float, stds: tuple[float, float], seeds: int) -> dict:
    def entry(v: float, s: float) -> dict:
        return {"abs_rel": v, "abs_rel_std": s}

    return {
        "methods": {"fedavg": entry(fedavg, stds[0]), "fedepth": entry(fedepth, stds[1])},
        "seeds": {str(i): {} for i in range(seeds)},
    }


def test_the_demo_shares_the_small_profiles_data_and_pretraining() -> None:
    demo, small = demo_config(3), sim_config("hpe", "small", seed=3)
    assert demo.pretrain_key() == small.pretrain_key()  # one cached checkpoint for both
    assert demo.image_size == small.image_size and demo.variance_focus == small.variance_focus
    assert demo.rounds < small.rounds and demo.last_rounds <= demo.rounds
    assert DEMO_METHODS == ("fedavg", "fedepth")


def test_the_verdict_states_the_comparison_and_the_spread() -> None:
    line = demo_verdict(_results(0.50, 0.40, (0.02, 0.03), seeds=3))
    assert "FeDepth Abs Rel 0.400 vs FedAvg 0.500, 20% lower" in line
    assert "over seeds 0, 1, 2" in line and "larger than the combined spread (0.050)" in line
    within = demo_verdict(_results(0.50, 0.48, (0.02, 0.03), seeds=3))
    assert "4% lower" in within and "within the combined spread" in within
    worse = demo_verdict(_results(0.40, 0.50, (0.0, 0.0), seeds=1))
    assert "25% higher" in worse and "not measured for this configuration" in worse


def test_a_one_seed_verdict_quotes_the_spread_measured_for_its_configuration() -> None:
    ref = MeasuredSpread("k", (0, 1, 2), fedavg=(0.52, 0.02), fedepth=(0.41, 0.04))
    line = demo_verdict(_results(0.50, 0.40, (0.0, 0.0), seeds=1), ref)
    assert "20% lower (seed 0)" in line
    assert "measured over seeds 0, 1, 2" in line and "FedAvg 0.520 ± 0.020" in line
    assert "larger than the combined spread (0.060)" in line
    close = demo_verdict(_results(0.50, 0.46, (0.0, 0.0), seeds=1), ref)
    assert "within the combined spread (0.060)" in close


def test_the_recorded_spread_was_measured_with_the_current_demo_configuration() -> None:
    # the key covers every setting but the seed, the data generator and pretraining versions
    assert demo_key(demo_config(0)) == demo_key(demo_config(5))
    assert demo_key(demo_config(0)) != demo_key(sim_config("hpe", "small", seed=0))
    assert DEMO_SPREAD is not None, "measure the demo's spread: fedepth demo --seeds 0,1,2"
    assert DEMO_SPREAD.key == demo_key(demo_config()), (
        "demo_config changed since its seed spread was measured: run `fedepth demo --seeds "
        "0,1,2` and record the result in fedepth.bench.DEMO_SPREAD and docs/results.md"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", ""], "--seeds is empty"),
        (["--seeds", "0,x"], "'x' is not an integer"),
        (["--seeds", "1,1"], "1 is given twice"),
        (["--seed", "0", "--seeds", "0,1"], "not both"),
    ],
)
def test_bad_seeds_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
