"""`edgespec chat` and edgespec.runtime.chat.ChatSession on the tiny GGUF pair (ChatML template)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.runtime.chat import ChatContextError, ChatError, ChatSession
from edgespec.cli.chat import read_message
from edgespec.decoding.detok import complete_utf8
from edgespec.cli import main
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine

from support.tiny import token_id, write_tiny_model

STATS = re.compile(r"^\[\d+ tokens · [\d.]+ tok/s .*prompt \d+ tok \(\d+ decoded in [\d.]+s.*\]$")
HOT = set("abcdefgh ")
IM_END = 262  # <|im_end|> in the tiny vocabulary: the end-of-generation token


def _args(tiny: dict[str, Path], *extra: str) -> list[str]:
    # one thread: tiny models gain nothing from more, and a spinning pool crawls on a busy machine
    return ["chat", "--target", str(tiny["target"]), "--draft", str(tiny["draft"]), "--temperature", "0", "--threads", "1", *extra]


def _stats_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if STATS.match(ln)]


@pytest.fixture(scope="module")
def engine(tiny):
    # fixed K: the draft drafts every cycle, so its cache reuse is exercised (the adaptive controller may
    # rightly switch a draft off when it costs as much as the target, as tiny models do)
    eng = Engine.load(ModelSpec(str(tiny["target"]), n_ctx=512, n_threads=1), ModelSpec(str(tiny["draft"]), n_ctx=512, n_threads=1), spec=FIXED_K)
    yield eng
    eng.close()


FIXED_K = SpecConfig(draft_max=4, adaptive=False)


@pytest.fixture(scope="module")
def eos_engine(tmp_path_factory):
    """A tiny target that often emits <|im_end|> (it is in its hot set), so answers end like a chat model's."""
    d = tmp_path_factory.mktemp("eos")
    hot = tuple(token_id(c) for c in "abc ") + (IM_END,)
    t = write_tiny_model(d / "eos-target.gguf", seed=1, hot_tokens=hot, name="eos-target")
    dr = write_tiny_model(d / "eos-draft.gguf", seed=2, hot_tokens=hot, layer_scale=0.4, name="eos-draft")
    eng = Engine.load(ModelSpec(str(t), n_ctx=512, n_threads=1), ModelSpec(str(dr), n_ctx=512, n_threads=1), spec=FIXED_K)
    yield eng
    eng.close()


# --------------------------------------------------------------------------------------------- CLI, scripted stdin
def test_chat_scripted_session(tiny, tmp_path):
    save = tmp_path / "conv.json"
    script = "\n".join(
        [
            "hello there",
            "/stats",
            "what is a b c?",
            "/system you are terse",
            "/system",
            "third question",
            f"/save {save}",
            "/reset",
            "/nope",
            "after reset",
        ]
    ) + "\n"
    res = CliRunner().invoke(main, _args(tiny, "--ctx", "512", "--max-tokens", "20"), input=script)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "\x1b[" not in out  # never escape codes when stdout is not a terminal
    lines = out.splitlines()
    stats = _stats_lines(out)
    assert len(stats) == 4, out  # one after each of the four answers
    # every answer is streamed text from the tiny model's hot tokens, directly followed by its stats line
    for i, ln in enumerate(lines):
        if STATS.match(ln):
            answer = lines[i - 1]
            assert answer and set(answer) <= HOT, (answer, out)
    assert re.search(r"^session: 1 turn · 20 tokens · [\d.]+ tok/s", out, re.M), out
    assert "(system prompt set; conversation cleared)" in out
    assert "system: 'you are terse'" in out
    assert "(conversation cleared, system prompt kept)" in out
    assert "unknown command /nope" in out
    data = json.loads(save.read_text())
    assert data["system"] == "you are terse"
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][0]["content"] == "third question"
    assert set(data["messages"][1]["content"]) <= HOT and len(data["messages"][1]["content"]) == 20
    assert data["settings"]["n_ctx"] == 512 and data["settings"]["max_tokens"] == 20
    assert data["settings"]["sampling"]["temperature"] == 0.0
    assert data["settings"]["target"].endswith("tiny-target.gguf")


