"""The real-pair deterministic-mode checks of tests/runtime/test_determinism_real.py, run in a fresh process: the mode
needs GGML_CPU_TILED_MM=0 read before the process's first batched decode, and a test session has decoded in default
mode long before. Prints one JSON object: per prompt, plain and speculative greedy token ids and the tokens drafted;
the long answer alone and beside other slots' requests.

    python -m support.determinism_child TARGET DRAFT   (from tests/, as the test runs it)"""

from __future__ import annotations

import json
import sys
import threading

from edgespec.config import ModelSpec, SamplingParams, SpecConfig

TOKENS = 100
PROMPTS = [
    "Write a Python function that merges two sorted lists, with a docstring.",
    "Explain in plain English how a hash table handles collisions.",
    "Extract every name and amount as JSON: 'Alice paid Bob $120; Carol paid Dave $75.50.'",
]
LONG = "Write a tutorial on Python decorators with three examples."
SHORTS = ("Say hello in French.", "What is 17 * 23?", "Name three sorting algorithms.")
GREEDY = SamplingParams(temperature=0.0)


def run(target: str, draft: str) -> dict:
    from edgespec.runtime.engine import Engine

    out: dict = {"prompts": {}}
    with Engine.load(ModelSpec(target, n_ctx=1024), ModelSpec(draft, n_ctx=1024), spec=SpecConfig(draft_max=8, adaptive=False),
                     calibrate_costs=False, memory=False, parallel=2, deterministic=True) as eng:
        for prompt in PROMPTS:
            msgs = [{"role": "user", "content": prompt}]
            plain = eng.generate(messages=msgs, sampling=GREEDY, max_tokens=TOKENS, speculative=False)
            spec = eng.generate(messages=msgs, sampling=GREEDY, max_tokens=TOKENS)
            out["prompts"][prompt] = {"plain": plain.token_ids, "spec": spec.token_ids, "drafted": spec.stats.n_drafted}
        msgs = [{"role": "user", "content": LONG}]
        alone = eng.generate(messages=msgs, sampling=GREEDY, max_tokens=TOKENS)
        gen = eng.stream(messages=msgs, sampling=GREEDY, max_tokens=TOKENS)
        shorts: list = []

        def feed() -> None:
            for q in SHORTS:
                shorts.append(eng.generate(messages=[{"role": "user", "content": q}], sampling=GREEDY, max_tokens=12).token_ids)

        th = threading.Thread(target=feed)
        th.start()
        beside = gen.result()
        th.join()
        out["long"] = {"alone": alone.token_ids, "beside": beside.token_ids, "shorts": len(shorts)}
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2])))
