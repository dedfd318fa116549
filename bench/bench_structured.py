#!/usr/bin/env python
"""Structured output on the real pair: tokens/s of constrained plain decoding, constrained speculative decoding
(grammar-forced drafts + the engine's drafter) and unconstrained speculative decoding, side by side in one run.

    .venv/bin/python bench/bench_structured.py                 # the real pair from the model cache
    .venv/bin/python bench/bench_structured.py --reps 3 --max-tokens 160

Tasks: JSON-schema extraction (fields from a short text into a schema with fixed keys, enums, numbers) and tool
calls (a required call to one of two tools). Greedy, so every mode of a task writes the same tokens where the
constraint does not change them. Modes run interleaved per prompt and repetition (plain-c, spec-c, spec-free), each
from a cold KV cache, so load on a shared machine lands on all of them alike. tok/s = generated tokens / wall time of
the generation (prefill excluded: the generation's wall time minus its prompt processing, so tokens the first cycle
gets from forced drafts count); the median of per-run ratios is printed too.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgespec.config import ModelSpec, SamplingParams  # noqa: E402
from edgespec.decoding.constraint import Constraint  # noqa: E402
from edgespec.runtime.engine import Engine  # noqa: E402
from edgespec.decoding.structured import check_tools, tool_constraint, tool_messages  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "role": {"type": "string", "enum": ["engineer", "manager", "designer", "other"]},
        "skills": {"type": "array", "items": {"type": "string"}},
        "remote": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "role", "skills", "remote"],
    "additionalProperties": False,
}
TEXTS = [
    "Maria Lopez, 34, is a senior engineer working remotely; reach her at maria.lopez@example.com. She knows Rust, Go and Kubernetes.",
    "Tom Becker (52) manages the design team from the Berlin office. Email: t.becker@example.org. Skills: hiring, budgeting.",
    "Aiko Tanaka is a 27-year-old designer, fully remote, aiko@example.jp, good at Figma, typography and illustration.",
]
TOOLS = check_tools([
    {"type": "function", "function": {"name": "create_event", "description": "Create a calendar event",
     "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string", "description": "YYYY-MM-DD"},
                    "start_time": {"type": "string", "description": "HH:MM"}, "duration_minutes": {"type": "integer"},
                    "attendees": {"type": "array", "items": {"type": "string"}}},
                    "required": ["title", "date", "start_time", "duration_minutes", "attendees"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "send_email", "description": "Send an email",
     "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
                    "required": ["to", "subject", "body"], "additionalProperties": False}}},
])
REQUESTS = [
    "Set up a 45 minute meeting called 'Roadmap review' on 2025-03-14 at 10:30 with alice@example.com and bob@example.com.",
    "Email carol@example.com with subject 'Invoice 1042' saying the invoice was paid yesterday.",
    "Book a one hour 'Design sync' on 2025-04-02 at 15:00 with dan@example.com.",
]


def tasks() -> list[tuple[str, list[dict[str, str]], Constraint]]:
    out = []
    schema = Constraint.json_schema(PERSON)
    for t in TEXTS:
        msgs = [{"role": "system", "content": "Extract the person as JSON with the fields name, age, email, role, skills, remote."},
                {"role": "user", "content": t}]
        out.append(("json", msgs, schema))
    calls = tool_constraint(TOOLS, "required", parallel=False)
    assert calls is not None
    for r in REQUESTS:
        out.append(("tool", tool_messages([{"role": "user", "content": r}], TOOLS), calls))
    return out


def run_one(eng: Engine, msgs: list[dict[str, str]], constraint: Constraint | None, speculative: bool, max_tokens: int) -> dict[str, Any]:
    eng.reset_caches()
    gen = eng.stream(messages=msgs, sampling=SamplingParams(temperature=0), max_tokens=max_tokens, speculative=speculative,
                     constraint=constraint)
    start = time.perf_counter()
    r = gen.result()
    end = time.perf_counter()
    n = len(r.token_ids)
    decode_s = r.stats.wall - r.stats.timings.prefill  # generation time after the prompt was processed
    return {"n": n, "tps": n / decode_s if decode_s > 0 else 0.0, "text": r.text,
            "finish": r.finish_reason, "drafted": r.stats.n_drafted, "accepted": r.stats.n_accepted,
            "sources": dict(r.stats.source_counts), "wall": end - start, "prefill": r.stats.timings.prefill}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", dest="json_out", default=None, help="also write the raw results here")
    a = ap.parse_args()
    if a.target is None:
        from edgespec.models import resolve_model

        a.target, a.draft = str(resolve_model(None, "target")), str(resolve_model(None, "draft"))
    eng = Engine.load(ModelSpec(a.target, n_ctx=4096, n_threads=a.threads), ModelSpec(a.draft, n_ctx=4096, n_threads=a.threads))
    modes = [("plain-c", True, False), ("spec-c", True, True), ("spec-free", False, True)]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        work = tasks()
        run_one(eng, work[0][1], work[0][2], True, 16)  # warm up: the vocabulary for llguidance is built once
        for rep in range(a.reps):
            for i, (kind, msgs, c) in enumerate(work):
                order = modes if (rep + i) % 2 == 0 else modes[::-1]
                for name, constrained, spec in order:
                    r = run_one(eng, msgs, c if constrained else None, spec, a.max_tokens)
                    r["task"] = i
                    rows.setdefault((kind, name), []).append(r)
    finally:
        eng.close()
    print(f"# {time.strftime('%Y-%m-%d')} {platform.machine()} {platform.processor() or ''} {platform.system()} "
          f"threads={a.threads or 'default'} reps={a.reps} max_tokens={a.max_tokens}")
    print("| task | mode | tok/s (total) | median ratio vs plain-c | accepted/drafted | valid | mean tokens |")
    print("|---|---|---|---|---|---|---|")
    for kind in ("json", "tool"):
        base = rows[(kind, "plain-c")]
        for name, _, _ in modes:
            rs = rows[(kind, name)]
            tps = sum(r["n"] for r in rs) / sum(r["n"] / r["tps"] for r in rs if r["tps"] > 0)
            ratios = [r["tps"] / b["tps"] for r, b in zip(rs, base) if b["tps"] > 0]
            valid = sum(_valid(kind, r["text"]) for r in rs)
            acc = f"{sum(r['accepted'] for r in rs)}/{sum(r['drafted'] for r in rs)}"
            print(f"| {kind} | {name} | {tps:.1f} | {statistics.median(ratios):.2f}x | {acc} | {valid}/{len(rs)} | "
                  f"{statistics.mean(r['n'] for r in rs):.0f} |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({f"{k}/{m}": v for (k, m), v in rows.items()}, indent=1))


def _valid(kind: str, text: str) -> bool:
    try:
        if kind == "json":
            obj = json.loads(text)
            return isinstance(obj, dict) and set(obj) == set(PERSON["properties"])
        from edgespec.decoding.structured import parse_tool_calls

        return bool(parse_tool_calls(text)[1])
    except ValueError:
        return False


if __name__ == "__main__":
    main()