def test_chat_exit_command_and_multiline(tiny):
    script = 'first\n"""\nline one\n\nline three\n"""\n/exit\nnever sent\n'
    res = CliRunner().invoke(main, _args(tiny, "--ctx", "512", "--max-tokens", "8"), input=script)
    assert res.exit_code == 0, res.output
    assert len(_stats_lines(res.stdout)) == 2


def test_save_unwritable_path_is_one_line_error(tiny, tmp_path):
    bad = tmp_path / "no" / "such" / "dir" / "c.json"
    res = CliRunner().invoke(main, _args(tiny, "--max-tokens", "4"), input=f"hi\n/save {bad}\n/save\nagain\n")
    assert res.exit_code == 0, res.output
    err = [ln for ln in res.stdout.splitlines() if ln.startswith("error:")]
    assert err == [f"error: cannot write {bad}: No such file or directory"]
    assert "usage: /save FILE" in res.stdout
    assert len(_stats_lines(res.stdout)) == 2  # the chat went on


def test_show_draft_never_colours_a_pipe(tiny):
    res = CliRunner().invoke(main, _args(tiny, "--show-draft", "--fixed-k", "--max-tokens", "30"), input="go\n")
    assert res.exit_code == 0, res.output
    assert "\x1b[" not in res.stdout and len(_stats_lines(res.stdout)) == 1


