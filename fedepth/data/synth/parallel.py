"""Render tasks in worker processes: results in task order, the same data for any number.

The pool uses the ``spawn`` start method, so a task's function is pickled by its module path:
pass functions defined at the top level of an importable module.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from tqdm import tqdm


def _call(job: tuple[int, Callable[[Any], Any], Any]) -> tuple[int, Any]:
    k, fn, task = job
    return k, fn(task)


def run_tasks(
    fn: Callable[..., Any], tasks: list[Any], weights: list[int], workers: int, progress: tqdm
) -> list[Any]:
    """``[fn(t) for t in tasks]``, in ``workers`` processes when > 1 (results in task order;
    every task seeds its own generators, so the output does not depend on ``workers``)."""
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t, progress) for t in tasks]
    results: list[Any] = [None] * len(tasks)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(workers, len(tasks))) as pool:
        jobs = [(k, fn, t) for k, t in enumerate(tasks)]
        for k, res in pool.imap_unordered(_call, jobs):
            results[k] = res
            progress.update(weights[k])
    return results
