"""Benchmark of the clustering core: Jeffreys matrix + tau calibration + merge, N clients, D = 512.

Descriptors come from a fleet model like the paper's: 12 domains (platform x environment), each
client a noisy draw around its domain, so clusters and overlaps form as they would in a real
fleet. Reports wall time per stage and the peak memory traced by tracemalloc (numpy reports its
allocations there), also in units of one N x N float32 array. Each stage is also given as a
multiple of one (N x 2D)(2D x N) float64 BLAS product timed in the same process (the GEMM the
Jeffreys matrix is built on). Targets: N = 10,000 in under 5 s with memory of a few N x N
float32 arrays; Jeffreys matrix + calibration + merging <= 1.5 x the BLAS product (issue 48).

    python benchmarks/clustering.py [--sizes 100 1000 10000] [--dim 512] [--dtype float32]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from fedepth import clustering


def fleet(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, size=(12, dim))
    domain = rng.integers(0, 12, size=n)
    # a third of the clients sit between two domains (mixed trajectories)
    other = rng.integers(0, 12, size=n)
    mix = np.where(rng.random(n) < 1 / 3, rng.uniform(0.2, 0.8, n), 0.0)[:, None]
    means = (1 - mix) * centres[domain] + mix * centres[other] + rng.normal(0, 0.15, (n, dim))
    variances = 0.05 * np.exp(rng.normal(0.0, 0.3, size=(n, dim)))
    return means, variances


def blas_product(n: int, dim: int, seed: int = 1) -> float:
    """Seconds of one (N x 2D)(2D x N) float64 product, the GEMM inside the Jeffreys matrix,
    its output freshly allocated as the Jeffreys matrix's is."""
    rng = np.random.default_rng(seed)
    left, right = rng.standard_normal((n, 2 * dim)), rng.standard_normal((n, 2 * dim))
    t0 = time.perf_counter()
    product = left @ right.T
    elapsed = time.perf_counter() - t0
    del product
    return elapsed


def run(n: int, dim: int, dtype: str, overlap: float, repeat: int = 1) -> dict[str, float]:
    """Each stage's best time over ``repeat`` interleaved rounds (BLAS product, Jeffreys matrix,
    calibration + merging) in this process; peak memory traced in the first round."""
    means, variances = fleet(n, dim)
    blas, jeffreys, calibrate = [], [], []
    peak = 0
    for k in range(repeat):
        blas.append(blas_product(n, dim))
        if k == 0:
            tracemalloc.start()
        t0 = time.perf_counter()
        A = clustering.jeffreys_matrix(means, variances, dtype=np.dtype(dtype))
        t1 = time.perf_counter()
        result = clustering.calibrate(A, overlap)  # tau search, then the merged map at that tau
        t2 = time.perf_counter()
        if k == 0:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        jeffreys.append(t1 - t0)
        calibrate.append(t2 - t1)
        del A
    b, j, c = min(blas), min(jeffreys), min(calibrate)
    return {
        "N": n,
        "D": dim,
        "dtype": dtype,
        "blas_s": b,
        "jeffreys_s": j,
        "calibrate_s": c,
        "total_s": j + c,
        "jeffreys_x_blas": j / b,
        "calibrate_x_blas": c / b,
        "total_x_blas": (j + c) / b,
        "tau": result.tau,
        "K": result.num_clusters,
        "overlap": result.overlap,
        "peak_mb": peak / 2**20,
        "peak_in_nxn_float32": peak / (4.0 * n * n),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--overlap", type=float, default=0.2)
    parser.add_argument(
        "--repeat", type=int, default=1, help="interleaved rounds; each stage's best is kept"
    )
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = parser.parse_args()
    header = f"{'N':>6} {'dtype':>8} {'BLAS':>8} {'jeffreys':>9} {'calib+merge':>12} "
    header += f"{'total':>8} {'x BLAS':>7} {'K':>5} {'overlap':>8} {'peak MB':>8} {'xNxN f32':>8}"
    if not args.json:
        print(header)
    for n in args.sizes:
        r = run(n, args.dim, args.dtype, args.overlap, args.repeat)
        if args.json:
            print(json.dumps(r))
            continue
        print(
            f"{n:>6} {r['dtype']:>8} {r['blas_s']:>7.3f}s {r['jeffreys_s']:>8.3f}s "
            f"{r['calibrate_s']:>11.3f}s {r['total_s']:>7.3f}s {r['total_x_blas']:>6.2f}x "
            f"{r['K']:>5} {r['overlap']:>8.1%} "
            f"{r['peak_mb']:>8.0f} {r['peak_in_nxn_float32']:>8.1f}"
        )


if __name__ == "__main__":
    main()
