#!/usr/bin/env python
"""Tool round trips through `edgespec serve` on the real pair: how often call -> result -> answer ends in an answer.

    .venv/bin/python bench/tool_roundtrip.py                       # this checkout's code, the real pair
    .venv/bin/python bench/tool_roundtrip.py --code /work/main     # another checkout's code (a before/after run)
    .venv/bin/python bench/tool_roundtrip.py --no-agents --tasks 4

Each task is one user question that one of four small tools answers (weather, currency, time, population). Through
/v1/chat/completions (the openai SDK, tool_choice "auto", temperature 0, max_tokens 128): the first answer must be a
tool call; the script runs the tool (deterministic canned results) and sends the call and its result back; the
round trip is complete when the second answer is text with no further call. Then the OpenAI Agents SDK's
quickstart shape (an Agent with the function tools, Runner.run with its default max_turns, the Responses API against
this server) on the same questions: finished = a final output within the default turns (not MaxTurnsExceeded).

The server runs as a child process (`python -m edgespec serve --port 0`) from --code's folder, so the same script
measures the code before and after a change. Prints one line per task and the totals; --json writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.serve_process import ServeProcess  # noqa: E402 - the tests' server process harness

WEATHER = {"paris": (17, "light rain"), "tokyo": (22, "clear"), "cairo": (34, "sunny"), "london": (12, "showers"),
           "oslo": (-3, "snow")}
RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0}
TIMES = {"America/New_York": "08:15", "Asia/Kolkata": "18:45", "Europe/Berlin": "14:15", "Asia/Tokyo": "22:15"}
POPULATION = {"canada": 40_100_000, "brazil": 216_400_000, "japan": 124_500_000}


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    temp, sky = WEATHER.get(city.strip().lower(), (20, "cloudy"))
    return json.dumps({"city": city, "temperature_c": temp, "conditions": sky})


def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money from one currency to another (ISO codes such as USD, EUR)."""
    a, b = RATES.get(from_currency.upper(), 1.0), RATES.get(to_currency.upper(), 1.0)
    return json.dumps({"amount": round(float(amount) / a * b, 2), "currency": to_currency.upper()})


def get_time(timezone: str) -> str:
    """Get the current local time in an IANA time zone such as Europe/Paris."""
    return json.dumps({"timezone": timezone, "time": TIMES.get(timezone, "12:00")})


def get_population(country: str) -> str:
    """Get the population of a country."""
    return json.dumps({"country": country, "population": POPULATION.get(country.strip().lower(), 10_000_000)})


FUNCTIONS = {f.__name__: f for f in (get_weather, convert_currency, get_time, get_population)}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": get_weather.__doc__,
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "convert_currency", "description": convert_currency.__doc__,
     "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "from_currency": {"type": "string"},
                                                     "to_currency": {"type": "string"}},
                    "required": ["amount", "from_currency", "to_currency"]}}},
    {"type": "function", "function": {"name": "get_time", "description": get_time.__doc__,
     "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}},
    {"type": "function", "function": {"name": "get_population", "description": get_population.__doc__,
     "parameters": {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]}}},
]
TASKS = [
    "What's the weather in Paris right now?",
    "Is it clear in Tokyo at the moment?",
    "How hot is it in Cairo today?",
    "Convert 100 US dollars to euros.",
    "How many Japanese yen is 50 British pounds?",
    "What time is it in New York? Use the time zone America/New_York.",
    "Tell me the current time in Asia/Kolkata.",
    "What is the population of Canada?",
    "How many people live in Brazil?",
    "Should I take an umbrella in London today?",
    "What's 250 EUR in USD?",
    "Is it snowing in Oslo?",
]
SYSTEM = "You are a helpful assistant. Use the tools when they help, then answer the user briefly."


def run_tool(name: str, arguments: str) -> str:
    fn = FUNCTIONS.get(name)
    try:
        args = json.loads(arguments or "{}")
        return fn(**args) if fn is not None else json.dumps({"error": f"no tool named {name}"})
    except (ValueError, TypeError) as e:
        return json.dumps({"error": f"bad arguments: {e}"})


def grounded(row: dict[str, Any]) -> bool:
    """Whether a completed round trip's answer quotes its tool result: a number or a time of the result (92.0 as
    92 too), or a word of its conditions, appears in the answer."""
    answer = (row.get("answer") or "").lower().replace(",", "")
    facts: set[str] = set()
    for name, args in row["calls"]:
        for v in json.loads(run_tool(name, args)).values():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                facts |= {str(v), f"{v:g}", str(round(v)), f"{v:.2f}"}
            elif isinstance(v, str) and (":" in v or " " in v or v in ("clear", "sunny", "snow", "cloudy", "showers")):
                facts |= {v.lower()} | ({w for w in v.lower().split() if len(w) > 3} if " " in v else set())
    return row["outcome"] == "answer" and any(f in answer for f in facts)


