"""`edgespec chat` end to end in a real pseudo-terminal (prompt_toolkit input, SIGINT from the terminal)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a real pseudo-terminal and process: make test runs it, make test-fast does not

pexpect = pytest.importorskip("pexpect")

EXE = Path(sys.executable).with_name("edgespec")
STATS = re.compile(r"\[(\d+) tokens · [\d.]+ tok/s[^\]\n]*prompt \d+ tok \((\d+) decoded in [\d.]+s[^)]*\)([^\]\n]*)\]")
# The "> " prompt as prompt_toolkit draws it (it may move the cursor instead of writing the space).
PROMPT = re.compile(r">(?: |\x08\x1b\[2C|\x1b\[1C)")


@pytest.mark.skipif(not EXE.exists(), reason="the edgespec script is not installed next to this Python")
@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_chat_in_a_terminal(tiny, tmp_path):
    env = dict(os.environ)
    env.update(
        TERM="xterm-256color",
        PROMPT_TOOLKIT_NO_CPR="1",  # do not wait for cursor-position replies pexpect would not send
        EDGESPEC_DATA_DIR=str(tmp_path / "data"),
    )
    env.pop("EDGESPEC_TARGET", None)
    env.pop("EDGESPEC_DRAFT", None)
    args = [
        "chat", "--target", str(tiny["target"]), "--draft", "ngram",  # free drafter: never switched off
        "--temperature", "1.0", "--max-tokens", "2000", "--ctx", "4096",
        "--threads", "1",  # one thread: steady speed on a busy machine (no spinning thread pool)
        "--show-draft",
    ]  # fmt: skip
    child = pexpect.spawn(str(EXE), args, env=env, encoding="utf-8", timeout=60, dimensions=(50, 200))
    try:
        child.expect("edgespec chat · target tiny-target")
        child.expect(PROMPT)

        # 1. a long answer (tiny models never emit <|im_end|>): see it stream, then Ctrl-C in the middle of it
        child.send("hello there\r")
        # 60 characters of streamed text from the tiny model's hot tokens (so n1 > 40 below); --show-draft colours the
        # accepted drafts, so colour codes may come between them
        child.expect(r"(?:(?:\x1b\[[0-9;]*m)*[a-h ]){60}")
        child.sendintr()
        child.expect(STATS)
        n1, prefill1, tail1 = int(child.match.group(1)), int(child.match.group(2)), child.match.group(3)
        assert "interrupted" in tail1 and 0 < n1 < 2000
        child.expect(PROMPT)  # back at the prompt

        # 2. ask again: a complete answer and its stats line; only the new message is prefilled although the
        #    conversation now holds the interrupted answer too
        child.send("and again\r")
        child.expect(STATS)
        n2, prefill2, tail2 = int(child.match.group(1)), int(child.match.group(2)), child.match.group(3)
        assert n2 == 2000 and "length" in tail2, child.match.group(0)
        assert prefill2 < 40 < n1, (prefill1, prefill2, n1)
        screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before)  # drop colours and cursor movements
        answer = screen.rsplit("and again", 1)[1]  # after the last redraw of the typed line
        assert len(re.sub(r"\s", "", answer)) > 1000 and set(answer.strip()) <= set("abcdefgh \r\n")
        assert "\x1b[36m" in child.before  # --show-draft colours accepted draft text on a terminal
        child.expect(PROMPT)

        # 3. Ctrl-C with text on the line clears it (so "junk" is not sent), then /exit leaves with status 0
        child.send("junk")
        child.sendcontrol("c")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert (tmp_path / "data" / "chat_history").read_text().count("+and again") == 1
