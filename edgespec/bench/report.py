"""The benchmark report as text and as a plot (edgespec.bench produces the report)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from edgespec.errors import EdgespecError
from edgespec.fsutil import atomic_write_bytes


# --------------------------------------------------------------------------------------------- text output
def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool] | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = right or [i > 0 for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _sources(src: Mapping[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(src.items())) or "-"


def _costs_line(costs: Mapping[str, Any] | None) -> str:
    """The costs the controller planned with: where they came from, the verify curve (ms and x one token)."""
    if not costs:
        return "costs: -"
    c = costs["calibration"]
    v = {int(n): s for n, s in c["verify"].items()}
    one = v.get(1) or min(v.values())
    curve = " ".join(f"{n}:{v[n] / one:.2f}" for n in sorted(v) if n in (2, 4, 8, 9, 16, 17))
    draft = f"draft {1000 * c['draft']:.1f} ms/token, " if c["draft"] else ""
    return (
        f"costs ({c['source']}): 1 token {1000 * one:.1f} ms, verify x one token {curve}; {draft}"
        f"draft model {'used' if c.get('draft_model_used') else 'not used (cannot pay here)'}"
    )


def format_report(report: Mapping[str, Any], per_prompt: bool = True) -> str:
    """The human-readable tables (per prompt, per suite + overall, acceptance by draft position)."""
    greedy = report["settings"]["temperature"] == 0
    m = report["models"]
    out = [
        f"target {os.path.basename(m['target'])}  draft {os.path.basename(m['draft']) if m['draft'] else '-'}  "
        f"drafter {m['drafter']}  draft_max {m['draft_max']}  threads {m['threads']}",
        f"temperature {report['settings']['temperature']}  max_tokens {report['settings']['max_tokens']}  "
        f"repeats {report['settings']['repeats']}  seed {report['settings']['seed']}"
        + ("  (cold draft: draft prompt processing counted in decode)" if report["settings"]["cold_draft"] else ""),
        _costs_line(report.get("costs")),
        "",
    ]
    if per_prompt:
        rows = []
        for r in report["prompts"]:
            acc_n = sum(st["n_accepted"] for st in r["spec"])
            cyc = sum(st["n_spec_cycles"] for st in r["spec"])
            dr = sum(st["n_drafted"] for st in r["spec"])
            mu = acc_n / cyc if cyc else 0.0
            acc = acc_n / dr if dr else None
            rows.append([
                r["name"], r["n_prompt"], r["plain"][0]["n_generated"], r["spec"][0]["n_generated"],
                f"{r['plain_tokens_per_second']:.1f}", f"{r['spec_tokens_per_second']:.1f}", f"{r['speedup']:.2f}",
                f"{mu:.2f}", _pct(acc), ("yes" if r["identical"] else "NO") if greedy else "n/a",
            ])
        head = ["prompt", "prompt tok", "plain tok", "spec tok", "plain tok/s", "spec tok/s", "speedup", "μ", "accept", "identical"]
        out.append(_table(head, rows, [False] + [True] * 9))
        out.append("")
    names = list(report["suites"]) + (["overall"] if report["overall"] else [])
    summaries = [report["suites"][n] for n in report["suites"]] + ([report["overall"]] if report["overall"] else [])
    rows = []
    for name, s in zip(names, summaries):
        ts = s["spec"]["time_split"]
        rows.append([
            name, s["n_prompts"], f"{s['plain']['tokens_per_second']:.1f}", f"{s['spec']['tokens_per_second']:.1f}",
            f"{s['speedup']:.2f}" if s["speedup"] else "-", f"{s['speedup_geomean']:.2f}" if s["speedup_geomean"] else "-",
            f"{s['mu']:.2f}", _pct(s["acceptance"]),
            f"{_pct(ts['draft'])}/{_pct(ts['target'])}/{_pct(ts['overhead'])}",
            _pct(s["plain"]["time_split"]["overhead"]),
            f"{s['plain'].get('host_ms_per_token', 0.0):.2f}/{s['spec'].get('host_ms_per_token', 0.0):.2f}",
            _sources(s["sources"]),
            f"{s['identical']}/{s['n_prompts']}" if s["identical"] is not None else "n/a",
        ])
    out.append(_table(
        ["suite", "n", "plain tok/s", "spec tok/s", "speedup", "geomean", "μ", "accept",
         "spec draft/target/ovh", "plain ovh", "host ms/tok plain/spec", "cycles by source", "identical"],
        rows, [False] + [True] * 10 + [False, True],
    ))
    out.append("")
    width = max((len(s["acceptance_by_pos"]) for s in summaries), default=0)
    if width:
        rows = [[name] + [_pct(a) for a in s["acceptance_by_pos"]] + [""] * (width - len(s["acceptance_by_pos"])) for name, s in zip(names, summaries)]
        out.append("acceptance by draft position (accepted / drafted at that position)")
        out.append(_table(["suite"] + [f"pos{i + 1}" for i in range(width)], rows))
        rows = [[name] + [str(d) for d in s["drafted_by_pos"]] + [""] * (width - len(s["drafted_by_pos"])) for name, s in zip(names, summaries)]
        out.append("")
        out.append("drafted tokens by position")
        out.append(_table(["suite"] + [f"pos{i + 1}" for i in range(width)], rows))
    out.append("")
    out.append(
        "tok/s = decode rate (generated tokens / seconds after prefill); speedup = spec rate / plain rate from summed "
        "tokens and seconds; geomean = geometric mean of per-prompt speedups; μ = accepted drafts per speculative "
        "cycle; draft/target/ovh = share of the speculative decode time."
    )
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- plot
def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise EdgespecError("--plot needs matplotlib: pip install 'edgespec[plot]' (or pip install matplotlib)") from None


def plot_format(path: str | os.PathLike[str]) -> str:
    """The image format for `path` (by its suffix, any matplotlib writes; none = png), after checking that it can be
    written there: one clear error before a benchmark runs rather than a traceback after it."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    p = Path(os.fspath(path))
    fmt = p.suffix[1:].lower() or "png"
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if fmt not in formats:
        raise EdgespecError(f"cannot write a plot as {p.suffix!r}: use one of {', '.join('.' + f for f in formats)}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise EdgespecError(f"cannot write the plot {p}: {parent} is not a folder")
    if p.exists() and not p.is_file():
        raise EdgespecError(f"cannot write the plot {p}: not a regular file")
    return fmt


def plot_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Speedup per prompt (bars grouped by suite) and acceptance by draft position (a line per suite), written
    atomically to `path` (in the format its suffix names: plot_format)."""
    fmt = plot_format(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 2]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    x = 0.0
    ticks, labels = [], []
    for si, (suite, summary) in enumerate(report["suites"].items()):
        recs = [r for r in report["prompts"] if r["suite"] == suite]
        xs = [x + j for j in range(len(recs))]
        c = colors[si % len(colors)]
        ax1.bar(xs, [r["speedup"] for r in recs], color=c, label=f"{suite} (x{summary['speedup']:.2f})" if summary["speedup"] else suite)
        ticks += xs
        labels += [str(r["index"] + 1) for r in recs]
        x += len(recs) + 1
        acc = summary["acceptance_by_pos"]
        if acc:
            ax2.plot(range(1, len(acc) + 1), [a if a is not None else float("nan") for a in acc], marker="o", color=c, label=suite)
    ax1.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax1.set_xticks(ticks)
    ax1.set_xticklabels(labels, fontsize=7)
    ax1.set_xlabel("prompt (grouped by suite)")
    ax1.set_ylabel("speedup (spec tok/s / plain tok/s)")
    t = report["settings"]["temperature"]
    ax1.set_title(f"speedup per prompt, temperature {t}, {report['settings']['max_tokens']} tokens")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("acceptance rate")
    ax2.set_ylim(0, 1.05)
    ax2.set_title("acceptance by draft position")
    ax2.grid(alpha=0.3)
    if ax2.lines:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=110)
    plt.close(fig)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as e:
        raise EdgespecError(f"cannot write the plot {os.fspath(path)}: {e.strerror or e}") from None


__all__ = ["format_report", "plot_report", "plot_format", "require_matplotlib"]
