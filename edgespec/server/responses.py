"""What the server writes back: `GenerationResponse`, the ASGI response that writes one generation (the OpenAI
chat/completions shapes, as one JSON answer or as server-sent events) while watching for the client leaving, and
that the other routes' writers subclass; its statistics (`usage`, llama-server's `timings`, and `edgespec`); the
ignored-parameters header. Tool calls in an answer are read here only (structured.parse_tool_calls and
structured.ToolCallSplitter), for every route."""

from __future__ import annotations

import logging
import re
import secrets
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

import anyio
from starlette.types import Receive, Scope, Send

from edgespec import __version__
from edgespec.decoding.structured import ToolCallSplitter, parse_tool_calls
from . import sse
from .core import api_error, send_json
from .api_errors import APIError
from .schema import CompletionRequest

if TYPE_CHECKING:  # pragma: no cover
    from .core import RequestRecord, ServerState

log = logging.getLogger("edgespec.server")
# "constraint": the grammar dead-ended (the output is incomplete); not one of OpenAI's values, on purpose
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "constraint": "constraint"}
IGNORED_HEADER = "X-Edgespec-Ignored-Params"
_logged_ignored: set[str] = set()  # parameter names already logged as ignored (once per name per process)


_MAX_LOGGED_IGNORED = 1024  # names remembered as logged (a client inventing new keys must not grow memory forever)
_NOT_HEADER_SAFE = re.compile(r"[^\x21-\x7e]")  # visible ASCII only: no space, CR, LF, NUL or other control


def header_safe(name: str) -> str:
    """A parameter name as it may appear in a header value (and a log line): visible ASCII only (any other character,
    a CR, LF or NUL included, becomes "?"), at most 64 characters. A header value is never built from raw client
    text: h11 refuses a CR or LF in one and the client would get no response at all."""
    return _NOT_HEADER_SAFE.sub("?", name[:64])


