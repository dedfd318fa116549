"""Server counters, and their Prometheus text exposition (`GET /metrics`, format 0.0.4), written by hand: a
handful of counters and gauges need no client library.

Everything is updated from the event loop's thread only, so no lock is needed; `render` runs there too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

PREFIX = "edgespec"


@dataclass
class Metrics:
    http: Counter = field(default_factory=Counter)  # (route, status) -> HTTP responses
    finished: Counter = field(default_factory=Counter)  # OpenAI finish reason ("stop", "length", "error") -> generations
    cancelled: Counter = field(default_factory=Counter)  # "queued" / "running" -> generations cancelled by a client leaving
    rejected: Counter = field(default_factory=Counter)  # "queue_full", "context", "invalid" -> generation requests refused
    tokens: Counter = field(default_factory=Counter)  # prompt, cached, prefill, generated, drafted, accepted
    seconds: Counter = field(default_factory=Counter)  # queue, prefill, draft, target, wall
    in_flight: int = 0  # generation requests being answered (queued or running)
    stalled: int = 0  # responses cancelled because their client did not read them (Settings.stall_timeout)
    cancel_overrun_max: int = 0  # most tokens a cancelled generation produced after its cancel (at most one cycle's)

    def record_generation(self, stats: Any, finish: str | None) -> None:
        """Add one finished generation's statistics (a GenerationStats)."""
        if finish is not None:
            self.finished[finish] += 1
        t = self.tokens
        t["prompt"] += stats.n_prompt
        t["cached"] += stats.n_cached
        t["prefill"] += stats.n_prefill
        t["generated"] += stats.n_generated
        t["drafted"] += stats.n_drafted
        t["accepted"] += stats.n_accepted
        s = self.seconds
        s["queue"] += stats.timings.queue
        s["prefill"] += stats.timings.prefill
        s["draft"] += stats.timings.draft
        s["target"] += stats.timings.target
        s["wall"] += stats.wall

    def render(self, *, queue_length: int, running: int, loaded: bool, slots: int = 0) -> str:
        out: list[str] = []

        def metric(name: str, kind: str, help: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
            full = f"{PREFIX}_{name}"
            out.append(f"# HELP {full} {help}")
            out.append(f"# TYPE {full} {kind}")
            for labels, value in samples:
                lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                out.append(f"{full}{{{lab}}} {_num(value)}" if lab else f"{full} {_num(value)}")

        metric("up", "gauge", "1 once the models are loaded.", [({}, 1 if loaded else 0)])
        metric("http_requests_total", "counter", "HTTP responses by route and status code.",
               [({"route": r, "code": str(c)}, n) for (r, c), n in sorted(self.http.items())])
        metric("requests_finished_total", "counter", "Generations answered, by finish reason.",
               [({"finish_reason": k}, n) for k, n in sorted(self.finished.items())])
        metric("requests_cancelled_total", "counter", "Generations cancelled because their client left, by where they were.",
               [({"stage": k}, self.cancelled.get(k, 0)) for k in ("queued", "running")])
        metric("requests_rejected_total", "counter", "Generation requests refused before queueing, by reason.",
               [({"reason": k}, n) for k, n in sorted(self.rejected.items())])
        metric("tokens_total", "counter",
               "Tokens: prompt (all prompt tokens), cached (served from the KV cache), prefill (decoded), generated, drafted, accepted.",
               [({"kind": k}, self.tokens.get(k, 0)) for k in ("prompt", "cached", "prefill", "generated", "drafted", "accepted")])
        metric("seconds_total", "counter", "Engine time by phase (queue = waiting for the engine).",
               [({"phase": k}, self.seconds.get(k, 0.0)) for k in ("queue", "prefill", "draft", "target", "wall")])
        metric("slots_total", "gauge", "Slots: generations that may run at once (serve --parallel).", [({}, slots)])
        metric("queue_length", "gauge", "Generations waiting for a slot (a long one a short one displaced included).", [({}, queue_length)])
        metric("requests_running", "gauge", "Generations running now, each in a slot (the busy slots).", [({}, running)])
        metric("requests_in_flight", "gauge", "Generation requests being answered (queued, running, or being written to a slow client).",
               [({}, self.in_flight)])
        metric("requests_stalled_total", "counter", "Responses cancelled because their client did not read them for the stall timeout.",
               [({}, self.stalled)])
        metric("cancel_overrun_tokens_max", "gauge", "Most tokens a cancelled generation produced after its cancel (one cycle at most).",
               [({}, self.cancel_overrun_max)])
        return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(round(float(v), 6))


__all__ = ["Metrics"]
