"""runtime/: a loaded pair serving requests.

Owns: the Engine (engine: load a target and draft, start generations), the typed request (request), building every
prompt (prompt), the worker, its slots and rounds that batch decodes (generation, slots, job: what a caller and the
worker share, handle: the caller's Generation), the worker's side of one generation (runner), the speculative loop
(speculate: propose, verify, accept, observe per cycle, with steps, constrained and tree_rows), and resumable chat
sessions (chat) with their saved files (chat_file).

May import: every wing below it (llama/, prompts/, decoding/, drafting/) and the base modules. server/, cli/ and
bench/ sit above it and use it through edgespec.Engine and GenerationRequest.
"""
