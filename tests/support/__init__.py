"""What the tests share (tests only, not part of the package): pytest puts tests/ on the path
(pyproject.toml's `pythonpath`), so every test imports these as `support.<module>`, and no test imports another.

* tiny: tiny real GGUF models written at test time (numpy and gguf only: the wheel check and tools use it too)
* engines: engines over those models (`make_engine`, test_engine's; `load`, the servers')
* server_thread: uvicorn serving an app in a thread (`ServerThread`), SSE events, chat messages, `wait_for`
* serve_process, rpc_process: `edgespec serve` and `edgespec rpc-server` as child processes
* stalled_clients, editor_requests: clients that never read their streams; what editor plugins send
* shared: the chi-square test of sampled sequences, a child Python process (`run_child`), the sampling settings
* fakes: numpy fakes of the models the loop talks to, and the exact law of whole generations on them
* fake_speculators: speculators over those fakes and `run`, one generation through the loop
* exact: exact laws by enumeration of the acceptance rules' uniforms
* model_law: the exact law of a tiny llama.cpp model's first tokens
* cost_curves: relative verify-cost curves (flat, cliff, CPU, desktop) as cost models
* replay_data: synthetic and tiny-model recordings for the speedup replay
* templates: real models' chat templates
* hostile_files, odd_files: hostile GGUF files; files that are not what a cache expects (FIFOs, loops, bad JSON)

ROOT is the checkout; TESTS its tests/ folder (on a child process's PYTHONPATH when the child imports support).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
