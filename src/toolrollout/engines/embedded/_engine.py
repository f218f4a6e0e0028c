"""The in-process engine: a Hugging Face causal LM behind the :class:`Engine` seam.

Validation happens on the caller's thread so that a bad request fails at once with the
same exception (and the same SGLang message) a SGLang server would produce; generation
happens on the scheduler thread (see :mod:`._scheduler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any

import anyio
import torch

from toolrollout._exceptions import (
    ConfigError,
    EngineError,
    EngineRequestRejected,
    EngineUnavailable,
    UserError,
)
from toolrollout._version import __version__
from toolrollout.engines._control import (
    EngineInfo,
    ServerInfo,
)
from toolrollout.engines._types import GenerateRequest, GenerateResult, StreamChunk
from toolrollout.engines.embedded._inbox import Event, Sequence, Sink
from toolrollout.engines.embedded._model import LoadedModel, ModelMeta, load_meta, load_model
from toolrollout.engines.embedded._output import EmbeddedOutput
from toolrollout.engines.embedded._requests import (
    check_one_sample,
    image_refusal,
    to_result,
    validated,
)
from toolrollout.engines.embedded._sampling import GenerationOptions
from toolrollout.engines.embedded._scheduler import Scheduler
from toolrollout.engines.embedded._vision import VisionInputs, VisionProcessor
from toolrollout.engines.embedded._weight_sync import EMBEDDED_URL, WeightSyncEngine

__all__ = ["EmbeddedEngine"]


class EmbeddedEngine(WeightSyncEngine):
    """Serve a local Hugging Face causal LM in-process, with continuous batching.

    Concurrent :meth:`generate` calls are decoded together, one forward pass per step, on a
    worker thread that this engine owns (started by :meth:`start` / ``async with``, joined
    by :meth:`aclose`). Semantics follow SGLang's ``/generate``: output ids include the
    matched stop token, logprobs are ``log_softmax(logits / temperature)`` before filtering,
    invalid requests raise with SGLang's messages.

    Args:
        model_path: A Hugging Face model folder (config, weights, tokenizer).
        max_batch_size: Most sequences decoded together; further requests wait.
        context_length: Prompt + ``max_new_tokens`` limit; defaults to the config's
            ``max_position_embeddings``.
        device: ``"cpu"``, ``"cuda"``, ...; defaults to CUDA when available.
        dtype: ``"float32"``, ``"bfloat16"``, ``"auto"``...; defaults to float32 on CPU and
            the checkpoint's dtype on GPU.
        weight_version: Reported with every result (SGLang's ``weight_version``).
        num_threads: Torch intra-op threads of the scheduler thread (default: torch's).
            One thread is fastest for tiny models and on a busy CPU.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        max_batch_size: int = 32,
        context_length: int | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        weight_version: str = "default",
        num_threads: int | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise UserError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if num_threads is not None and num_threads < 1:
            raise UserError(f"num_threads must be at least 1, got {num_threads}")
        self._meta: ModelMeta = load_meta(
            model_path, context_length=context_length, trust_remote_code=trust_remote_code
        )
        self._context_length_arg = context_length
        self._max_batch_size = max_batch_size
        self._device = device
        self._dtype = dtype
        self._trust_remote_code = trust_remote_code
        self._num_threads = num_threads
        self.weight_version = weight_version
        """Reported in every result; change it after updating the weights."""
        self._model: LoadedModel | None = None
        self._scheduler: Scheduler | None = None
        self._start_lock = threading.Lock()
        self._active: set[str] = set()
        self._active_lock = threading.Condition()
        """Guards ``_active``; notified when a request ends (weight updates wait on it)."""
        self._closed = False
        self._vision: VisionProcessor | None = None
        self._vision_lock = threading.Lock()
        self._paused = False
        self._gate: asyncio.Event | None = None
        """Set while new requests must wait (paused, or a weight update in progress)."""
        self._update_lock = anyio.Lock()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load the weights (off the event loop) and start the scheduler thread."""
        if self._scheduler is not None:
            return
        if self._closed:
            raise UserError("this EmbeddedEngine was closed; create a new one")
        await anyio.to_thread.run_sync(self._start_blocking)

    def _start_blocking(self) -> None:
        with self._start_lock:
            if self._scheduler is not None:
                return
            model = load_model(
                self._meta,
                device=self._device,
                dtype=self._dtype,
                trust_remote_code=self._trust_remote_code,
            )
            scheduler = Scheduler(
                model,
                self._meta.tokenizer,
                eos_token_ids=self._meta.eos_token_ids,
                max_batch_size=self._max_batch_size,
                weight_version=lambda: self.weight_version,
                on_done=self._forget,
                num_threads=self._num_threads,
            )
            scheduler.start()
            self._model, self._scheduler = model, scheduler

    async def __aenter__(self) -> EmbeddedEngine:
        await self.start()
        return self

    async def aclose(self) -> None:
        """Stop the scheduler (in-flight requests end as aborted), join it, free the model."""
        self._closed = True
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        scheduler.stop()
        await anyio.to_thread.run_sync(scheduler.join)
        self._model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @property
    def started(self) -> bool:
        return self._scheduler is not None

    @property
    def healthy(self) -> bool:
        """True while the scheduler thread is running."""
        return self._scheduler is not None and self._scheduler.alive

    # ------------------------------------------------------------------ model facts
    @property
    def model_path(self) -> str:
        return self._meta.model_path

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (used for ``text`` prompts and stop strings)."""
        return self._meta.tokenizer

    @property
    def context_length(self) -> int:
        return self._meta.context_length

    @property
    def vocab_size(self) -> int:
        return self._meta.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The tokenizer's EOS plus the generation config's EOS ids (SGLang's default)."""
        return self._meta.eos_token_ids

    @property
    def model_type(self) -> str:
        return self._meta.model_type

    @property
    def architectures(self) -> tuple[str, ...]:
        return self._meta.architectures

    @property
    def has_vision(self) -> bool:
        return self._meta.has_vision

    @property
    def has_audio(self) -> bool:
        return self._meta.has_audio

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def device(self) -> str:
        if self._model is not None:
            return str(self._model.device)
        return self._device or ("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def dtype(self) -> str | None:
        return str(self._model.dtype).removeprefix("torch.") if self._model else None

    @property
    def num_running(self) -> int:
        return self._scheduler.num_running if self._scheduler else 0

    @property
    def num_waiting(self) -> int:
        return self._scheduler.num_waiting if self._scheduler else 0

    @property
    def num_tokens(self) -> int:
        return self._scheduler.num_tokens if self._scheduler else 0

    @property
    def decode_counts(self) -> tuple[int, int]:
        """(decode forward passes, rows decoded over them) since start."""
        if not self._scheduler:
            return (0, 0)
        return (self._scheduler.decode_steps, self._scheduler.decoded_rows)

    @property
    def num_active(self) -> int:
        """Requests submitted and not yet finished (waiting, running or in the inbox)."""
        return self._count_active()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` as SGLang tokenizes a ``text`` prompt (no chat template)."""
        return [int(t) for t in self._meta.tokenizer.encode(text)]

    # ------------------------------------------------------------------ generation
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one sample; the text keeps the matched stop string/token."""
        out = await self.generate_full(request, GenerationOptions(no_stop_trim=True))
        return to_result(out, request)

    async def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[StreamChunk, None]:
        """The engine seam's token stream: a cumulative chunk after every decode step; the
        last one carries the result :meth:`generate` returns for the same request."""
        before = 0
        async with contextlib.aclosing(
            self.stream(request, GenerationOptions(no_stop_trim=True))
        ) as snapshots:
            async for out in snapshots:
                if out.finished:
                    yield StreamChunk.final(to_result(out, request), before=before)
                    return
                if len(out.output_ids) == before:
                    continue
                yield StreamChunk(
                    rid=out.rid,
                    output_ids=out.output_ids,
                    output_logprobs=out.output_logprobs if request.return_logprob else None,
                    new_ids=out.output_ids[before:],
                    text=out.text,
                )
                before = len(out.output_ids)

    async def generate_full(
        self, request: GenerateRequest, options: GenerationOptions | None = None
    ) -> EmbeddedOutput:
        """Generate one sample and return everything the engine knows about it."""
        opts = replace(options or GenerationOptions(), stream=False)
        async with contextlib.aclosing(self._events(request, opts)) as events:
            async for event in events:
                if event.finished:
                    return event
        raise AssertionError("unreachable: the last event is the finished one")

    def stream(
        self, request: GenerateRequest, options: GenerationOptions | None = None
    ) -> AsyncGenerator[EmbeddedOutput, None]:
        """Yield a cumulative snapshot after every step; the last one is finished."""
        return self._events(request, replace(options or GenerationOptions(), stream=True))

    async def _events(
        self, request: GenerateRequest, opts: GenerationOptions
    ) -> AsyncGenerator[EmbeddedOutput, None]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        await self.wait_unpaused()
        vision = await self.process_images(request)
        rid = self.submit(request, opts, sink=queue.put_nowait, vision=vision)
        done = False
        try:
            while not done:
                event = await queue.get()
                if isinstance(event, EngineError):
                    done = True
                    raise event
                done = event.finished
                yield event
        finally:
            if not done:
                self.cancel(rid)

    def submit(
        self,
        request: GenerateRequest,
        options: GenerationOptions,
        *,
        sink: Callable[[Event], None],
        vision: VisionInputs | None = None,
    ) -> str:
        """Validate ``request`` and queue it; return its rid. ``sink`` gets each snapshot
        (only the final one unless ``options.stream``) or an :class:`EngineError` on the
        current event loop; ``image_data`` needs ``vision`` from :meth:`process_images`."""
        scheduler = self._scheduler
        if scheduler is None or self._model is None:
            raise UserError(
                "EmbeddedEngine is not started: use `async with EmbeddedEngine(...)` "
                "or `await engine.start()`"
            )
        if not scheduler.alive:
            raise EngineUnavailable("the embedded engine's scheduler thread has stopped")
        seq = self._prepare(request, options, Sink(asyncio.get_running_loop(), sink), vision)
        scheduler.submit(seq)
        return seq.rid

    async def process_images(self, request: GenerateRequest) -> VisionInputs | None:
        """Decode, resize and patch the request's images in a worker thread (None: no images)."""
        if not request.image_data:
            return None
        processor = self._vision_processor()
        return await anyio.to_thread.run_sync(
            processor.process, request.input_ids, request.image_data
        )

    def _vision_processor(self) -> VisionProcessor:
        if not self._meta.has_vision:
            raise EngineRequestRejected(image_refusal(self._meta), status_code=400)
        with self._vision_lock:
            if self._vision is None:
                try:
                    self._vision = VisionProcessor(self._meta.model_path, self._meta.tokenizer)
                except (ConfigError, OSError, ValueError) as exc:
                    raise EngineRequestRejected(
                        f"{image_refusal(self._meta)} ({exc})", status_code=400
                    ) from exc
            return self._vision

    def _prepare(
        self,
        request: GenerateRequest,
        options: GenerationOptions,
        sink: Sink,
        vision: VisionInputs | None = None,
    ) -> Sequence:
        check_one_sample(request)
        if request.image_data and vision is None:
            vision = self._vision_processor().process(request.input_ids, request.image_data)
        ids, sampling, rng, stop_tail = validated(request, options, self._meta, vision)
        rid = request.rid if request.rid is not None else uuid.uuid4().hex
        with self._active_lock:
            if rid in self._active:
                raise EngineRequestRejected(
                    f"Duplicate request ID detected: {rid}", status_code=400
                )
            self._active.add(rid)
        return Sequence(
            rid=rid,
            prompt=ids,
            sampling=sampling,
            options=options,
            return_logprob=request.return_logprob,
            sink=sink,
            rng=rng,
            stop_tail_tokens=stop_tail,
            vision=vision,
        )

    # ------------------------------------------------------------------ control
    async def abort(self, rid: str) -> None:
        """Abort every request whose rid starts with ``rid`` (SGLang's prefix match)."""
        self.abort_nowait(rid)

    async def abort_all(self) -> None:
        """Abort every request of this engine (they all belong to its owner)."""
        self.abort_nowait(abort_all=True)

    def abort_nowait(self, rid: str = "", *, abort_all: bool = False) -> None:
        """Queue an abort without awaiting; usable from ``finally`` blocks and the server.
        An empty ``rid`` without ``abort_all`` is ignored, as SGLang does."""
        if not abort_all and not rid:
            return
        if self._scheduler is not None:
            self._scheduler.abort(rid, abort_all=abort_all)

    def cancel(self, rid: str) -> None:
        """Abort exactly ``rid``, no prefix match (used when its caller went away)."""
        if self._scheduler is not None:
            with self._active_lock:
                if rid not in self._active:
                    return
            self._scheduler.abort(rid, exact=True)

    def _forget(self, rid: str) -> None:
        with self._active_lock:
            self._active.discard(rid)
            self._active_lock.notify_all()

    async def info(self) -> EngineInfo:
        """The model folder, context length, vision and weight version served."""
        server = ServerInfo(
            url=EMBEDDED_URL,
            model_path=self.model_path,
            weight_version=self.weight_version,
            context_length=self.context_length,
            vision=self.has_vision,
            engine="toolrollout-embedded",
            engine_version=__version__,
            dtype=self.dtype,
        )
        return EngineInfo.merge((server,))

    async def flush_cache(self) -> bool:
        """Succeed when idle, like SGLang's ``/flush_cache`` (there is no prefix cache)."""
        return self.num_active == 0
