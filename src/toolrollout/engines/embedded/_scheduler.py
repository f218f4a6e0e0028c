"""Continuous batching on one worker thread.

The thread owns the model and every tensor. Between two decode steps it takes commands from
a thread-safe inbox, prefills newly admitted requests (unpadded), appends their KV to the
running batch and decodes all rows in one forward pass. The batch KV is left-padded
per-layer tensors; an attention mask and explicit ``position_ids`` make a padded row compute
the sequence's own logits. Results go back with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
import torch.nn.functional as F

from toolrollout._exceptions import EngineError
from toolrollout.engines._types import FinishReason
from toolrollout.engines.embedded._inbox import (
    Abort,
    Between,
    Command,
    Event,
    Hold,
    Sequence,
    Stop,
    Submit,
    SwapModel,
)
from toolrollout.engines.embedded._model import LayerKV, LoadedModel
from toolrollout.engines.embedded._output import EmbeddedOutput, TopLogprobs
from toolrollout.engines.embedded._sampling import (
    sample_next_tokens,
)

__all__ = ["Event", "Scheduler"]

logger = logging.getLogger(__name__)

ABORT_RUNNING_MESSAGE = "Aborted"
"""SGLang's ``FINISH_ABORT()`` default message for a request aborted while running."""
ABORT_WAITING_MESSAGE = "Abort in waiting queue"
ENGINE_CLOSED_MESSAGE = "Engine closed"


