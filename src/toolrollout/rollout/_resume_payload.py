"""The JSON payload of a trajectory's resume point (format 1), one section per ledger: a
pydantic model each, its fields named as the ledger's, so a section is read back as
``Ledger(**section.fields())`` and written from the live ledger unvalidated.
"""

from __future__ import annotations

import json
from array import array
from typing import Annotated, Any, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializerFunctionWrapHandler,
    ValidationError,
    WrapSerializer,
)
from pydantic_core import PydanticSerializationError

from toolrollout._exceptions import ToolRolloutError
from toolrollout._records import (
    RESUME_FORMAT_VERSION,
    ResumeFormatError,
    ResumePoint,
    TokenSpan,
    TrajectoryImage,
)
from toolrollout._records._resume import from_json_value, to_json_value

from ._types import CallRecord, Counters, RolloutPrompt

__all__ = ["Payload", "read_payload", "resume_point_of", "resume_prompt"]


def resume_point_of(state: Any, model_texts: list[str]) -> ResumePoint:
    """``state`` (a live ``TrajectoryState``, which imports this module) as a JSON resume
    point: what a later leg needs, not the live objects."""
    payload = Payload.model_construct(
        identity=_Identity.of(state),
        prompt=_Prompt.of(state.prompt, messages=list(state.prompt.messages)),
        transcript=_Transcript.of(state.transcript, model_texts=model_texts),
        counters=state.counters,
        timing=_Timing.of(state.timing, spent_seconds=state.timing.total()),
        tools=_Tools.of(state.tools),
        drift=_Drift.of(state.drift),
        vision=_Vision.of(state.vision),
        environment=_Environment.of(state.environment),
    )
    try:
        text = json.dumps(payload.model_dump(), ensure_ascii=False)
    except (TypeError, PydanticSerializationError) as exc:  # a value JSON has no form for
        reason = str(exc).splitlines()[0]
        raise ToolRolloutError(f"trajectory {state.uid} cannot be saved: {reason}") from None
    return ResumePoint(text, RESUME_FORMAT_VERSION)


def read_payload(point: ResumePoint) -> Payload:
    """The sections of ``point``; a newer format or a malformed one raises
    :class:`ResumeFormatError`."""
    if point.version > RESUME_FORMAT_VERSION:
        raise ResumeFormatError(
            f"resume point version {point.version} is newer than this toolrollout reads"
        )
    return _read(Payload, json.loads(point.state))


def resume_prompt(point: ResumePoint) -> RolloutPrompt:
    """The dataset row a resume point was started from."""
    return _read(_Prompt, point.prompt).row()


def _sorted_pairs(value: dict[int, Any], write: SerializerFunctionWrapHandler) -> Any:
    return sorted(write(value).items())


_Value = Annotated[Any, PlainValidator(from_json_value), PlainSerializer(to_json_value)]
"""A row's, a message's or a tool's value, through the tagged codec of ``_records``."""

_Span = Annotated[  # Any: pydantic has no schema for a TokenSpan's arrays
    Any,
    PlainValidator(lambda s: TokenSpan(s[0], s[1], [float(x) for x in s[2]])),
    PlainSerializer(lambda s: [s.kind, s.id_array.tolist(), list(s.logprobs)]),
]
_T = TypeVar("_T")
_Pairs = Annotated[dict[int, _T], BeforeValidator(dict), WrapSerializer(_sorted_pairs)]
"""A dict by turn or index, written as sorted ``[key, value]`` pairs."""
_Call = Annotated[
    CallRecord,
    BeforeValidator(lambda r: tuple(_read(_CallRecord, r).fields().values())),
    PlainSerializer(lambda record: dict(zip(_CallRecord.model_fields, record, strict=True))),
]
_Image = Annotated[
    Any,  # a TrajectoryImage
    PlainValidator(lambda r: TrajectoryImage(**_read(_ImageRecord, r).fields())),
    PlainSerializer(lambda image: _ImageRecord.of(image).model_dump()),
]


class _Section(BaseModel):
    @classmethod
    def of(cls, live: object, **given: Any) -> Self:
        """The section as ``live`` holds it now (not validated: its values are live)."""
        values = {name: getattr(live, name) for name in cls.model_fields if name not in given}
        return cls.model_construct(**values, **given)

    def fields(self, *leave_out: str) -> dict[str, Any]:
        return {name: value for name, value in self if name not in leave_out}


class _CallRecord(_Section):
    name: str
    seconds: float = 0.0
    attempts: int = 0
    is_error: bool = False
    error_kind: str | None = None


class _ImageRecord(_Section):
    png: _Value
    start: int
    end: int
    grid_thw: tuple[int, int, int]


class _Identity(_Section):
    uid: str
    group_id: str
    prompt_index: int
    sample_index: int


class _Prompt(_Section):
    messages: _Value
    ground_truth: _Value = None
    metadata: _Value = Field(default_factory=dict)

    def row(self) -> RolloutPrompt:
        return RolloutPrompt(tuple(self.messages), self.ground_truth, self.metadata)


class _Transcript(_Section):
    messages: _Value
    prompt_ids: Annotated[Any, BeforeValidator(lambda ids: array("i", ids)), PlainSerializer(list)]
    spans: list[_Span]
    model_texts: list[str] = []
    open_turn: bool = False
    segments: list[tuple[int, int, str | None]] = []
    forced: tuple[int, ...] = ()


class _Timing(_Section):
    spent_seconds: float = 0.0
    generation_seconds: float = 0.0
    tool_seconds: float = 0.0
    tool_latency: dict[str, list[float]] = {}


class _Tools(_Section):
    state: _Value = Field(default_factory=dict)
    records: list[_Call] = []


class _Drift(_Section):
    checkpoints: list[tuple[int, int, int]] = []
    checked: Annotated[set[int], PlainSerializer(sorted)] = set()
    found: _Pairs[_Value] = {}


class _Vision(_Section):
    images: list[_Image] = []
    urls: list[str] = []
    dropped: int = 0


class _Environment(_Section):
    turn_rewards: _Pairs[float] = {}
    tool_rewards: _Pairs[float] = {}
    interaction_turns: int = 0
    appended_turns: int = 0
    interaction_tokens: int = 0
    interaction_metrics: _Value = Field(default_factory=list)
    errors: list[str] = []


class Payload(_Section):
    identity: _Identity
    prompt: _Prompt
    transcript: _Transcript
    counters: Counters = Field(default_factory=Counters)
    timing: _Timing = Field(default_factory=_Timing)
    tools: _Tools = Field(default_factory=_Tools)
    drift: _Drift = Field(default_factory=_Drift)
    vision: _Vision = Field(default_factory=_Vision)
    environment: _Environment = Field(default_factory=_Environment)


_SectionT = TypeVar("_SectionT", bound=_Section)


def _read(section: type[_SectionT], saved: Any) -> _SectionT:
    """``saved`` (JSON values) as ``section``; one line naming the field when it is not."""
    try:
        return section.model_validate(saved)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the payload"
        raise ResumeFormatError(f"not a resume point: {where}: {error['msg']}") from None
