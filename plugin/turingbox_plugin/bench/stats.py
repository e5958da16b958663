"""The benchmark maths, pure and tested on recorded data."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


def mean(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("mean of an empty sample")
    return sum(xs) / len(xs)


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of an empty sample")
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear' method), p in [0, 100]."""
    if not xs:
        raise ValueError("percentile of an empty sample")
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile {p} is outside 0..100")
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    rank = (len(s) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


@dataclass(frozen=True)
class LinearFit:
    slope: float       # seconds per token
    intercept: float   # seconds
    r2: float

    @property
    def overhead_s(self) -> float:
        return self.intercept

    @property
    def prefill_tokens_per_s(self) -> float:
        return math.inf if self.slope <= 0 else 1.0 / self.slope


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> LinearFit:
    """Ordinary least squares y = intercept + slope * x, with the coefficient of determination."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values")
    if len(xs) < 2:
        raise ValueError("a line needs at least two points")
    mx, my = mean(xs), mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("all x values are equal; no line can be fitted")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(slope=slope, intercept=intercept, r2=r2)


def fit_ttft(points: Sequence[tuple[int, float]]) -> LinearFit:
    """TTFT = overhead + tokens / prefill_speed, fitted on (prompt_tokens, ttft_seconds) points."""
    return least_squares([float(t) for t, _ in points], [float(s) for _, s in points])


def decode_summary(runs: Sequence[dict]) -> dict:
    """Mean and median of per-request tok/s and seconds (runs carry completion_tokens, seconds)."""
    if not runs:
        raise ValueError("no decode runs to summarise")
    tps = [r["completion_tokens"] / r["seconds"] for r in runs if r["seconds"] > 0]
    secs = [r["seconds"] for r in runs]
    return {
        "requests": len(runs),
        "tok_per_s_mean": mean(tps) if tps else 0.0,
        "tok_per_s_median": median(tps) if tps else 0.0,
        "seconds_mean": mean(secs),
        "seconds_median": median(secs),
        "completion_tokens_mean": mean([r["completion_tokens"] for r in runs]),
    }
