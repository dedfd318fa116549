"""prompts/: text to token ids before anything is decoded.

Owns: chat templates and the conversation segments they render (chat_template), the fill-in-the-middle layout and
its clipping (infill). Pure Python over a vocabulary's tokenize; never loads a model.

May import: edgespec's base modules (config, errors, stats, paths, fsutil, untrusted) only.
"""
