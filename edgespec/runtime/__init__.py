"""runtime/: a loaded pair serving requests.

Owns: the Engine (load a target and draft, start generations), the typed request (request), the worker and its
slots that batch decodes (generation), the speculative loop (speculate: propose, verify, accept, observe per cycle),
and resumable chat sessions (chat) with their saved files (chat_file).

May import: every wing below it (llama/, prompts/, decoding/, drafting/) and the base modules. server/, cli/ and
bench/ sit above it and use it through edgespec.Engine and GenerationRequest.
"""
