"""Named length presets: realistic prompt/output lengths without the trace files.

Each preset is a pair of independent clipped lognormals (see ``lengths.lognormal_lengths``) fitted
to a public trace by :func:`fit_lognormal`:

- ``median`` = the trace's median length (clipping leaves the median unchanged);
- ``min``/``max`` = the trace's observed minimum and maximum;
- ``sigma`` solved so that the mean of the *clipped* lognormal equals the trace's mean.

So a preset reproduces the trace's median, mean and range exactly (up to sampling and integer
rounding), which is what drives a serving simulation's token load. It does not reproduce the
trace's shape beyond that (Azure code prompts, for instance, are bimodal: the fitted sigma is
0.88 while the trace's std of ln(length) is 1.36), nor the correlation between a prompt's and
its output's length, nor arrival times: for those, replay the trace or resample its lengths.
Each preset also records the trace's mean request rate, for reference only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.errors import ServesimError
from servesim.workloads.lengths import clipped_lognormal_mean, lognormal_lengths

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class LognormalFit:
    """A clipped, rounded lognormal: ln X ~ Normal(ln median, sigma), clipped to [min, max]."""

    median: float
    sigma: float
    min: int
    max: int

    @property
    def mean(self) -> float:
        """The clipped distribution's mean (continuous approximation: rounding ignored)."""
        return clipped_lognormal_mean(self.median, self.sigma, self.min, self.max)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return lognormal_lengths(self.median, self.sigma, n, rng, min_tokens=self.min, max_tokens=self.max)


@dataclass(frozen=True)
class LengthPreset:
    name: str
    prompt: LognormalFit
    output: LognormalFit
    source: str
    trace_rate: float | None = None  # the source trace's mean requests/s, for reference

    def sample(self, n: int, prompt_rng: np.random.Generator,
               output_rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.sample(n, prompt_rng), self.output.sample(n, output_rng)


def fit_lognormal(values: np.ndarray) -> LognormalFit:
    """Fit median, sigma, min, max as described in the module docstring (bisection on sigma)."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or values.min() < 1:
        raise ServesimError("lengths", "cannot fit lengths: need at least one value, all >= 1",
                            "give positive token counts")
    median, mean = float(np.median(values)), float(values.mean())
    low, high = int(values.min()), int(values.max())
    if not mean > median:
        raise ServesimError("lengths", f"mean {mean:g} <= median {median:g}: the lengths are not "
                            "right-skewed, so no lognormal fits them", "resample the trace's lengths instead")

    def gap(s: float) -> float:
        return clipped_lognormal_mean(median, s, low, high) - mean

    # The clipped mean grows with sigma from the median until clipping at ``high`` bites; the
    # first crossing of the trace's mean (the right-skewed branch) is the fit.
    lo, hi = 0.0, 0.01
    while gap(hi) < 0:
        lo, hi = hi, hi * 1.5
        if hi > 20 or gap(hi) < gap(lo):
            raise ServesimError("lengths", f"no lognormal with median {median:g} in [{low}, {high}] "
                                f"reaches mean {mean:g}", "use the trace's lengths directly")
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return LognormalFit(median, 0.5 * (lo + hi), low, high)


# Fitted with fit_lognormal on the full trace files of ../shared/data/traces/ (the numbers below are
# what it returns, rounded to 4 digits; tests/test_workloads_presets.py re-fits them when the data
# is present). Trace means for reference: the preset's mean matches them.
PRESETS: dict[str, LengthPreset] = {
    preset.name: preset for preset in (
        # azure2023_AzureLLMInferenceTrace_conv.csv, 19,366 rows: in mean 1154.7 / p50 1020,
        # out mean 211.1 / p50 129; 5.53 req/s over 3502 s.
        LengthPreset("azure-conversation",
                     prompt=LognormalFit(median=1020.0, sigma=0.4981, min=2, max=14050),
                     output=LognormalFit(median=129.0, sigma=1.0717, min=7, max=1000),
                     source="azure2023_AzureLLMInferenceTrace_conv.csv", trace_rate=5.53),
        # azure2023_AzureLLMInferenceTrace_code.csv, 8,819 rows: in mean 2047.8 / p50 1469,
        # out mean 27.9 / p50 13; 2.57 req/s over 3436 s.
        LengthPreset("azure-code",
                     prompt=LognormalFit(median=1469.0, sigma=0.8841, min=3, max=7437),
                     output=LognormalFit(median=13.0, sigma=1.2150, min=6, max=1899),
                     source="azure2023_AzureLLMInferenceTrace_code.csv", trace_rate=2.57),
        # sharegpt_8k_filtered_stats_llama2_tokenizer.csv, 30,731 rows (Llama-2 tokenizer): in mean
        # 2340.0 / p50 1730, out mean 438.7 / p50 415. No arrival times. Sampled independently, a
        # pair may exceed the source's 8192-token total, which the trace itself never does.
        LengthPreset("sharegpt",
                     prompt=LognormalFit(median=1730.0, sigma=0.8409, min=1, max=8141),
                     output=LognormalFit(median=415.0, sigma=0.3362, min=2, max=1024),
                     source="sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
    )
}


def get_preset(name: str) -> LengthPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ServesimError("lengths.preset", f"unknown preset {name!r}",
                            f"use one of {', '.join(PRESETS)}") from None


def _check_fits() -> None:  # pragma: no cover - sanity guard for hand edits of PRESETS
    for preset in PRESETS.values():
        for fit in (preset.prompt, preset.output):
            assert fit.min <= fit.median <= fit.max and fit.sigma > 0 and math.isfinite(fit.mean)


_check_fits()