def test_missing_default_models_says_how_to_pull(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("EDGESPEC_TARGET", raising=False)
    monkeypatch.delenv("EDGESPEC_DRAFT", raising=False)
    res = CliRunner().invoke(main, ["chat"], input="hi\n")
    assert res.exit_code == 1
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "edgespec models pull" in err[0] and "not in the cache" in err[0], res.output


# --------------------------------------------------------------------------------------------- context full
def test_context_full_drops_oldest_turns(tiny):
    msgs = [f"question number {i}, tell me more" for i in range(8)]
    res = CliRunner().invoke(
        main, _args(tiny, "--ctx", "128", "--max-tokens", "16", "--system", "be brief"), input="\n".join(msgs) + "\n/stats\n"
    )
    assert res.exit_code == 0, res.output
    out = res.stdout
    stats = _stats_lines(out)
    assert len(stats) == len(msgs), out  # an answer (and its stats line) for every message
    assert all(" 16 tokens" in s or s.startswith("[16 tokens") for s in stats), stats
    notices = [ln for ln in out.splitlines() if "context full: dropped" in ln]
    assert notices, out
    assert re.search(r"session: 8 turns · 128 tokens.*turns dropped for context", out), out


def test_message_too_long_keeps_conversation(tiny):
    long = "x" * 200  # 200 byte tokens: more than the whole context
    res = CliRunner().invoke(
        main, _args(tiny, "--ctx", "128", "--max-tokens", "16"), input=f"short one\n{long}\nshort two\n/stats\n"
    )
    assert res.exit_code == 0, res.output
    assert "! the message does not fit" in res.stdout
    assert len(_stats_lines(res.stdout)) == 2
    assert "session: 2 turns" in res.stdout


def test_session_context_errors(engine):
    # same engine, small answer budget; a message that cannot fit raises and changes nothing
    s = ChatSession(engine, system="sys", sampling=SamplingParams(temperature=0), max_tokens=8)
    s.send("hi").result()
    before = (list(s.messages), list(s.tokens), s.text)
    with pytest.raises(ChatContextError):
        s.send("y" * 600)
    assert (s.messages, s.tokens, s.text) == before
    s.send("ok").result()
    assert len(s.messages) == 4


# --------------------------------------------------------------------------------------------- KV reuse
def _check_second_turn_reuse(eng: Engine, first: "object", session: ChatSession, msg: str, expect_delta_start: str):
    conv_before = session.conversation()
    full = eng.render(conv_before + [{"role": "user", "content": msg}], add_generation_prompt=True)
    assert full.startswith(session.text)
    delta = full[len(session.text):]
    assert delta.startswith(expect_delta_start), repr(delta)
    delta_tokens = eng.target.tokenize(delta, parse_special=True)
    t0, d0 = eng.target.n_decoded, eng.draft.n_decoded
    turn = session.send(msg)
    assert turn.reused and turn.n_new_tokens == len(delta_tokens)
    prompt = turn.prompt_tokens
    assert prompt[: len(session.tokens)] == session.tokens
    # What the target is missing from its cache is only the new message (+ the last answer token, which was
    # sampled but never decoded): the engine decodes exactly that suffix. The draft model may also lag behind by
    # the part of the last answer that it did not draft itself (n-gram or plain cycles), never by more.
    # (in the slot that holds the conversation: the engine gives the turn the one with the longest prefix)
    slot = max(range(eng.parallel), key=lambda i: eng.target.slot(i).common_prefix(prompt))
    t_missing = len(prompt) - eng.target.slot(slot).common_prefix(prompt)
    d_missing = len(prompt) - eng.draft.slot(slot).common_prefix(prompt)
    assert t_missing <= len(delta_tokens) + 1
    assert d_missing <= len(delta_tokens) + 1 + first.stats.n_generated
    assert eng.draft.slot(slot).common_prefix(prompt) >= len(first.prompt_tokens) - 1
    turn.result()
    st = turn.stats
    assert len(delta_tokens) <= st.n_prefill <= len(delta_tokens) + 1
    # all the target decoded for this turn: the new message, then one verify batch per cycle
    assert eng.target.n_decoded - t0 <= st.n_prefill + st.n_cycles + st.n_drafted
    assert st.n_prompt == len(prompt) and st.n_prefill < len(prompt) / 2
    assert eng.draft.n_decoded - d0 <= d_missing + 2 * turn.stats.n_generated + eng.spec.draft_max
    assert first.stats.n_prefill >= len(first.prompt_tokens) - 1  # the first turn had to prefill its whole prompt
    return turn


def test_second_turn_prefills_only_the_new_message(engine):
    engine.reset_caches()  # the module's engine served other tests: start cold
    s = ChatSession(engine, system="You are a helpful assistant. " * 4, sampling=SamplingParams(temperature=0), max_tokens=24)
    first = s.send("Tell me about the alphabet, from a to h.").result()
    assert first.finish_reason == "length" and first.token_ids[-1] != IM_END
    assert s.tokens == first.prompt_tokens + first.token_ids
    # The answer was cut by max_tokens: the delta first closes it with <|im_end|>.
    second = _check_second_turn_reuse(engine, first, s, "And now backwards?", "<|im_end|>\n<|im_start|>user\nAnd now")
    print(
        f"\nturn 1: prompt {first.stats.n_prompt} tok, prefill {first.stats.n_prefill} tok;"
        f" turn 2: prompt {second.stats.n_prompt} tok, prefill {second.stats.n_prefill} tok"
    )
    assert [m["role"] for m in s.messages] == ["user", "assistant"] * 2


def test_second_turn_reuse_after_end_token(eos_engine):
    s = ChatSession(eos_engine, system="sys prompt here", sampling=SamplingParams(temperature=1.0, seed=0), max_tokens=200)
    for seed in range(10):
        s.reset()
        eos_engine.target.reset(), eos_engine.draft.reset()
        s.sampling = SamplingParams(temperature=1.0, seed=seed)
        first = s.send("Hello, model!").result()
        if first.finish_reason == "eos":
            break
    assert first.finish_reason == "eos" and first.token_ids[-1] == IM_END
    assert s.tokens[-1] == IM_END and s.text.endswith("<|im_end|>")
    assert s.messages[-1]["content"] == first.text and "<|im_end|>" not in first.text
    _check_second_turn_reuse(eos_engine, first, s, "second message", "\n<|im_start|>user\nsecond message")


@pytest.fixture(scope="module")
def long_engine(tiny):
    """Room for answers that take seconds: a test that interrupts one must not race its natural end."""
    eng = Engine.load(ModelSpec(str(tiny["target"]), n_ctx=LONG_CTX, n_threads=1),
                      ModelSpec(str(tiny["draft"]), n_ctx=LONG_CTX, n_threads=1), spec=FIXED_K)
    yield eng
    eng.close()


LONG_CTX = 16384
LONG = 8000  # max_tokens of an answer that a test interrupts (seconds of work even on a fast CPU)


def test_interrupted_turn_keeps_conversation_consistent(long_engine):
    s = ChatSession(long_engine, sampling=SamplingParams(temperature=0), max_tokens=LONG)
    turn = s.send("start")
    shown = ""
    for i, chunk in enumerate(turn):
        shown += chunk.text
        if i == 4:
            break
    turn.close()
    assert turn.interrupted and turn.finish_reason == "interrupted"
    assert s.messages[-1] == {"role": "assistant", "content": turn.text}
    assert turn.text.startswith(shown) and 0 < len(turn.token_ids) < LONG
    assert s.tokens == turn.prompt_tokens + turn.token_ids
    s.max_tokens = 40
    nxt = s.send("continue")
    assert nxt.reused  # the partial answer + <|im_end|> delta still extends the token sequence
    nxt.result()
    assert nxt.stats.n_prefill <= nxt.n_new_tokens + 1
    assert s.totals.runs == 2 and s.totals.interrupted == 1


def test_saving_mid_answer_records_it_so_far_and_lets_it_go_on(long_engine, tmp_path):
    """An app's autosave while an answer streams: a snapshot, never the end of the answer."""
    s = ChatSession(long_engine, sampling=SamplingParams(temperature=0), max_tokens=400)
    s.send("first").result()
    turn = s.send("second")
    it = iter(turn)
    for _ in range(3):
        next(it)
    saved = json.loads(s.save(tmp_path / "auto.json").read_text())
    msgs = saved["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"] and msgs[2]["content"] == "second"
    assert msgs[3]["content"] and turn.text.startswith(msgs[3]["content"])
    turn.result()
    assert not turn.interrupted and turn.finish_reason == "length" and len(turn.token_ids) == 400
    assert s.as_dict()["messages"][-1]["content"] == turn.text


@pytest.mark.parametrize("kwargs,match", [(dict(stop=5), "stop"), (dict(stop=[1]), "stop"), (dict(max_tokens=0), "max_tokens")])
def test_chat_session_misuse_is_a_chat_error(engine, kwargs, match):
    with pytest.raises(ChatError, match=match):
        ChatSession(engine, **kwargs)


def test_stop_none_and_save_to_a_non_path(engine):
    s = ChatSession(engine, sampling=SamplingParams(temperature=0), max_tokens=4, stop=None)
    assert s.stop == ()
    with pytest.raises(ChatError, match="must be a path"):
        s.save(5)  # type: ignore[arg-type]


def test_abandoned_turn_is_settled_by_the_next_send(long_engine):
    s = ChatSession(long_engine, sampling=SamplingParams(temperature=0), max_tokens=LONG)
    t1 = s.send("one")
    next(iter(t1))
    s.max_tokens = 40
    s.send("two").result()  # t1 is closed and recorded first
    assert t1.done and t1.interrupted
    assert [m["content"] for m in s.messages if m["role"] == "user"] == ["one", "two"]


def test_reset_and_system(engine, tmp_path):
    s = ChatSession(engine, system="a", sampling=SamplingParams(temperature=0), max_tokens=5)
    s.send("hi").result()
    s.reset()
    assert s.messages == [] and s.tokens == [] and s.system == "a"
    s.set_system("b")
    assert s.system == "b" and s.messages == []
    t = s.send("hi").result()
    assert "<|im_start|>system\nb<|im_end|>" in t.prompt_text
    p = s.save(tmp_path / "x.json")
    assert json.loads(p.read_text())["messages"][0] == {"role": "user", "content": "hi"}
    with pytest.raises(ChatError, match="cannot write"):
        s.save(tmp_path / "missing" / "x.json")


# --------------------------------------------------------------------------------------------- helpers
def _reader(lines):
    it = iter(lines)

    def read(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    return read


def test_read_message_multiline():
    assert read_message(_reader(["plain"]), "", "") == "plain"
    assert read_message(_reader(['"""', "a", "", "b", '"""', "next"]), "", "") == "a\n\nb"
    assert read_message(_reader(['"""first', "second last"' """']), "", "") == "first\nsecond last "
    assert read_message(_reader(['"""one line"""']), "", "") == "one line"
    assert read_message(_reader(['"""', "unclosed"]), "", "") == "unclosed"


def test_complete_utf8_drops_a_cut_character():
    pieces = {1: b"a", 2: "é".encode()[:1], 3: "é".encode()[1:], 4: "€".encode()[:2]}
    tb = pieces.__getitem__
    assert complete_utf8([1, 2, 3], tb) == [1, 2, 3]
    assert complete_utf8([1, 2], tb) == [1]
    assert complete_utf8([1, 2, 3, 4], tb) == [1, 2, 3]


def test_pull_flag_pulls_the_default_pair_first(tmp_path, monkeypatch):
    import edgespec.models as models

    calls = []
    monkeypatch.setattr(models, "pull", lambda pair=None, **kw: calls.append((pair, kw)) or {})
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("EDGESPEC_TARGET", raising=False)
    monkeypatch.delenv("EDGESPEC_DRAFT", raising=False)
    res = CliRunner().invoke(main, ["chat", "--pull"], input="")
    assert calls == [(None, {"progress": True})]
    assert res.exit_code == 1 and "edgespec models pull" in res.stderr  # the (fake) pull fetched nothing


# --------------------------------------------------------------------------------------------- hostile input
def test_a_failed_save_keeps_the_previous_file(engine, tmp_path, monkeypatch):
    import errno
    import os

    s = ChatSession(engine, sampling=SamplingParams(temperature=0), max_tokens=4)
    s.send("hi").result()
    path = tmp_path / "conv.json"
    s.save(path)
    before = path.read_bytes()
    s.send("again").result()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ChatError, match="No space left"):
        s.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before  # the old save is intact
    assert [p.name for p in tmp_path.iterdir()] == ["conv.json"]  # and no temporary file is left behind
    with pytest.raises(ChatError, match="directory"):
        s.save(tmp_path)


def test_a_system_prompt_larger_than_the_context_is_refused(engine):
    s = ChatSession(engine, sampling=SamplingParams(temperature=0), max_tokens=8)
    with pytest.raises(ChatContextError, match="system prompt does not fit"):
        s.set_system("x" * 600)
    assert s.system is None
    t = s.send("hi").result()  # the chat goes on, and short messages are answered
    assert t.stats.n_generated > 0


def test_target_alone_with_a_discovered_draft_that_does_not_fit(tiny, monkeypatch, tmp_path):
    """--target X without --draft is --draft auto: a discovered model that does not share X's tokenizer is never
    picked; with none that does, the free lookup (tests/cli/test_models_cli.py: one that does is picked)."""
    import shutil

    monkeypatch.delenv("EDGESPEC_DRAFT", raising=False)
    (tmp_path / "mine").mkdir()
    shutil.copy(tiny["mismatch_size"], tmp_path / "mine" / "small.gguf")
    monkeypatch.setenv("EDGESPEC_MODEL_DIRS", str(tmp_path / "mine"))
    res = CliRunner().invoke(main, ["generate", "abc", "--target", str(tiny["target"]), "--max-tokens", "4", "--ctx", "256", "--json"])
    assert res.exit_code == 0, res.output
    assert "note: --draft auto: no draft model for tiny-target.gguf (no model found on this machine shares its tokenizer" in res.stderr


def test_save_never_replaces_a_device_or_a_symlink(engine, tmp_path):
    import os

    s = ChatSession(engine, sampling=SamplingParams(temperature=0), max_tokens=2)
    s.send("hi").result()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ChatError, match="not a regular file"):
        s.save(fifo)
    assert fifo.is_fifo()
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    s.save(link)
    assert link.is_symlink() and json.loads(real.read_text())["messages"][0]["content"] == "hi"


