"""Measuring verify-cost curves on this machine (curves.py reads them): `measure` writes a curve file's contents for
any pair of GGUF files (CPU or GPU offload), `research/predict_speedup.py measure` is its command line; `compare`
measures several files' curves side by side, interleaved (`research/synth_model.py compare`: a synthetic model against
the real one).

The timing is the engine's own calibration (drafting.calibration.measure_decode_costs, after a 16-token context);
`time_sizes` and `short_context` repeat its timing loop and context for the measurements it does not make (curves
after a deeper context, several files in interleaved rounds).

Importing this module loads nothing of llama.cpp; measuring loads the models.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from edgespec.config import ModelSpec
from edgespec.drafting.calibration import short_context, time_sizes


def at_depths(model: Any, sizes: Sequence[int], rounds: int, depths: Sequence[int]) -> dict[int, dict[int, float]]:
    """{depth: {n: median seconds}}: batches of n decoded after `depth` cached tokens (filler ids), every depth and
    size once per round (interleaved, so that a busy moment hits all alike)."""
    times: dict[int, dict[int, list[float]]] = {d: {n: [] for n in sizes} for d in depths}
    for _ in range(rounds):
        for d in depths:
            model.reset()
            model.decode([(100 + 7 * i) % model.n_vocab for i in range(d)], 0, ())
            t = time_sizes(model, sizes, d, 1)
            for n in sizes:
                times[d][n] += t[n]
    model.reset()
    return {d: {n: statistics.median(v) for n, v in t.items()} for d, t in times.items()}


def measure(target: str, draft: str | None, n_gpu_layers: int, sizes: Sequence[int], rounds: int, threads: int | None,
            depths: Sequence[int] = ()) -> dict[str, Any]:
    """A curve file's contents for this machine: the target's verify curve, the draft's per-token cost and its
    small-batch curve, measured with edgespec.drafting.calibration.measure_decode_costs (after a 16-token context, as the
    engine calibrates); with `depths`, also how those costs grow with the context depth (depth_scale)."""
    from edgespec.llama.backend import Model
    from edgespec.drafting.calibration import measure_decode_costs

    out: dict[str, Any] = {"name": f"measured {Path(target).name}" + (f" + {Path(draft).name}" if draft else "")}
    n_ctx = max(256, max(sizes) + 64, max(depths, default=0) + max(sizes) + 8)
    t0 = time.perf_counter()
    scale: dict[str, Any] = {}
    with Model(ModelSpec(target, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_threads=threads)) as m:
        measure_decode_costs(m, sizes=(1, 2, 4), rounds=1)  # warm-up (first calls allocate, GPU kernels load)
        verify, steady = measure_decode_costs(m, sizes=sizes, rounds=rounds)
        if depths:
            at = at_depths(m, sizes, rounds, sorted({16, *depths}))
            scale["verify"] = {str(d): {str(n): round(at[d][n] / at[16][n], 4) for n in sizes} for d in sorted(at)}
    out["verify"] = {str(n): s for n, s in sorted(verify.items())}
    out["steady"] = steady
    if draft:
        with Model(ModelSpec(draft, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_threads=threads)) as d:
            measure_decode_costs(d, sizes=(1, 2), rounds=1)
            dv, dsteady = measure_decode_costs(d, sizes=[n for n in sizes if n <= 17] or [1], rounds=rounds)
            one, _ = measure_decode_costs(d, sizes=(1,), rounds=5)
            if depths:
                at = at_depths(d, [1], rounds, sorted({16, *depths}))
                scale["draft"] = {str(k): round(at[k][1] / at[16][1], 4) for k in sorted(at)}
        out["draft"] = one[1]
        out["draft_verify"] = {str(n): s for n, s in sorted(dv.items())}
        out["steady"] = steady and dsteady
    else:
        out["draft"] = 0.0
    if scale:
        out["depth_scale"] = scale
    out["n_gpu_layers"] = n_gpu_layers
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def compare(paths: Sequence[str], sizes: Sequence[int], rounds: int, threads: int | None, n_gpu_layers: int) -> dict[str, Any]:
    """Verify curves of several files measured in interleaved rounds (each round: every file, every size once), so
    that machine noise hits all alike; medians per size."""
    from edgespec.llama.backend import Model

    models = [Model(ModelSpec(p, n_threads=threads, n_gpu_layers=n_gpu_layers, n_ctx=max(256, max(sizes) + 64))) for p in paths]
    times: list[dict[int, list[float]]] = [{n: [] for n in sizes} for _ in paths]
    try:
        starts = []
        for m in models:
            m.reset()
            base = short_context(m, max(sizes))
            m.decode(base, 0, ())
            starts.append(len(base))
            time_sizes(m, [1, 2, 4], len(base), 1)  # warm-up
        for r in range(rounds):
            order = range(len(models)) if r % 2 == 0 else reversed(range(len(models)))
            for i in order:
                t = time_sizes(models[i], sizes, starts[i], 1)
                for n in sizes:
                    times[i][n] += t[n]
    finally:
        for m in models:
            m.close()
    curves = [{n: statistics.median(v) for n, v in t.items()} for t in times]
    ref = curves[0]
    out: dict[str, Any] = {"files": [os.path.basename(p) for p in paths], "rounds": rounds, "threads": threads,
                           "n_gpu_layers": n_gpu_layers, "curves": [{str(n): s for n, s in c.items()} for c in curves]}
    out["ratio"] = [{str(n): round(c[n] / ref[n], 4) for n in sizes} for c in curves[1:]]
    out["max_deviation"] = [round(max(abs(c[n] / ref[n] - 1) for n in sizes), 4) for c in curves[1:]]
    # the fastest of the rounds: on a shared machine other work only ever adds time, so the minimum is the steadier
    # estimate of what a decode costs
    mins = [{n: min(v) for n, v in t.items()} for t in times]
    out["curves_min"] = [{str(n): s for n, s in c.items()} for c in mins]
    out["ratio_min"] = [{str(n): round(c[n] / mins[0][n], 4) for n in sizes} for c in mins[1:]]
    out["max_deviation_min"] = [round(max(abs(c[n] / mins[0][n] - 1) for n in sizes), 4) for c in mins[1:]]
    return out


def format_compare(res: dict[str, Any]) -> str:
    names = res["files"]
    sizes = list(res["curves"][0])
    head = (["n"] + [f"{n} ms (median)" for n in names] + [f"ratio {i + 2}/1" for i in range(len(names) - 1)]
            + [f"{n} ms (min)" for n in names] + [f"ratio {i + 2}/1 (min)" for i in range(len(names) - 1)])
    rows = []
    for n in sizes:
        rows.append([n] + [f"{1000 * c[n]:.2f}" for c in res["curves"]] + [f"{r[n]:.3f}" for r in res["ratio"]]
                    + [f"{1000 * c[n]:.2f}" for c in res["curves_min"]] + [f"{r[n]:.3f}" for r in res["ratio_min"]])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths)) for r in [head] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"max |ratio - 1|: medians {', '.join(f'{d:.1%}' for d in res['max_deviation'])}, minima "
                 f"{', '.join(f'{d:.1%}' for d in res['max_deviation_min'])} ({res['rounds']} interleaved rounds)")
    return "\n".join(lines)
