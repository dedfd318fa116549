"""Predicted speedups from the replay (replay.py) against its bounds (oracle.py): per suite and overall, for each
drafter kind, on one curve (`predict`, `format_table`) or on every hardware profile at several draft costs with issue
23's goals (`profile_rows`, `goals_check`, `format_profiles`). research/predict_speedup.py is the command line;
docs/gpu.md says what the numbers mean.

Speedup per suite = plain decode time / speculative decode time over the suite's prompts (summed tokens / summed
seconds on each side, as `edgespec bench` reports it), for each drafter kind the engine has: model, ngram,
model+ngram (the default, "auto" with a draft model), and on request the suffix-index drafters suffix and
model+suffix (replay.TREE_KINDS).

Sampled recordings (format 3, T > 0): the replay samples for real, through the same loop and the engine's exact
acceptance rules, from rows rebuilt from the recording (recorded.py); speedups are then rates (the two sides may stop
at different lengths), and the oracle is the best expected rate of a policy that knows every position's acceptance
probability but not the draws (oracle.expected_oracle_seconds).

Importing this module loads nothing of llama.cpp.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from edgespec.config import DrafterKind
from edgespec.drafting.costs import draft_model_pays
from edgespec.stats import Totals

from .curves import Curve
from .oracle import (
    expected_oracle_seconds,
    fitted_rule,
    fitted_run_table,
    model_proposals,
    model_sibling_hits,
    ngram_proposals,
    oracle_seconds,
)
from .recorded import SampledPrompt, SampledVocab, sampled_acceptance, sampled_params
from .replay import KINDS, new_state, run_one
from .traces import CONF_SCALE

DEFAULT_RELATIVE = (0.3, 0.45, 0.6, 0.8)
PROFILE_KINDS = (DrafterKind.MODEL, DrafterKind.MODEL_NGRAM)
# issue 23's goals for the default drafter (model+ngram): against its oracle overall and in every suite, against plain
# decoding in every suite, and where nothing pays (a profile whose name says Q4 on Metal)
GOALS = {"overall_vs_oracle": 0.90, "suite_vs_oracle": 0.85, "suite_vs_plain": 0.98, "nothing_pays_vs_plain": 0.99}


# --------------------------------------------------------------------------------------------- one curve
def _new_sums(kinds: Sequence[str]) -> dict[str, Any]:
    """What predict sums over a suite's prompts (or all of them)."""
    oracles = {"model": 0.0, "ngram": 0.0, "model+ngram": 0.0, "model tree": 0.0, "model+ngram tree": 0.0}
    return {"prompts": 0, "plain": Totals(), **{k: Totals() for k in kinds}, "oracle": oracles, "oracle_tokens": 0,
            "proposals": [], "rules": [], "alpha": []}


def _oracles(
    rec: Mapping[str, Any], data: Mapping[str, Any], cost: Curve, spec: Any, sp: SampledPrompt | None, params: Any, first: bool,
    oracle_cap: int, ngram_cap: int,
) -> tuple[dict[str, float], list[Any], list[tuple[int, int, int]]]:
    """One prompt's oracle seconds per drafter (the tree oracles too where the recording has the draft's alternatives;
    the expected-time oracles for a sampled recording, whose draws are not known ahead), and the draft model's and the
    lookup's proposals they were computed from (greedy recordings; none for a sampled one)."""
    n, P = len(rec["trace"]), len(rec["prompt"])
    if sp is not None:
        alpha, lookup = sampled_acceptance(sp, params, ngram_cap, spec)
        return {"model": expected_oracle_seconds(n, cost, alpha, None, oracle_cap, first, P),
                "ngram": expected_oracle_seconds(n, cost, None, lookup, oracle_cap, first, P),
                "model+ngram": expected_oracle_seconds(n, cost, alpha, lookup, oracle_cap, first, P)}, [], []
    mp = model_proposals(rec, data, oracle_cap)
    mr = [r for _, r, _ in mp]
    props = ngram_proposals(rec, spec, ngram_cap)
    nr = [acc for _, _, acc in props]
    oracle = {"model": oracle_seconds(n, cost, mr, None, first, P), "ngram": oracle_seconds(n, cost, None, nr, first, P),
              "model+ngram": oracle_seconds(n, cost, mr, nr, first, P)}
    sib = model_sibling_hits(rec, data, mp)
    if sib is not None:  # the tree oracles: chains, or a chain with the matching alternative at its miss
        oracle["model tree"] = oracle_seconds(n, cost, mr, None, first, P, sib)
        oracle["model+ngram tree"] = oracle_seconds(n, cost, mr, nr, first, P, sib)
    return oracle, mp, props


