"""SGLang's ``/generate`` stream: the ``data:`` payloads of its SSE events, folded into
cumulative state whether the server streams cumulative chunks or deltas.
"""

from __future__ import annotations

from .._exceptions import EngineHTTPError
from ._types import StreamChunk
from ._wire import (
    as_int,
    build_result,
    error_from_status,
    int_list,
    logprob_entries,
    malformed_answer,
    output_text,
    raise_for_abort_status,
    split_meta,
)

__all__ = ["DONE", "StreamAccumulator", "sse_data"]

DONE = "[DONE]"
"""The payload of SGLang's last SSE event (``data: [DONE]``)."""


def sse_data(line: str) -> str | None:
    """Return the payload of an SSE ``data:`` line, or ``None`` for anything else."""
    if not line.startswith("data:"):
        return None  # blank separators, comments (":") and other fields
    payload = line[5:]
    return payload[1:] if payload.startswith(" ") else payload


class StreamAccumulator:
    """Fold SGLang stream chunks into cumulative state.

    SGLang streams cumulative chunks, or deltas under ``--incremental-streaming-output``;
    ``meta_info.completion_tokens`` is cumulative in both, which tells them apart.
    ``output_token_logprobs`` comes first: an abort chunk carries only the last id.
    """

    def __init__(self, *, rid: str, prompt_tokens_hint: int, server_url: str | None) -> None:
        self._rid = rid
        self._hint = prompt_tokens_hint
        self._url = server_url
        self._ids: list[int] = []
        self._logprobs: list[float] | None = None
        self.output_text: str | None = None
        self._done = False

    @property
    def finished(self) -> bool:
        return self._done

    def add(self, chunk: object) -> StreamChunk:
        """Fold one decoded ``data:`` payload; raise on an error event."""
        if self._done:
            raise malformed_answer("stream", "a chunk arrived after the final chunk")
        if isinstance(chunk, dict) and "error" in chunk:
            raise self._stream_error(chunk["error"])
        obj, meta = split_meta(chunk, what="stream chunk")
        completion = meta.get("completion_tokens")
        total = None if completion is None else as_int(completion, what="completion_tokens")
        raw_finish = meta.get("finish_reason")
        raise_for_abort_status(raw_finish, url=self._url)
        is_abort = isinstance(raw_finish, dict) and raw_finish.get("type") == "abort"
        raw_ids = obj.get("output_ids")
        ids = [] if raw_ids is None else int_list(raw_ids, what="output_ids")
        before = len(self._ids)

        cumulative: bool
        if meta.get("output_token_logprobs") is not None:
            lp_ids, lps = logprob_entries(meta["output_token_logprobs"])
            cumulative = self._is_cumulative(lp_ids, total)
            new_ids = lp_ids if cumulative else self._ids + lp_ids
            prev_lps = self._logprobs or []
            self._logprobs = lps if cumulative else prev_lps + lps
            if ids and new_ids[-len(ids) :] != ids:
                raise malformed_answer(
                    "stream chunk", "output_ids disagree with output_token_logprobs"
                )
        elif is_abort and total == before and len(ids) <= 1:
            # _handle_abort_req sends only the last id of a streamed request.
            cumulative, new_ids = True, list(self._ids)
        else:
            cumulative = self._is_cumulative(ids, total)
            new_ids = ids if cumulative else self._ids + ids
        if total is not None and len(new_ids) != total:
            raise malformed_answer(
                "stream chunk",
                f"{len(new_ids)} ids so far but meta_info.completion_tokens={total}",
            )
        self._ids = new_ids
        text = output_text(obj)
        if text is not None:
            self.output_text = text if cumulative else (self.output_text or "") + text

        result = None
        if raw_finish is not None:
            self._done = True
            result = build_result(
                rid=self._rid,
                meta=meta,
                ids=self._ids,
                logprobs=self._logprobs,
                text=self.output_text,
                prompt_tokens_hint=self._hint,
                server_url=self._url,
            )
        return StreamChunk(
            rid=self._rid,
            output_ids=tuple(self._ids),
            output_logprobs=None if self._logprobs is None else tuple(self._logprobs),
            new_ids=tuple(self._ids[before:]),
            text=self.output_text,
            result=result,
        )

    def _is_cumulative(self, ids: list[int], total: int | None) -> bool:
        before = len(self._ids)
        is_prefix = len(ids) >= before and ids[:before] == self._ids
        if total is not None:
            if len(ids) == total and is_prefix:
                return True
            if before + len(ids) == total:
                return False
            raise malformed_answer(
                "stream chunk",
                f"{len(ids)} ids fit neither a cumulative nor a delta chunk "
                f"({before} so far, completion_tokens={total})",
            )
        return is_prefix

    def _stream_error(self, err: object) -> EngineHTTPError:
        message = str(err.get("message", err)) if isinstance(err, dict) else str(err)
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) and not isinstance(code, bool) else 400
        return error_from_status(status, message, url=self._url)
