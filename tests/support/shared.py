"""Helpers several test files share (tests only): the chi-square test of sampled sequences against an exact
distribution, and running code in a child Python process (where a signal or a hang is the risk)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
from scipy import stats as sstats

from edgespec.config import SamplingParams

from support import ROOT, TESTS


def chi_square(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> float:
    """p-value of the sampled sequences against the exact distribution {sequence: probability}. Cells with an
    expected count below 5 are merged into one; a sample outside the exact support fails at once."""
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    impossible = [s for s in counts if s not in exact]
    assert not impossible, f"sampled sequences outside the exact distribution's support: {impossible[:5]}"
    obs, exp = [], []
    other_obs, other_exp = 0, 0.0
    for s in sorted(exact, key=lambda s: -exact[s]):
        e = n * exact[s]
        if e < 5:
            other_obs += counts.get(s, 0)
            other_exp += e
        else:
            obs.append(counts.get(s, 0))
            exp.append(e)
    if other_exp > 0 or other_obs > 0:
        obs.append(other_obs)
        exp.append(max(other_exp, 1e-12))
    obs_a, exp_a = np.array(obs, float), np.array(exp, float)
    exp_a *= obs_a.sum() / exp_a.sum()
    return float(sstats.chisquare(obs_a, exp_a).pvalue)


def run_child(code: str, timeout: float = 120, support: bool = False) -> subprocess.CompletedProcess:
    """Run `code` (dedented) in a fresh Python process that imports this checkout's edgespec (and, support=True,
    the tests' support package)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)] if support else [str(ROOT)])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env)


# The sampling settings every drafter is checked at: on the real tiny models (test_speculate) and on the fakes
# (test_loop_laws).
SETTINGS = {
    "T0.7": SamplingParams(temperature=0.7),
    "T1.0": SamplingParams(temperature=1.0),
    "T1.5": SamplingParams(temperature=1.5),
    "T1.0-topk3": SamplingParams(temperature=1.0, top_k=3),
    "T1.0-topp0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "T1.5-minp0.1": SamplingParams(temperature=1.5, min_p=0.1),
    "T1.0-repeat1.5": SamplingParams(temperature=1.0, repeat_penalty=1.5, repeat_last_n=8),
}