def _summary(s: dict[str, Any], kinds: Sequence[str], cost: Curve, ngram_cap: int, fit: bool, fit_rules: bool) -> dict[str, Any]:
    """A suite's (or the overall) results from its sums: speedups, the oracles' speedups, and the fitted bounds asked
    for (fit_rules: a suite's own rule; the caller sums the overall one)."""
    plain: Totals = s["plain"]
    out: dict[str, Any] = {"prompts": s["prompts"], "tokens": plain.n_generated, "plain_seconds": round(plain.decode_seconds, 6)}
    plain_rate = plain.n_generated / plain.decode_seconds  # tokens per modelled second (a sampled replay's
    # sides may stop at different lengths: rates, as `edgespec bench` compares them)
    for k in kinds:
        side: Totals = s[k]
        out[k] = {
            "speedup": round(side.n_generated / side.decode_seconds / plain_rate, 4),
            "seconds": round(side.decode_seconds, 6),
            "cycles": side.n_cycles,
            "spec_cycles": side.n_spec_cycles,
            "drafted": side.n_drafted,
            "accepted": side.n_accepted,
            "acceptance": round(side.acceptance, 4) if side.n_drafted else None,
            "sources": dict(sorted(side.source_counts.items())),
        }
    out["oracle"] = {k: round(s["oracle_tokens"] / v / plain_rate, 4) for k, v in s["oracle"].items() if v > 0}
    if s["alpha"]:  # a sampled recording: the draft's mean acceptance rate along the trajectories
        out["alpha"] = round(sum(s["alpha"]) / len(s["alpha"]) / CONF_SCALE, 4)
    if fit:
        sec, table = fitted_run_table(s["proposals"], cost, ngram_cap)
        out["fitted_ngram"] = {"speedup": round(plain.decode_seconds / sec, 4), "k_by_run": table}
    if fit_rules:
        sec, rule = fitted_rule(s["rules"], cost)
        out["fitted_rule"] = {"speedup": round(plain.decode_seconds / sec, 4), "seconds": sec, "rule": rule}
    return out


def predict(
    data: Mapping[str, Any], cost: Curve, spec: Any, suites: Sequence[str] = (), kinds: Sequence[str] = KINDS, fit: bool = False,
    fit_rules: bool = False, seed: int = 0,
) -> dict[str, Any]:
    """Predicted speedups per suite (and overall) for each drafter kind, and the oracle bounds; with fit, also the
    best fixed k-by-match-run rule fitted on each suite's traces (fitted_run_table); with fit_rules, the best fixed
    confidence / match-run rule for model+ngram fitted on each suite's traces (fitted_rule; overall: each suite with
    its own rule). seed: a sampled replay's draws (prompt i of the recording draws from [seed, i], every kind alike)."""
    sampled = data.get("format") == 3
    if sampled and (fit or fit_rules):
        raise ValueError("the fitted rules replay greedy traces only (this recording is sampled)")
    if not sampled and spec.draft_max > int(data["draft_len"]):
        raise ValueError(f"draft_max {spec.draft_max} exceeds the recorded draft length {data['draft_len']}")
    vocab = SampledVocab(data) if sampled else None
    params = sampled_params(data) if sampled else None
    prompts = [(no, p) for no, p in enumerate(data["prompts"]) if not suites or p["suite"] in suites]
    if not prompts:
        raise ValueError(f"no recorded prompts for suites {list(suites)}")
    states = {k: new_state(cost) for k in kinds}
    plain_state = new_state(cost)
    per_suite: dict[str, dict[str, Any]] = {}
    total = _new_sums(kinds)
    oracle_cap = max(spec.draft_max, 1)
    ngram_cap = spec.ngram_draft_max if spec.adaptive else spec.draft_max
    for no, rec in prompts:
        sp = SampledPrompt(rec, vocab) if vocab is not None else None
        st, first = run_one(rec, data, None, cost, plain_state, spec, sp, [seed, no])
        runs = {"plain": st, **{k: run_one(rec, data, k, cost, states[k], spec, sp, [seed, no])[0] for k in kinds}}
        oracle, mp, props = _oracles(rec, data, cost, spec, sp, params, first, oracle_cap, ngram_cap)
        for s in (per_suite.setdefault(rec["suite"], _new_sums(kinds)), total):
            s["prompts"] += 1
            s["oracle_tokens"] += len(rec["trace"])
            s["alpha"] += rec.get("alpha", [])
            s["proposals"].append((len(rec["prompt"]), props))
            if fit_rules:
                s["rules"].append((len(rec["prompt"]), first, mp, props))
            for k, r in runs.items():
                s[k].add(r)
            for k, v in oracle.items():
                s["oracle"][k] += v
    suite_results = {name: _summary(s, kinds, cost, ngram_cap, fit, fit_rules) for name, s in per_suite.items()}
    overall = _summary(total, kinds, cost, ngram_cap, fit, False)
    if fit_rules:  # every suite with its own fitted rule
        sec = sum(r["fitted_rule"]["seconds"] for r in suite_results.values())
        overall["fitted_rule"] = {"speedup": round(overall["plain_seconds"] / sec, 4), "seconds": sec}
    fresh = new_state(cost)  # what an engine starts with on this curve
    gate = draft_model_pays(fresh.cost_model(), max(spec.draft_max, 1), spec.draft_min)
    return {
        "curve": cost.describe(),
        "spec": {"draft_max": spec.draft_max, "adaptive": spec.adaptive, "ngram_draft_max": spec.ngram_draft_max},
        "draft_model_pays": gate,  # the hardware gate on this curve (adaptive mode)
        "draft_model_used": fresh.model_draft_used("model", spec),  # a fixed draft length bypasses the gate
        "traces": {k: data.get(k) for k in ("target", "draft", "recorded", "machine", "max_tokens", "draft_len", "sampling")},
        "suites": suite_results,
        "overall": overall,
    }


