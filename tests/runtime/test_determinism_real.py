"""Deterministic mode on the real Qwen2.5-Coder pair (docs/determinism.md): greedy speculative output (a fixed 8-token
draft: verify batches of up to 9 rows) is token for token plain decoding's, and a long answer's tokens are the same
alone and with other slots' requests decoded beside it. Exact equality: no near-tie allowance. The checks run in a
fresh process (support/determinism_child.py): the mode needs GGML_CPU_TILED_MM=0 read before the process's first
batched decode, which this test session did long before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.determinism_child import PROMPTS

pytestmark = [pytest.mark.real, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def results(real_pair) -> dict:
    target, draft = real_pair
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"}  # the mode sets it itself
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent), str(TESTS), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-m", "support.determinism_child", str(target), str(draft)], cwd=TESTS, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_greedy_is_plain(results, prompt):
    r = results["prompts"][prompt]
    assert r["drafted"] > 0
    assert r["spec"] == r["plain"]


def test_beside_another_slot(results):
    r = results["long"]
    assert r["shorts"] == 3
    assert r["beside"] == r["alone"]
