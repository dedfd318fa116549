"""decoding/: the math of one decoding step, pure numpy, proven by enumeration in tests/decoding.

Owns: logits to probabilities and samples (sampling; warp_spec, warp_fast and probs behind it), the exact acceptance
rules for chains (acceptance) and token trees (tree), constraints on what may be sampled (constraint, structured: JSON
schemas and tools), the streaming detokenizer (detok), and drafting across vocabularies (vocab_map: the map by token
bytes, a draft row restricted to the shared tokens).

May import: edgespec's base modules and prompts/. Never llama/, drafting/ or runtime/: nothing here knows a model.
"""
