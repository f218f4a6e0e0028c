"""What crosses into the embedded engine's scheduler thread: requests (:class:`Sequence`,
with the :class:`Sink` their events go back through) and the commands of its inbox.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from toolrollout._exceptions import EngineError
from toolrollout.engines._types import FinishReason
from toolrollout.engines.embedded._model import LoadedModel
from toolrollout.engines.embedded._output import EmbeddedOutput, TopLogprobs
from toolrollout.engines.embedded._sampling import GenerationOptions, ResolvedSampling
from toolrollout.engines.embedded._vision import VisionInputs

__all__ = [
    "Abort",
    "Between",
    "Command",
    "Event",
    "Hold",
    "Sequence",
    "Sink",
    "Stop",
    "Submit",
    "SwapModel",
]

logger = logging.getLogger("toolrollout.engines.embedded._scheduler")

Event = EmbeddedOutput | EngineError
"""What a request's sink receives: snapshots (the last one finished) or one error."""


class Sink:
    """Hands events to a callback on the event loop that submitted the request."""

    __slots__ = ("_callback", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[Event], None]):
        self._loop = loop
        self._callback = callback

    def deliver(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._callback, event)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            logger.debug("dropping an event for a closed event loop")


@dataclass(eq=False)
class Sequence:
    """One request inside the scheduler (mutated by the worker thread only)."""

    rid: str
    prompt: list[int]
    sampling: ResolvedSampling
    options: GenerationOptions
    return_logprob: bool
    sink: Sink
    rng: random.Random | None
    """Per-request random stream (None for greedy rows)."""
    stop_tail_tokens: int
    """How many trailing tokens to decode when looking for stop strings."""
    created: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[TopLogprobs] = field(default_factory=list)
    input_ids: tuple[int, ...] = ()
    input_logprobs: tuple[float | None, ...] = ()
    input_top: tuple[TopLogprobs | None, ...] = ()
    finish: FinishReason | None = None
    aborted_in_waiting_queue: bool = False
    vision: VisionInputs | None = None
    """Pixel inputs of a prompt with images (prefilled alone, with 3-D positions)."""
    position_offset: int = 0
    """Added to a token's index to get its rotary position (non-zero after images)."""
    weight_spans: list[tuple[int, int, str]] = field(default_factory=list)
    """``(start, end, version)`` runs of output ids by the weights that produced them (a
    request paused across a weight update continues on the new ones), as SGLang's
    ``meta_info.weight_versions``."""


@dataclass(frozen=True, slots=True)
class Submit:
    seq: Sequence


@dataclass(frozen=True, slots=True)
class Abort:
    rid: str
    exact: bool
    abort_all: bool

    def matches(self, rid: str) -> bool:
        if self.abort_all:
            return True
        return rid == self.rid if self.exact else rid.startswith(self.rid)


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Hold:
    """Stop (or resume) admitting and decoding; running rows keep their KV cache."""

    held: bool


@dataclass(frozen=True, slots=True)
class SwapModel:
    """Replace the model between two steps; ``done`` is set once the swap happened."""

    model: LoadedModel
    done: threading.Event


@dataclass(frozen=True, slots=True)
class Between:
    """Run ``call`` on the worker thread between two steps, never seen half-done by a step."""

    call: Callable[[LoadedModel], None]
    future: Future[None]


Command = Submit | Abort | Stop | Hold | SwapModel | Between
