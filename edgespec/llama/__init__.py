"""llama/: the one wing that talks to llama.cpp.

Owns: loading GGUF models and their contexts (context), their vocabularies (vocab), the slots' sequences and what
they hold (slot), the `Model` that puts these together (backend), the ctypes binding (binding: the only import of
llama_cpp), llama.cpp's RPC backend (rpc), thread tuning (threads), the prompt-prefix cache (prompt_cache), and reading
and checking GGUF headers before llama.cpp sees a file (gguf_check, gguf_header, gguf_rules, gguf_known: pure
Python), and how a draft's vocabulary pairs with the target's (vocab_pair).

May import: edgespec's base modules (config, errors, stats, paths, fsutil, untrusted), prompts/ (FIM tokens) and
decoding/ (the constraint's Vocabulary protocol, vocab_map). Nothing above it (drafting/, runtime/, server/, cli/).
Importing this package loads nothing: llama.cpp's libraries load when binding is imported.
"""