def ignored_headers(ignored: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The response header that lists the request keys this server did not read; each name is also logged once."""
    if not ignored:
        return {}
    names = [header_safe(k) for k in ignored]
    new = [k for k in names if k not in _logged_ignored]
    if new:
        if len(_logged_ignored) < _MAX_LOGGED_IGNORED:
            _logged_ignored.update(new)
        log.warning("ignored request parameter(s): %s (listed in the %s response header)", ", ".join(new), IGNORED_HEADER)
    return {IGNORED_HEADER: ", ".join(names)}


def usage(stats: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.n_prompt,
        "completion_tokens": stats.n_generated,
        "total_tokens": stats.n_prompt + stats.n_generated,
        "prompt_tokens_details": {"cached_tokens": stats.n_cached},
    }


def timings(stats: Any) -> dict[str, Any]:
    """llama-server's per-request `timings` (its field names; other servers and tools read them)."""
    prompt_n = stats.n_prefill
    prompt_ms = stats.timings.prefill * 1000
    predicted_n = stats.n_generated
    predicted_ms = stats.decode_seconds * 1000 if predicted_n else 0.0
    return {
        "cache_n": stats.n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(prompt_n * 1000 / prompt_ms, 3) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(predicted_n * 1000 / predicted_ms, 3) if predicted_ms > 0 else 0.0,
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
    }


def source_class(source: str) -> str:
    """A chunk's token source (job.Chunk.source) as the stream names it: "draft" (a draft model's accepted token),
    "lookup" (an n-gram lookup's or the suffix index's) or "target" (the target's own token)."""
    if source == "model":
        return "draft"
    return "target" if source in ("target", "plain") else "lookup"


def edgespec_stats(stats: Any, req: CompletionRequest, drafter: str) -> dict[str, Any]:
    """The speculation statistics: μ, acceptance (overall, by draft position, by source), cycles, the time split."""
    d = stats.as_dict()
    for k in ("costs", "controller", "stop_reason"):
        d.pop(k, None)
    d["drafter"] = drafter if req.speculative else "none"
    return d



class ClientStalled(Exception):
    """A write to the client did not complete within Settings.stall_timeout: it does not read its response."""


class GenerationResponse:
    """An ASGI response that writes one generation (JSON or SSE) while watching for the client leaving.

    Backpressure: the generation pauses while BACKLOG chunks wait for this writer (core.generate sets it), and each
    write waits for the client to take what the transport holds (uvicorn's flow control, past 64 KiB): a client that
    does not read holds a bounded amount of memory. A write that waits longer than Settings.stall_timeout cancels the
    generation and closes the connection (ClientStalled)."""

    admission: Any = None  # core.Admission: this request counted in flight until it is written (set by core.generate)
    _keep_logprobs = True  # keep every token's logprobs for the end (a stream that sends them as it goes does not)

    def __init__(self, state: ServerState, req: CompletionRequest, gen: Any, record: RequestRecord) -> None:
        self.state = state
        self.req = req
        self.gen = gen
        self.record = record
        self.client_left = False
        self.created = int(time.time())
        self.id = ("chatcmpl-" if req.kind == "chat" else "cmpl-") + secrets.token_hex(12)
        self.model = state.model_id
        self.drafter = req.drafter or state.loaded.drafter_kind
        self.spans: list[list[int]] = []  # [start, end) character ranges of text from accepted drafts
        self._chars = 0
        self.headers = ignored_headers(req.ignored)
        self.logprobs: list[Any] = []  # speculate.TokenLogprob of every token so far (when asked for)
        self.prompt_ids: list[int] = []  # the prompt's tokens (set by core.generate)

    # -- tool calls (every route reads them here)
    def _tool_names(self) -> list[str] | None:
        """The offered tools' names when this answer may hold tool calls, else None."""
        return [t.name for t in self.req.tools] if self.req.kind == "chat" and self.req.tool_choice != "none" else None

    def _tool_calls_in(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, OpenAI tool calls) of the whole answer (structured.parse_tool_calls); (text, []) without tools."""
        names = self._tool_names()
        return parse_tool_calls(text, names) if names is not None else (text, [])

    def _tool_splitter(self) -> ToolCallSplitter | None:
        """For a stream: what of each chunk's text can go out at once (structured.ToolCallSplitter); None without tools."""
        names = self._tool_names()
        return ToolCallSplitter(names) if names is not None else None

    # -- the client leaving
    def _left(self) -> None:
        if self.client_left or self.gen.done:
            return
        self.client_left = True
        self.gen.cancel()
        self.record.client_left = True
        self.record.tokens_at_cancel = len(self.gen.token_ids)

    async def _watch(self, receive: Receive, gone: anyio.Event) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._left()
                gone.set()
                return

    def _stalled(self) -> None:
        """The client stopped reading for stall_timeout: cancel the generation (as if the client had left)."""
        if not self.gen.done:
            self.gen.cancel()
        self.state.metrics.stalled += 1
        if not self.client_left:
            self.client_left = True
            self.record.client_left = True
            self.record.tokens_at_cancel = len(self.gen.token_ids)
        self.record.stalled = True
        log.warning("a client did not read its response for %g s: its generation was cancelled and its connection closed",
                    self.state.settings.stall_timeout)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.admission is None:  # made outside core.generate: counted in flight here, without a limit
            from .core import Admission

            self.admission = Admission.count(self.state, "")
        self.state.live.add(self)
        if self.state.closing:
            self.gen.cancel()
        timeout = self.state.settings.stall_timeout
        # serve's HTTP protocol lends the connection's abort (cli/serve.py); elsewhere a stalled response just ends
        abort = (scope.get("extensions") or {}).get("edgespec.abort")
        gone = anyio.Event()

        async def guarded(message: Any) -> None:
            with anyio.move_on_after(timeout) as waited:
                await send(message)
            if waited.cancelled_caught:
                raise ClientStalled

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, receive, gone)
                try:
                    if self.req.stream:
                        await self._stream(guarded)
                    else:
                        await self._complete(guarded)
                except OSError:  # a write to a client that has gone (servers that raise instead of ignoring it)
                    self._left()
                    await self._drain()
                except ClientStalled:
                    self._stalled()
                    if abort is not None:
                        abort()  # what the transport holds is dropped now, not when the client reads it
                        with anyio.move_on_after(1.0):
                            await gone.wait()  # (the server has seen the connection go: the response needs no end)
                    await self._drain()
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if not self.gen.done:
                self.gen.cancel()  # this task was cancelled (server shutting down): the job stops too
            self._finish()

    async def _drain(self) -> None:
        async for _ in self._chunks():
            pass

    async def _chunks(self) -> AsyncIterator[Any]:
        """The generation's chunks; where it fails (an engine error, a lost RPC server) the iteration just ends, and
        _outcome reports the error to the client."""
        try:
            async for chunk in self.gen:
                yield chunk
        except Exception:
            if not self.gen.done or self._error() is None:
                raise

    def _error(self) -> BaseException | None:
        try:
            self.gen.result(timeout=0)
        except TimeoutError:
            return None
        except BaseException as e:  # noqa: BLE001 - the generation's own error, reported to the client
            return e
        return None

    def _track(self, chunk: Any) -> None:
        if chunk.logprobs and self._keep_logprobs:
            self.logprobs.extend(chunk.logprobs)
        n = len(chunk.text)
        if self.req.show_draft and chunk.from_draft and n:
            if self.spans and self.spans[-1][1] == self._chars:
                self.spans[-1][1] += n
            else:
                self.spans.append([self._chars, self._chars + n])
        self._chars += n

    def _stats_fields(self) -> dict[str, Any]:
        stats = self.gen.stats
        out = {"timings": timings(stats), "edgespec": edgespec_stats(stats, self.req, self.drafter)}
        if self.req.show_draft:
            out["edgespec"]["draft_spans"] = self.spans
        return out

    # -- logprobs
    def _token(self, t: int) -> tuple[str, list[int]]:
        data = self.state.loaded.target.token_bytes(t)
        return data.decode("utf-8", "replace"), list(data)

    def _logprobs(self, lps: list[Any] | None) -> dict[str, Any] | None:
        """OpenAI's logprobs object for these tokens (chat: {"content": [...]}, completions: tokens/token_logprobs/
        top_logprobs/text_offset), or None when the request did not ask."""
        if self.req.logprobs is None or lps is None:
            return None
        if self.req.kind == "chat":
            return {"content": self._token_logprobs(lps), "refusal": None}
        tokens, values, tops_c, offsets = [], [], [], []
        offset = self._lp_offset
        for lp in lps:
            text, _ = self._token(lp.token)
            tokens.append(text)
            values.append(_finite(lp.logprob))
            tops_c.append({self._token(t)[0]: _finite(v) for t, v in lp.top})
            offsets.append(offset)
            offset += len(text)
        self._lp_offset = offset
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops_c, "text_offset": offsets}

    _lp_offset = 0

    def _token_logprobs(self, lps: list[Any]) -> list[dict[str, Any]]:
        """Per token {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]} (OpenAI chat's
        entries, which Ollama's logprobs are too)."""
        content = []
        for lp in lps:
            text, data = self._token(lp.token)
            tops = []
            for t, v in lp.top:
                tt, tb = self._token(t)
                tops.append({"token": tt, "logprob": _finite(v), "bytes": tb})
            content.append({"token": text, "logprob": _finite(lp.logprob), "bytes": data, "top_logprobs": tops})
        return content

    # -- non-streaming
    async def _run_to_end(self, send: Send) -> str | None:
        """Read the generation to its end: its finish reason, or None when the client left or an error was sent."""
        async for chunk in self._chunks():
            self._track(chunk)
        if self.client_left:
            return None
        api, reason = self._outcome()
        if api is not None:
            await send_json(send, api.status, api.body(), api.headers)
            return None
        return reason

    async def _complete(self, send: Send) -> None:
        reason = await self._run_to_end(send)
        if reason is None:
            return
        stats = self.gen.stats
        text = self.gen.text
        if self.req.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            content, calls = self._tool_calls_in(text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = "tool_calls" if reason == "stop" else reason
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": self._logprobs(self.logprobs), "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": self._logprobs(self.logprobs), "finish_reason": reason}
            obj = "text_completion"
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"edgespec-{__version__}",
            "choices": [choice],
            "usage": usage(stats),
            **self._stats_fields(),
        }
        await send_json(send, 200, body, self.headers)

    # -- streaming
    def _chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.req.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"edgespec-{__version__}",
            "choices": [choice] if choice else [],
        }
        if self.req.include_usage:
            out["usage"] = None
        out.update(extra)
        return out

    def _delta_choice(self, text: str | None, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if self.req.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def _text_template(self) -> tuple[bytes, bytes]:
        """The bytes around the text of a content chunk, built once (the JSON of a chunk minus its text)."""
        marker = "\ue000edgespec\ue000"
        frame = sse.event(self._chunk(self._delta_choice(marker, None)))
        head, tail = frame.split(sse.dumps(marker))
        return head, tail

    async def _start(self, send: Send, headers: list[tuple[bytes, bytes]] = sse.HEADERS) -> None:
        """The 200 status line of a stream, with its headers and this request's ignored-parameter header."""
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": list(headers) + extra})

    async def _stream(self, send: Send) -> None:
        self._keep_logprobs = False  # each chunk's logprobs go out with it; none are needed at the end
        await self._start(send)

        async def body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if self.req.kind == "chat":
            await body(sse.event(self._chunk(self._delta_choice("", None, role=True))))
        head, tail = self._text_template()
        # with tools, text that may start a tool call is held back (structured.ToolCallSplitter): what cannot streams
        # as content at once; the held rest is sent at the end, as tool_calls deltas (per call one delta with its id
        # and name, one with its arguments) where it holds calls, else as content
        splitter = self._tool_splitter()
        async for chunk in self._chunks():
            self._track(chunk)
            if self.client_left or not chunk.text:
                continue
            text = chunk.text if splitter is None else splitter.feed(chunk.text)
            if text == chunk.text and (self.req.show_draft or self.req.show_sources or self.req.logprobs is not None):
                choice = self._delta_choice(chunk.text, None)
                if self.req.show_draft:
                    choice["from_draft"] = chunk.from_draft
                if self.req.show_sources:
                    cls = source_class(chunk.source)
                    choice["sources"] = [[p, cls] for p in (chunk.pieces or [chunk.text]) if p]
                if self.req.logprobs is not None:
                    choice["logprobs"] = self._logprobs(chunk.logprobs or [])
                await body(sse.event(self._chunk(choice)))
            elif text:
                await body(head + sse.dumps(text) + tail)
        if self.client_left:
            return
        api, reason = self._outcome()
        if api is not None:
            await body(sse.event(api.body()))
        else:
            if splitter is not None:
                rest, calls = splitter.finish()
                if rest:
                    await body(head + sse.dumps(rest) + tail)
                for i, call in enumerate(calls):
                    fn = call["function"]
                    first = {"index": i, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
                    for part in (first, {"index": i, "function": {"arguments": fn["arguments"]}}):
                        delta = {"index": 0, "delta": {"tool_calls": [part]}, "logprobs": None, "finish_reason": None}
                        await body(sse.event(self._chunk(delta)))
                if calls and reason == "stop":
                    reason = "tool_calls"
            stats = self.gen.stats
            extra = self._stats_fields()
            if not self.req.include_usage:
                extra["usage"] = usage(stats)
            await body(sse.event(self._chunk(self._delta_choice(None if self.req.kind == "chat" else "", reason), **extra)))
            if self.req.include_usage:
                await body(sse.event(self._chunk({}, usage=usage(stats))))
            await body(sse.DONE)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- bookkeeping
    def _outcome(self) -> tuple[APIError | None, str]:
        """How the finished generation ends for this client: an error (the engine's, or a cancel by the server that
        is shutting down, not by this client), else the OpenAI finish reason."""
        err = self._error()
        if err is not None:
            return api_error(err), ""
        reason = FINISH.get(self.gen.finish_reason)
        if reason is None:
            return APIError(503, "the generation was cancelled: the server is shutting down", code="shutting_down"), ""
        return None, reason

    def _finish(self) -> None:
        self.state.live.discard(self)
        m = self.state.metrics
        if self.admission is not None:
            self.admission.release()
        rec = self.record
        stats = self.gen.stats
        err = self._error() if self.gen.done else None
        rec.done = self.gen.done
        rec.n_generated = len(self.gen.token_ids)
        rec.started = self.gen.started
        rec.finish_reason = "error" if err is not None else (stats.stop_reason or "cancelled")
        if err is not None:
            rec.error = str(err)
        if rec.client_left:
            m.cancelled["running" if rec.started else "queued"] += 1
            rec.overrun = max(0, rec.n_generated - (rec.tokens_at_cancel or 0))
            m.cancel_overrun_max = max(m.cancel_overrun_max, rec.overrun)
        finish = "error" if err is not None else FINISH.get(stats.stop_reason, "cancelled")
        m.record_generation(stats, finish)
        self.state.records.append(rec)  # a deque of at most settings.history


def _finite(v: float) -> float:
    """JSON has no -inf: a token of probability 0 (outside the kept set) is reported as -9999.0, as llama-server does."""
    return v if v > -9999.0 else -9999.0


__all__ = ["GenerationResponse", "header_safe", "ignored_headers", "IGNORED_HEADER", "usage", "timings", "edgespec_stats", "source_class",
           "FINISH"]