class Scheduler:
    """The worker thread and its state; see the module docstring for the algorithm."""

    def __init__(
        self,
        model: LoadedModel,
        tokenizer: Any,
        *,
        eos_token_ids: frozenset[int],
        max_batch_size: int,
        weight_version: Callable[[], str],
        on_done: Callable[[str], None],
        num_threads: int | None = None,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._eos = eos_token_ids
        self._max_batch = max_batch_size
        self._weight_version = weight_version
        self._on_done = on_done
        self._num_threads = num_threads
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._waiting: deque[Sequence] = deque()
        self._rows: list[Sequence] = []
        self._kv: list[LayerKV] = []
        self._mask: torch.Tensor | None = None
        self._held = False
        self.decode_steps = 0
        """Decode forward passes so far; ``decoded_rows / decode_steps`` is the mean batch."""
        self.decoded_rows = 0
        self._thread = threading.Thread(
            target=self._run, name="toolrollout-embedded-scheduler", daemon=True
        )

    # ----------------------------------------------------------------- caller side
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; in-flight requests finish as aborted."""
        self._inbox.put(Stop())

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, seq: Sequence) -> None:
        self._inbox.put(Submit(seq))

    def abort(self, rid: str, *, exact: bool = False, abort_all: bool = False) -> None:
        self._inbox.put(Abort(rid, exact, abort_all))

    def hold(self, held: bool) -> None:
        """Pause (``True``) or resume generation; aborts and submits are still taken."""
        self._inbox.put(Hold(held))

    def swap_model(self, model: LoadedModel) -> threading.Event:
        """Queue a model swap; the returned event is set once the thread applied it."""
        done = threading.Event()
        self._inbox.put(SwapModel(model, done))
        return done

    def run_between_steps(self, call: Callable[[LoadedModel], None]) -> Future[None]:
        """Queue ``call(model)`` for the worker thread; the future holds its outcome."""
        future: Future[None] = Future()
        self._inbox.put(Between(call, future))
        return future

    @property
    def num_running(self) -> int:
        return len(self._rows)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_tokens(self) -> int:
        """Tokens held in the KV cache of the running batch (padding excluded)."""
        return sum(len(s.prompt) + len(s.output_ids) for s in list(self._rows))

    # ----------------------------------------------------------------- worker side
    def _run(self) -> None:
        if self._num_threads:
            torch.set_num_threads(self._num_threads)  # OpenMP: this thread only
        with torch.inference_mode():
            try:
                while self._take_commands():
                    if self._held:
                        continue
                    self._admit()
                    if self._rows:
                        self._decode_step()
            except BaseException:
                logger.exception("embedded engine scheduler crashed")
                raise
            finally:
                self._close_all()

    def _take_commands(self) -> bool:
        """Apply queued commands; block while idle. False once asked to stop."""
        block = self._held or (not self._rows and not self._waiting)
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(command, Stop):
                return False
            if isinstance(command, Submit):
                self._waiting.append(command.seq)
            elif isinstance(command, Hold):
                self._held = command.held
            elif isinstance(command, SwapModel):
                # Between steps: rows already running continue on the new weights with
                # the KV cache computed by the old ones (what SGLang does in place).
                self._model = command.model
                command.done.set()
            elif isinstance(command, Between):
                try:
                    command.call(self._model)
                except Exception as exc:  # handed to the caller, the thread goes on
                    command.future.set_exception(exc)
                else:
                    command.future.set_result(None)
            else:
                self._apply_abort(command)

    def _apply_abort(self, command: Abort) -> None:
        for seq in [s for s in self._waiting if command.matches(s.rid)]:
            self._waiting.remove(seq)
            seq.aborted_in_waiting_queue = True
            seq.finish = FinishReason("abort", message=ABORT_WAITING_MESSAGE)
            self._finish(seq)
        hit = [i for i, s in enumerate(self._rows) if command.matches(s.rid)]
        for i in hit:
            self._rows[i].finish = FinishReason("abort", message=ABORT_RUNNING_MESSAGE)
            self._finish(self._rows[i])
        self._drop_rows(hit)

    def _close_all(self) -> None:
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, Submit):
                self._waiting.append(command.seq)
            elif isinstance(command, Between):
                command.future.set_exception(RuntimeError("the scheduler stopped"))
        for seq in self._waiting:
            seq.aborted_in_waiting_queue = True
            seq.finish = FinishReason("abort", message=ENGINE_CLOSED_MESSAGE)
            self._finish(seq)
        for seq in self._rows:
            seq.finish = FinishReason("abort", message=ENGINE_CLOSED_MESSAGE)
            self._finish(seq)
        self._waiting.clear()
        self._reset_batch()

    # ----------------------------------------------------------------- prefill
    def _admit(self) -> None:
        """Prefill waiting requests into free batch slots, equal-length prompts together."""
        free = self._max_batch - len(self._rows)
        if free <= 0 or not self._waiting:
            return
        groups: dict[tuple[int, bool, str], list[Sequence]] = {}
        for _ in range(min(free, len(self._waiting))):
            seq = self._waiting.popleft()
            alone = seq.rid if seq.vision is not None else ""  # image prompts prefill alone
            key = (len(seq.prompt), _wants_prompt_logprobs(seq), alone)
            groups.setdefault(key, []).append(seq)
        for group in groups.values():
            try:
                self._prefill(group)
            except Exception as exc:  # a bad request must not take the others down
                logger.exception("prefill failed for requests %s", [s.rid for s in group])
                for seq in group:
                    if seq.finish is None:
                        self._fail(seq, exc)

    def _prefill(self, group: list[Sequence]) -> None:
        """One forward over prompts of the same length: no padding, exact unbatched KV."""
        device = self._model.device
        length = len(group[0].prompt)
        want_prompt_logprobs = _wants_prompt_logprobs(group[0])
        vision = group[0].vision
        if vision is not None:
            logits, kv, group[0].position_offset = self._model.prefill_vision(
                vision, all_logits=want_prompt_logprobs
            )
            group[0].vision = None  # the pixels are in the KV now; free them
        else:
            logits, kv = self._model.forward(
                torch.tensor([s.prompt for s in group], device=device),
                torch.arange(length, device=device)[None, :].expand(len(group), -1),
                None,
                None,
                all_logits=want_prompt_logprobs,
            )
        if want_prompt_logprobs:
            for seq, seq_logits in zip(group, logits, strict=True):
                self._record_prompt_logprobs(seq, seq_logits)
        live = [i for i, s in enumerate(group) if s.sampling.max_new_tokens > 0]
        for seq in group:
            if seq.sampling.max_new_tokens == 0:
                seq.finish = FinishReason("length", length=0)
                self._finish(seq)
        if not live:
            return
        tokens, logprobs = sample_next_tokens(
            logits[live, -1, :], [group[i].sampling for i in live], [group[i].rng for i in live]
        )
        kept: list[int] = []
        for j, i in enumerate(live):
            seq = group[i]
            self._append(seq, tokens[j], logprobs[j])
            if self._check_finished(seq):
                self._finish(seq)
            else:
                kept.append(i)
        if kept:
            index = torch.tensor(kept, device=device)
            kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in kv]
            self._add_rows([group[i] for i in kept], kv, length)
            for i in kept:
                self._publish(group[i])

    def _record_prompt_logprobs(self, seq: Sequence, logits: torch.Tensor) -> None:
        length = len(seq.prompt)
        start = min(max(seq.options.logprob_start_len, 0), length)
        logprobs = torch.log_softmax(logits.float() / seq.sampling.temperature, dim=-1)
        positions = list(range(max(start, 1), length))
        values: list[float | None] = [None] if start == 0 else []
        tops: list[TopLogprobs | None] = [None] if start == 0 else []
        if positions:
            rows = logprobs[[p - 1 for p in positions]]
            targets = torch.tensor([seq.prompt[p] for p in positions], device=rows.device)
            values.extend(rows.gather(1, targets[:, None])[:, 0].tolist())
            if seq.options.top_logprobs_num > 0:
                tops.extend(_top(row, seq.options.top_logprobs_num) for row in rows)
        seq.input_ids = tuple(seq.prompt[start:])
        seq.input_logprobs = tuple(values)
        seq.input_top = tuple(tops) if seq.options.top_logprobs_num > 0 else ()

    # ----------------------------------------------------------------- decode
    def _decode_step(self) -> None:
        device = self._model.device
        rows = self._rows
        assert self._mask is not None
        last = torch.tensor([[s.output_ids[-1]] for s in rows], device=device)
        positions = torch.tensor(
            [[len(s.prompt) + len(s.output_ids) - 1 + s.position_offset] for s in rows],
            device=device,
        )
        mask = torch.cat([self._mask, self._mask.new_ones((len(rows), 1))], dim=1)
        try:
            logits, kv = self._model.forward(last, positions, mask, self._kv)
            tokens, logprobs = sample_next_tokens(
                logits[:, -1, :], [s.sampling for s in rows], [s.rng for s in rows]
            )
        except Exception as exc:
            logger.exception("decode step failed; failing the %d running requests", len(rows))
            for seq in rows:
                self._fail(seq, exc)
            self._reset_batch()
            return
        self._kv, self._mask = kv, mask
        self.decode_steps += 1
        self.decoded_rows += len(rows)
        done: list[int] = []
        for i, seq in enumerate(rows):
            self._append(seq, tokens[i], logprobs[i])
            if self._check_finished(seq):
                self._finish(seq)
                done.append(i)
            else:
                self._publish(seq)
        self._drop_rows(done)

    def _append(self, seq: Sequence, token: int, logprobs: torch.Tensor) -> None:
        seq.output_ids.append(token)
        end, version, spans = len(seq.output_ids), self._weight_version(), seq.weight_spans
        if spans and spans[-1][2] == version:
            spans[-1] = (spans[-1][0], end, version)
        else:
            spans.append((end - 1, end, version))
        seq.output_logprobs.append(float(logprobs[token]))
        if seq.options.top_logprobs_num > 0:
            seq.output_top.append(_top(logprobs, seq.options.top_logprobs_num))

    def _check_finished(self, seq: Sequence) -> bool:
        """SGLang's order: length, then stop/EOS token, then stop string."""
        sampling = seq.sampling
        if len(seq.output_ids) >= sampling.max_new_tokens:
            seq.finish = FinishReason("length", length=sampling.max_new_tokens)
            return True
        last = seq.output_ids[-1]
        if not sampling.ignore_eos and (last in sampling.stop_token_ids or last in self._eos):
            seq.finish = FinishReason("stop", matched=last)
            return True
        if sampling.stop:
            tail = self._decode(seq.output_ids[-seq.stop_tail_tokens :], skip_special=False)
            for stop in sampling.stop:
                if stop in tail:
                    seq.finish = FinishReason("stop", matched=stop)
                    return True
        return False

    # ----------------------------------------------------------------- batch KV
    def _add_rows(self, seqs: list[Sequence], kv: list[LayerKV], length: int) -> None:
        device = self._model.device
        mask = torch.ones((len(seqs), length), dtype=torch.long, device=device)
        if not self._rows or self._mask is None:
            self._kv, self._mask, self._rows = kv, mask, list(seqs)
            return
        width = self._mask.shape[1]
        target = max(width, length)
        merged: list[LayerKV] = []
        for (keys, values), (new_keys, new_values) in zip(self._kv, kv, strict=True):
            merged.append(
                (
                    torch.cat([_left_pad(keys, target), _left_pad(new_keys, target)]),
                    torch.cat([_left_pad(values, target), _left_pad(new_values, target)]),
                )
            )
        self._kv = merged
        self._mask = torch.cat(
            [F.pad(self._mask, (target - width, 0)), F.pad(mask, (target - length, 0))]
        )
        self._rows.extend(seqs)

    def _drop_rows(self, indices: list[int]) -> None:
        if not indices:
            return
        gone = set(indices)
        keep = [i for i in range(len(self._rows)) if i not in gone]
        if not keep or self._mask is None:
            self._reset_batch()
            return
        index = torch.tensor(keep, device=self._model.device)
        mask = self._mask.index_select(0, index)
        first = int(mask.any(dim=0).nonzero()[0])  # leading columns that are padding for all
        self._mask = mask[:, first:]
        self._kv = [
            (k.index_select(0, index)[:, :, first:], v.index_select(0, index)[:, :, first:])
            for k, v in self._kv
        ]
        self._rows = [self._rows[i] for i in keep]

    def _reset_batch(self) -> None:
        self._rows, self._kv, self._mask = [], [], None

    # ----------------------------------------------------------------- results
    def _decode(self, ids: list[int], *, skip_special: bool) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special))

    def _text(self, seq: Sequence) -> str:
        """The detokenizer's text, trimmed like SGLang's ``trim_matched_stop``."""
        ids = seq.output_ids
        finish = seq.finish
        matched: int | str | None = None
        if finish is not None and finish.type == "stop" and not seq.options.no_stop_trim:
            matched = finish.matched
        if matched and isinstance(matched, int):
            ids = ids[:-1]
        text = self._decode(ids, skip_special=seq.sampling.skip_special_tokens)
        if matched and isinstance(matched, str):
            pos = text.find(matched)
            if pos != -1:
                text = text[:pos]
        return text

    def _snapshot(self, seq: Sequence) -> EmbeddedOutput:
        finished = seq.finish is not None
        return EmbeddedOutput(
            rid=seq.rid,
            output_ids=tuple(seq.output_ids),
            text=self._text(seq),
            output_logprobs=tuple(seq.output_logprobs),
            output_top_logprobs=tuple(seq.output_top),
            input_token_ids=seq.input_ids,
            input_logprobs=seq.input_logprobs,
            input_top_logprobs=seq.input_top,
            finish_reason=seq.finish,
            prompt_tokens=len(seq.prompt),
            weight_version=self._weight_version(),
            weight_spans=tuple(seq.weight_spans),
            e2e_latency=time.perf_counter() - seq.created if finished else None,
            aborted_in_waiting_queue=seq.aborted_in_waiting_queue,
        )

    def _publish(self, seq: Sequence) -> None:
        if seq.options.stream:
            seq.sink.deliver(self._snapshot(seq))

    def _finish(self, seq: Sequence) -> None:
        self._on_done(seq.rid)
        seq.sink.deliver(self._snapshot(seq))

    def _fail(self, seq: Sequence, exc: BaseException) -> None:
        self._on_done(seq.rid)
        error = EngineError(f"embedded engine failed on request {seq.rid!r}: {exc!r}")
        error.__cause__ = exc
        seq.sink.deliver(error)


def _wants_prompt_logprobs(seq: Sequence) -> bool:
    return seq.return_logprob and seq.options.logprob_start_len >= 0


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - tensor.shape[-2]
    return F.pad(tensor, (0, 0, missing, 0)) if missing else tensor


def _top(logprobs: torch.Tensor, k: int) -> TopLogprobs:
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]))
    return tuple(zip(values.tolist(), ids.tolist(), strict=True))
