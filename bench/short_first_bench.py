"""Short requests while a long answer streams (issue 34): latency of a 16-token completion (and an infill) sent while
a 500-token chat answer is being generated, against the same request alone; and whether the long answer's text is
the same with them running. The default pair, in process (Engine.start from two threads), greedy.

    .venv/bin/python bench/short_first_bench.py                   # 10 short requests, 500-token answer
    .venv/bin/python bench/short_first_bench.py --shorts 20 --long-tokens 300 --json out.json
    .venv/bin/python bench/short_first_bench.py --threads 2      # pinned: the long text must then be the same

Latency = from the request to its last token (Generation.result), so it includes its prompt and any wait.
"With the long one" sends each short request after the long answer has generated a given number of tokens,
spread over the answer, one at a time; "alone" runs the same requests with nothing else queued (the long answer
done). A short request that arrived after the long answer ended would not count: the run says how many did.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgespec import Engine, ModelSpec, SamplingParams  # noqa: E402
from edgespec.models import resolve_model  # noqa: E402
from edgespec.runtime.request import GenerationRequest, InfillPrompt  # noqa: E402

GREEDY = SamplingParams(temperature=0)
LONG_MESSAGES = [{"role": "user", "content": "Explain, with code examples in Python, how hash tables work: hashing, "
                  "collisions, open addressing, chaining, resizing and their costs. Be thorough."}]
SHORTS = [
    ("completion", GenerationRequest(prompt="def is_prime(n):\n    ", max_tokens=16, sampling=GREEDY)),
    ("completion", GenerationRequest(prompt="import json\n\ndef load_config(path):\n    ", max_tokens=16, sampling=GREEDY)),
    ("infill", GenerationRequest(infill=InfillPrompt(prefix="def mean(xs):\n    ", suffix="\n    return total / len(xs)\n"),
                                 max_tokens=32, sampling=GREEDY)),
    ("completion", GenerationRequest(prompt="class Stack:\n    def push(self, x):\n        ", max_tokens=16, sampling=GREEDY)),
    ("infill", GenerationRequest(infill=InfillPrompt(prefix="for i in range(10):\n    ", suffix="\nprint('done')\n"),
                                 max_tokens=32, sampling=GREEDY)),
]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shorts", type=int, default=10, help="short requests sent during the long answer")
    ap.add_argument("--long-tokens", type=int, default=500)
    ap.add_argument("--threads", type=int, default=None,
                    help="pin both models' threads (llama.cpp's logits change with the thread count: near-ties flip)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    eng = Engine.load(ModelSpec(str(resolve_model(None, "target")), n_threads=a.threads),
                      ModelSpec(str(resolve_model(None, "draft")), n_threads=a.threads))
    reqs = [SHORTS[i % len(SHORTS)] for i in range(a.shorts)]
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "long_tokens": a.long_tokens, "shorts": a.shorts,
                           "threads": a.threads or "auto"}
    with eng:
        for _, r in SHORTS:  # warm: every short prompt once (its cache snapshot then exists, as in an editor)
            eng.start(r).result()
        t0 = time.perf_counter()
        long_alone = eng.start(GenerationRequest(messages=LONG_MESSAGES, max_tokens=a.long_tokens, sampling=GREEDY)).result()
        long_alone_s = time.perf_counter() - t0
        alone = []
        for kind, r in reqs:
            t = time.perf_counter()
            alone.append(eng.start(r).result())
            alone[-1] = (kind, time.perf_counter() - t, alone[-1])
        # with the long answer streaming: send the i-th short request once the answer has i/(n+1) of its tokens
        t0 = time.perf_counter()
        long = eng.start(GenerationRequest(messages=LONG_MESSAGES, max_tokens=a.long_tokens, sampling=GREEDY))
        during = []
        for i, (kind, r) in enumerate(reqs):
            mark = (i + 1) * len(long_alone.token_ids) // (len(reqs) + 1)
            while len(long.token_ids) < mark and not long.done:
                time.sleep(0.005)
            t = time.perf_counter()
            res = eng.start(r).result()
            during.append((kind, time.perf_counter() - t, res, not long.done))
        long_res = long.result()
        long_with_s = time.perf_counter() - t0
    lat_alone = [x[1] for x in alone]
    lat_during = [x[1] for x in during if x[3]]
    same_short = sum(1 for (_, _, ra), (_, _, rd, _) in zip(alone, during) if ra.token_ids == rd.token_ids)
    out.update({
        "alone_ms": {"median": round(statistics.median(lat_alone) * 1e3), "p95": round(pct(lat_alone, 0.95) * 1e3)},
        "during_ms": {"median": round(statistics.median(lat_during) * 1e3), "p95": round(pct(lat_during, 0.95) * 1e3)} if lat_during else None,
        "during_count": len(lat_during),
        "ratio_median": round(statistics.median(lat_during) / statistics.median(lat_alone), 2) if lat_during else None,
        "ratio_p95": round(pct(lat_during, 0.95) / pct(lat_alone, 0.95), 2) if lat_during else None,
        "long_text_identical": long_res.token_ids == long_alone.token_ids,
        "long_first_difference": next((i for i, (x, y) in enumerate(zip(long_res.token_ids, long_alone.token_ids)) if x != y), None),
        "long_tokens_generated": len(long_res.token_ids),
        "short_outputs_identical": f"{same_short}/{len(reqs)}",
        "long_alone_s": round(long_alone_s, 1), "long_with_shorts_s": round(long_with_s, 1),
        "long_tok_s_alone": round(long_alone.stats.tokens_per_second, 2), "long_tok_s_with": round(long_res.stats.tokens_per_second, 2),
        "per_request": [{"kind": k, "alone_ms": round(la * 1e3), "during_ms": round(ld * 1e3), "during_long": inside}
                        for (k, la, _), (_, ld, _, inside) in zip(alone, during)],
    })
    print(json.dumps(out, indent=1))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
