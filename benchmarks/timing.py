"""Side-by-side timing: candidates interleaved round by round, medians compared.

The machine is shared and noisy, so no absolute number is trusted alone: every
round times each candidate once, in turn, and the ratios are taken between
medians measured in the same run.
"""

import statistics
import time


def time_side_by_side(candidates: dict, rounds: int = 15, calls: int = 5, warmup: int = 2):
    """Median and p90 milliseconds per call of each zero-argument callable."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) * 1000 / calls)
    return {
        name: {
            "median_ms": statistics.median(values),
            "p90_ms": sorted(values)[int(0.9 * (len(values) - 1))],
        }
        for name, values in samples.items()
    }