def test_a_turn_can_be_constrained_and_a_bad_constraint_changes_nothing(engine):
    """send(text, constraint=...): the answer matches the constraint (20 seeds, temperature 1) and joins the
    conversation; an unusable constraint is a ChatError with the conversation as it was."""
    from edgespec.decoding.constraint import Constraint

    s = ChatSession(engine, sampling=SamplingParams(temperature=1.0, seed=3), max_tokens=40)
    s.send("first").result()
    before = (list(s.messages), list(s.tokens))
    with pytest.raises(ChatError, match="allows no output"):
        s.send("x", constraint=Constraint.regex("[^\\x00-\\U0010ffff]"))
    with pytest.raises(ChatError):
        s.send("x", constraint={"type": "json_schema"})  # an OpenAI response_format without its schema
    assert (s.messages, s.tokens) == before
    for seed in range(20):
        s.sampling = SamplingParams(temperature=1.0, seed=seed)
        turn = s.send("pick", constraint=Constraint.regex(r"(ab|cd)[e-h]{2}")).result()
        assert re.fullmatch(r"(ab|cd)[e-h]{2}", turn.text), turn.text
        assert s.messages[-1] == {"role": "assistant", "content": turn.text}
    assert s.send("free again").result().finish_reason in ("length", "stop")
