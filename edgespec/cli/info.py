"""`edgespec info FILE [DRAFT]`: what a GGUF file is, and whether two files can be paired (and how: the same
vocabulary, special tokens mapped, a vocabulary intersection with its coverage, or not worth drafting)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .common import out


def _threads() -> dict[str, Any]:
    """What a model loaded now without --threads would use (the engine follows the machine's load among these)."""
    from edgespec.llama.backend import default_threads
    from edgespec.llama.threads import candidate_counts

    cands = candidate_counts(default_threads())
    return {"mode": "auto", "candidates": list(cands)} if len(cands) > 1 else {"mode": "fixed", "current": cands[0]}


def _file(name: str) -> str:
    """A path as given; a model's name (`edgespec models list`) as its file."""
    import os

    if os.path.lexists(os.path.expanduser(name)) or os.sep in name:
        return name
    from edgespec.models import resolve_path

    return str(resolve_path(name, "target"))


@click.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--rpc", metavar="HOST:PORT,...", default=None, help="Also show these RPC servers: their devices and free memory.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info(files: tuple[str, ...], rpc: str | None, as_json: bool) -> None:
    """Describe a GGUF file (a path or a model's name); with two (TARGET DRAFT), say whether they can be paired; with --rpc, the servers."""
    from edgespec.config import check_rpc_endpoints
    from edgespec.llama.gguf_check import check_pair, inspect_gguf
    from edgespec.llama.vocab_pair import pair_vocab

    if len(files) > 2:
        raise click.UsageError("give one file, or two (target then draft)")
    endpoints = check_rpc_endpoints(rpc)
    if not files and not endpoints:
        raise click.UsageError("give a GGUF file (or two: target then draft), or --rpc HOST:PORT")
    infos = [inspect_gguf(_file(f)) for f in files]
    result: dict[str, Any] = {"files": [i.summary() for i in infos]}
    if endpoints:
        from edgespec.llama import rpc as rpc_mod

        result["rpc"] = rpc_mod.describe(endpoints)
    if len(infos) == 2:
        c = check_pair(infos[0], infos[1])
        result["compatible"] = c.ok
        result["problems"] = list(c.problems)
        pair = pair_vocab(infos[0], infos[1])
        result["vocabulary"] = pair.describe()
    result["threads"] = _threads()
    if as_json:
        out(json.dumps(result, indent=2))
    else:
        for i in infos:
            s = i.summary()
            out(f"{s['path']}")
            out(f"  name          {s['name']}")
            out(f"  architecture  {s['architecture']}")
            out(f"  parameters    {s['parameters'] / 1e9:.3f} B ({s['parameters']:,})")
            out(f"  quantization  {s['quantization']}  ({', '.join(f'{k}×{v}' for k, v in sorted(s['tensor_types'].items()))})")
            out(f"  file size     {s['file_size'] / 2**20:.1f} MiB")
            out(f"  context       {s['context_length']}")
            out(f"  vocabulary    {s['vocab_size']} tokens ({s['tokenizer']}, pre {s['tokenizer_pre']}), "
                f"bos {s['bos_token_id']}, eos {s['eos_token_id']}, add_bos {s['add_bos_token']}")
            out(f"  chat template {'yes' if s['chat_template'] else 'no (ChatML fallback)'}")
        t = result["threads"]
        out(f"threads: {t['mode']}, " + (f"the faster of {'/'.join(map(str, t['candidates']))} by measured decode speed (--threads N fixes it)"
                                          if t["mode"] == "auto" else f"{t['current']}"))
        for server in result.get("rpc", []):
            out(f"rpc {server['endpoint']}: protocol {server['protocol'] or '?'}, {len(server['devices'])} device(s)")
            for d in server["devices"]:
                out(f"  {d['name']:<12} {d['free'] / 2**20:,.0f} MiB free of {d['total'] / 2**20:,.0f} MiB")
        if len(infos) == 2:
            out("pair: " + ("compatible" if result["compatible"] else "differs: " + "; ".join(result["problems"])))
            out(f"drafting: {pair.line()}")
    if len(infos) == 2 and result["vocabulary"]["mode"] == "none":
        sys.exit(1)