def format_table(result: Mapping[str, Any], kinds: Sequence[str] = KINDS) -> str:
    c = result["curve"]
    rel = c["verify_relative"]
    shown = " ".join(f"{n}:{rel[n]:.2f}" for n in rel if int(n) in (2, 4, 8, 16, 17, 32, 64))
    one = float(c["verify"].get("1") or min(c["verify"].values()))
    lines = [
        f"curve {c['name']}: 1 token {1000 * one:.2f} ms; verify x one token {shown}; draft {c['draft_relative']:.2f} x one "
        f"target token; overhead {1000 * c['overhead']:.2f} ms/cycle",
        "draft model " + ("pays here (hardware gate open)" if result["draft_model_pays"]
                          else "cannot pay here (hardware gate closed)")
        + ("" if result["draft_model_used"] == result["draft_model_pays"] else
           ("; used anyway: a fixed draft length bypasses the gate" if result["draft_model_used"] else ""))
        + ("" if result["draft_model_used"] else ": the engine does not run it (model = plain, model+ngram = ngram)"),
        "",
    ]
    fitted = "fitted_ngram" in result["overall"]
    rule = "fitted_rule" in result["overall"]
    chains = [k for k in KINDS if k in result["overall"]["oracle"]]
    head = (["suite", "n", "tokens"] + list(kinds) + (["fitted k(run) ngram"] if fitted else []) + (["fitted rule m+n"] if rule else [])
            + [f"oracle {k}" for k in chains])
    rows = []
    for name, s in list(result["suites"].items()) + [("overall", result["overall"])]:
        rows.append([name, str(s["prompts"]), str(s["tokens"])] + [f"{s[k]['speedup']:.2f}" for k in kinds]
                    + ([f"{s['fitted_ngram']['speedup']:.2f}"] if fitted else []) + ([f"{s['fitted_rule']['speedup']:.2f}"] if rule else [])
                    + [f"{s['oracle'][k]:.2f}" for k in chains])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines.append(fmt(head))
    lines.append("  ".join("-" * w for w in widths))
    lines += [fmt(r) for r in rows]
    lines.append("")
    lines.append("speedup = speculative tokens per modelled second / plain's, summed over the suite's prompts; "
                 "oracle = the best any policy drafting chains from the same proposals could do (the suffix drafters "
                 "verify trees: they have none)."
                 + (f" Sampled replay ({result['traces']['sampling']}): the oracle is the best expected rate of a policy "
                    "that knows each position's acceptance probability, not the draws." if result["traces"].get("sampling") else "")
                 + (" fitted k(run) = the best table from match run to draft length, fitted on the suite's own traces "
                    "(what any rule that sees only the match run can reach)." if fitted else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- profiles
def profile_rows(data: Mapping[str, Any], curves: Sequence[tuple[str, Curve]], rels: Sequence[float], spec: Any,
                 suites: Sequence[str] = (), fit_rules: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    """Every profile x draft cost x suite (and overall): the default drafter (model+ngram), its oracle, the draft
    model alone and its oracle; with fit_rules the best fixed rule for model+ngram fitted on each suite (fitted_rule)."""
    rows = []
    for pname, base in curves:
        for rel in rels:
            res = predict(data, base.with_draft_relative(rel), spec, suites, kinds=PROFILE_KINDS, fit_rules=fit_rules, seed=seed)
            for sname, s in list(res["suites"].items()) + [("overall", res["overall"])]:
                rows.append({
                    "profile": pname, "draft": rel, "suite": sname, "tokens": s["tokens"],
                    "default": s["model+ngram"]["speedup"], "oracle_default": s["oracle"]["model+ngram"],
                    "model": s["model"]["speedup"], "oracle_model": s["oracle"]["model"],
                    "model_used": res["draft_model_used"],
                    **({"oracle_default_tree": s["oracle"]["model+ngram tree"], "oracle_model_tree": s["oracle"]["model tree"]}
                       if "model tree" in s["oracle"] else {}),
                    "default_sources": s["model+ngram"]["sources"],
                    **({"alpha": s["alpha"]} if "alpha" in s else {}),
                    **({"fitted_rule": s["fitted_rule"]["speedup"]} if fit_rules else {}),
                })
    return rows


def goals_check(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per profile: the worst ratios over its draft costs, and whether issue 23's goals hold (see GOALS)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = out.setdefault(r["profile"], {"overall_vs_oracle": math.inf, "suite_vs_oracle": math.inf, "suite_vs_plain": math.inf})
        ratio = r["default"] / r["oracle_default"]
        if r["suite"] == "overall":
            g["overall_vs_oracle"] = min(g["overall_vs_oracle"], ratio)
        else:
            g["suite_vs_oracle"] = min(g["suite_vs_oracle"], ratio)
            g["suite_vs_plain"] = min(g["suite_vs_plain"], r["default"])
    for name, g in out.items():
        nothing_pays = "q4" in name.lower() and "metal" in name.lower()
        g["met"] = (g["overall_vs_oracle"] >= GOALS["overall_vs_oracle"] and g["suite_vs_oracle"] >= GOALS["suite_vs_oracle"]
                    and g["suite_vs_plain"] >= GOALS["nothing_pays_vs_plain" if nothing_pays else "suite_vs_plain"])
    return out


def format_profiles(rows: Sequence[Mapping[str, Any]]) -> str:
    fitted = bool(rows) and "fitted_rule" in rows[0]
    trees = bool(rows) and "oracle_default_tree" in rows[0]
    head = ["profile", "draft", "suite", "default", "oracle m+n", "ratio", "model", "oracle model", "ratio"]
    head += ["tree oracle m+n", "tree oracle model"] if trees else []
    head += ["fitted rule", "default/fitted"] if fitted else []
    body = [[r["profile"], f"{r['draft']:g}", r["suite"], f"{r['default']:.2f}", f"{r['oracle_default']:.2f}",
             f"{r['default'] / r['oracle_default']:.2f}", f"{r['model']:.2f}" if r["model_used"] else "off",
             f"{r['oracle_model']:.2f}", f"{r['model'] / r['oracle_model']:.2f}"]
            + ([f"{r['oracle_default_tree']:.2f}", f"{r['oracle_model_tree']:.2f}"] if trees else [])
            + ([f"{r['fitted_rule']:.2f}", f"{r['default'] / r['fitted_rule']:.2f}"] if fitted else []) for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) if i < 3 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines = [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(b) for b in body]
    sampled = bool(rows) and "alpha" in rows[0]
    lines += ["", "default = model+ngram (the engine's drafter with a draft model), x plain decoding; oracle m+n = the best "
              + ("expected rate of any policy that knows each position's acceptance probability (not the draws), drafting "
                 "from the same proposals (a sampled replay); " if sampled else
                 "any policy drafting from the same proposals could do; ")
              + "model = the draft model alone ('off' = the engine "
              "does not run it on this curve: plain decoding); draft = the draft's cost in target tokens."
              + (" tree oracle = the same bound when a cycle may also verify the draft's recorded alternative (draft-model "
                 "trees) beside the token where its chain misses." if trees else "")
              + (" fitted rule = the best fixed rule 'the lookup when its match run >= R (up to Kn tokens), else the "
                 "draft model while its confidence >= theta (up to K)', fitted on the suite's own traces in hindsight "
                 "(overall: each suite its own rule): what a policy deciding from those two signals can reach."
                 if fitted else ""), "",
              "goals (worst over the draft costs): default/oracle overall >= 0.90, every suite >= 0.85, default >= 0.98x "
              "plain in every suite (>= 0.99x on Metal Q4)"]
    for name, g in goals_check(rows).items():
        lines.append(f"  {name:<22} overall/oracle {g['overall_vs_oracle']:.3f}  worst suite/oracle {g['suite_vs_oracle']:.3f}  "
                     f"worst suite x plain {g['suite_vs_plain']:.3f}  {'MET' if g['met'] else 'not met'}")
    return "\n".join(lines)