def chat_round_trip(client: Any, model: str, question: str, max_tokens: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    kw = {"model": model, "tools": TOOLS, "tool_choice": "auto", "temperature": 0, "max_tokens": max_tokens}
    t0 = time.perf_counter()
    first = client.chat.completions.create(messages=msgs, **kw).choices[0]
    out: dict[str, Any] = {"question": question, "first_finish": first.finish_reason, "first_content": first.message.content,
                           "calls": [(c.function.name, c.function.arguments) for c in first.message.tool_calls or []]}
    if not first.message.tool_calls:
        out.update(outcome="no call", seconds=round(time.perf_counter() - t0, 1))
        return out
    msgs.append({"role": "assistant", "content": first.message.content or "",
                 "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                for c in first.message.tool_calls]})
    for c in first.message.tool_calls:
        msgs.append({"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.name, c.function.arguments)})
    second = client.chat.completions.create(messages=msgs, **kw).choices[0]
    out.update(second_finish=second.finish_reason, answer=second.message.content,
               second_calls=[(c.function.name, c.function.arguments) for c in second.message.tool_calls or []],
               seconds=round(time.perf_counter() - t0, 1))
    out["outcome"] = "second call" if second.message.tool_calls else "answer" if (second.message.content or "").strip() else "empty"
    return out


def agents_run(base_url: str, model: str, question: str, max_tokens: int) -> dict[str, Any]:
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    set_default_openai_client(AsyncOpenAI(base_url=base_url + "/v1", api_key="none"))
    set_tracing_disabled(True)
    agent = Agent(name="Assistant", instructions=SYSTEM, model=model, tools=[function_tool(f) for f in FUNCTIONS.values()],
                  model_settings=ModelSettings(temperature=0, max_tokens=max_tokens))
    t0 = time.perf_counter()
    try:
        result = asyncio.run(Runner.run(agent, question))
    except MaxTurnsExceeded:
        return {"question": question, "outcome": "MaxTurnsExceeded", "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as e:  # noqa: BLE001 - any other failure is reported, not raised: the run goes on
        return {"question": question, "outcome": f"error: {type(e).__name__}: {str(e)[:200]}", "seconds": round(time.perf_counter() - t0, 1)}
    calls = [(getattr(i.raw_item, "name", ""), getattr(i.raw_item, "arguments", "")) for i in result.new_items if i.type == "tool_call_item"]
    return {"question": question, "outcome": "finished", "turns": len(result.raw_responses), "calls": calls,
            "answer": str(result.final_output)[:300], "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", default=str(Path(__file__).resolve().parents[1]), help="the checkout whose edgespec serves")
    ap.add_argument("--serve-args", default="", help="extra `edgespec serve` options (default: the real pair)")
    ap.add_argument("--tasks", type=int, default=len(TASKS))
    ap.add_argument("--agents-tasks", type=int, default=None, help="how many tasks the Agents SDK runs (default: all)")
    ap.add_argument("--no-agents", action="store_true")
    ap.add_argument("--no-chat", action="store_true", help="only the Agents SDK runs")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--start-timeout", type=float, default=1200, help="seconds the server may take to load (a busy machine is slow)")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--summarize", default=None, metavar="FILE", help="only print the totals of an earlier --json file")
    a = ap.parse_args()
    if a.summarize:
        summarize(json.loads(Path(a.summarize).read_text()))
        return
    from openai import OpenAI

    server = ServeProcess(["--log-level", "warning", *a.serve_args.split()], timeout=a.start_timeout, code=a.code)
    rows: dict[str, list[dict[str, Any]]] = {"chat": [], "agents": []}
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", timeout=600)
        model = client.models.list().data[0].id
        tasks = TASKS[: a.tasks]
        for q in tasks if not a.no_chat else []:
            r = chat_round_trip(client, model, q, a.max_tokens)
            rows["chat"].append(r)
            save(a.json_out, rows)
            print(f"chat   | {r['outcome']:<12} | {r['seconds']:>6}s | {q} | calls={r['calls']} "
                  f"second={r.get('second_calls')} answer={(r.get('answer') or r.get('first_content') or '')[:80]!r}", flush=True)
        if not a.no_agents:
            for q in tasks[: a.agents_tasks]:
                r = agents_run(server.url, model, q, a.max_tokens)
                rows["agents"].append(r)
                save(a.json_out, rows)
                print(f"agents | {r['outcome']:<12} | {r['seconds']:>6}s | {q} | calls={r.get('calls')} {r.get('answer', '')[:80]!r}",
                      flush=True)
    finally:
        server.stop()
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", a.code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", a.code, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d')} {cpu or platform.processor()} code={a.code}@{commit}{'+dirty' if dirty else ''} "
          f"max_tokens={a.max_tokens}")
    summarize(rows)


def save(path: str | None, rows: dict[str, list[dict[str, Any]]]) -> None:
    """The rows so far (after every task: a run cut short keeps what it measured)."""
    if path:
        tmp = Path(path + ".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(path)


def summarize(rows: dict[str, list[dict[str, Any]]]) -> None:
    chat = rows["chat"]
    called = sum(r["outcome"] != "no call" for r in chat)
    done = sum(r["outcome"] == "answer" for r in chat)
    if chat:
        print(f"chat: first answer a tool call {called}/{len(chat)}; round trip complete (call -> result -> answer, no second call) "
          f"{done}/{len(chat)}; answers quoting the result {sum(grounded(r) for r in chat)}/{len(chat)}")
    if rows["agents"]:
        ag = rows["agents"]
        fin = [r for r in ag if r["outcome"] == "finished"]
        with_call = [r for r in fin if r.get("calls")]  # "calls" is recorded since this script's second version
        print(f"agents: finished within the default max_turns {len(fin)}/{len(ag)}; of them after calling a tool {len(with_call)}, "
              f"one call only {sum(len(r['calls']) == 1 for r in with_call)}, quoting the result "
              f"{sum(grounded({**r, 'outcome': 'answer'}) for r in with_call)}")


if __name__ == "__main__":
    main()
