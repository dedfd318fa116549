#!/usr/bin/env python3
"""A small desktop-style app around one edgespec Engine: a "UI" thread that stays responsive and a generation
streaming into it, which the UI cancels when the user clicks Stop. No GUI toolkit is needed to run it: the UI
thread is simulated by a queue of events, exactly where a Tk/Qt event loop would post them.

    python docs/examples/desktop_app.py                       # tiny generated models (seconds; from a checkout)
    python docs/examples/desktop_app.py TARGET.gguf DRAFT.gguf
"""

from __future__ import annotations

import queue
import sys
import tempfile
import threading
import time

from edgespec import ChatSession, Engine, ModelSpec, SamplingParams


def main(argv: list[str]) -> int:
    if len(argv) >= 2:
        target, draft = ModelSpec(argv[0]), ModelSpec(argv[1])
    else:
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the checkout's test support package
        from support.tiny import write_tiny_set

        files = write_tiny_set(tempfile.mkdtemp())
        # one thread: a tiny model's matrices are too small to share, and a second spinning thread only waits
        target, draft = (ModelSpec(files[r], n_ctx=2048, n_threads=1) for r in ("target", "draft"))

    events: queue.Queue = queue.Queue()  # what a GUI event loop would receive
    with Engine.load(target, draft) as engine:
        # Two conversations on one engine (two chat tabs): each keeps its KV cache, so switching back decodes only
        # the new message.
        tabs = {name: ChatSession(engine, system=f"You are {name}.", sampling=SamplingParams(temperature=0.7, seed=7),
                                  max_tokens=1500) for name in ("tab A", "tab B")}

        def generate(tab: str, message: str) -> None:  # runs on a worker thread of the app, not the UI thread
            turn = tabs[tab].send(message)
            events.put(("started", tab, turn))
            for chunk in turn:
                events.put(("text", tab, chunk.text))
            events.put(("done", tab, turn))

        for tab, message in (("tab A", "Tell me a story"), ("tab B", "List some colours"), ("tab A", "Go on")):
            threading.Thread(target=generate, args=(tab, message), daemon=True).start()
            shown, turn, started = 0, None, time.monotonic()
            while True:  # the UI loop: paint text, react to the Stop button
                kind, name, payload = events.get(timeout=120)
                if kind == "started":
                    turn = payload
                elif kind == "text":
                    shown += len(payload)
                    if shown > 200 and turn is not None:  # the user clicked Stop
                        turn.cancel()  # safe from any thread; the engine stops within one cycle
                elif kind == "done":
                    st = payload.stats
                    print(f"{name}: {shown} characters shown, finish reason {payload.finish_reason}, "
                          f"prompt {st.n_prompt} tokens of which {st.n_prefill} decoded, "
                          f"{time.monotonic() - started:.2f} s")
                    break
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
