"""The one exception tree of toolrollout.

Every error the library raises derives from :class:`ToolRolloutError`, and the three
branches tell apart who is at fault, because a trainer must react differently to each::

    ToolRolloutError
    ├── UserError                 you asked for something impossible (bad config, bad argument)
    │   ├── ConfigError           a config file or key is invalid (names the file and key)
    │   ├── MissingExtraError     a feature's optional dependency is missing (names the extra)
    │   ├── SandboxIsolationError the code sandbox cannot isolate here (no working bubblewrap)
    │   ├── ImageError            image data is unreadable or does not match its placeholders
    │   └── InexactLogprobsError  the engine's logprobs are not the checkpoint's (e.g. --dtype)
    ├── ModelBehaviorError        the model's output is unusable (malformed call, unknown tool)
    │   ├── ToolParseError        a turn's tool-call text is malformed (carries the parse errors)
    │   ├── ToolNotFound          the model called a tool name that is not registered
    │   └── ToolArgumentError     the call's arguments are not valid JSON or fail the tool's schema
    ├── EngineError               the inference server failed (infrastructure)
    │   ├── EngineConnectionError could not connect / connection reset / truncated body
    │   ├── EngineTimeout         no answer within the configured timeout
    │   ├── EngineUnavailable     the server never became healthy, or every retry was spent
    │   └── EngineHTTPError       an HTTP error answer (carries status and message)
    │       └── EngineRequestRejected  a 4xx: the request itself is wrong and is never retried
    │           └── OverlongPromptError  the prompt plus max_new_tokens exceeds the context
    ├── ToolError                 a tool backend failed (infrastructure on the tool side)
    │   ├── ToolExecutionError    the tool raised; the original exception is the ``__cause__``
    │   ├── ToolTimeout           the call ran past its per-call timeout and was cancelled
    │   └── ToolUnavailable       the backend is temporarily unreachable; retrying may help
    │       └── CircuitOpen       the tool's circuit breaker is open: failing fast, not called
    ├── InteractionError          an interaction handler (simulated user / environment) failed
    ├── TokenizationError         the chat template / tokenizer cannot give a consistent token delta
    ├── TrackingError             an experiment tracker (MLflow, W&B) failed to record a run
    ├── BenchmarkError            a benchmark service or driver failed (``toolrollout bench``)
    └── DistributedError          the Ray cluster or one of its rollout workers failed (``--ray``)

Errors from httpx, MCP and subprocesses are translated into this tree at the boundary
(``raise ... from exc``) and never swallowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "BenchmarkError",
    "CircuitOpen",
    "ConfigError",
    "DistributedError",
    "EngineConnectionError",
    "EngineError",
    "EngineHTTPError",
    "EngineRequestRejected",
    "EngineTimeout",
    "EngineUnavailable",
    "FieldError",
    "ImageError",
    "InexactLogprobsError",
    "InteractionError",
    "MissingExtraError",
    "ModelBehaviorError",
    "OverlongPromptError",
    "SandboxIsolationError",
    "TokenizationError",
    "ToolArgumentError",
    "ToolError",
    "ToolExecutionError",
    "ToolNotFound",
    "ToolParseError",
    "ToolRolloutError",
    "ToolTimeout",
    "ToolUnavailable",
    "TrackingError",
    "UserError",
]


class ToolRolloutError(Exception):
    """Base class of every error raised by toolrollout."""


class UserError(ToolRolloutError):
    """The caller misused the library; the message says what to change."""


class ConfigError(UserError):
    """A configuration file or value is invalid."""


class FieldError(UserError):
    """A :class:`~toolrollout.spec.RunSpec` field holds a wrong value, or does not suit what
    the run meets (a leftover file). The message names each field as ``{name}`` (dotted
    into ``config``), so an application shows its own names for them through
    :meth:`render`: the CLI shows ``{config.tool_parser}`` as ``--tool-parser``, the
    library as ``config.tool_parser``."""

    def __init__(self, template: str, *fields: str) -> None:
        self.template = template
        self.fields = fields
        super().__init__(self.render({}))

    def render(self, names: Mapping[str, str]) -> str:
        """The message with each field named as ``names`` has it (default: the field)."""

        def name(match: re.Match[str]) -> str:
            field = match[1]
            return names.get(field, field) if field in self.fields else match[0]

        return re.sub(r"\{([\w.]+)\}", name, self.template)


class MissingExtraError(UserError, ModuleNotFoundError):
    """A feature needs an optional dependency that is not installed.

    The message names the ``pip install 'toolrollout[extra]'`` that fixes it. It is also a
    :class:`ModuleNotFoundError` (``name`` is the missing module), so code that guards an
    import with ``except ImportError`` keeps working.
    """

    def __init__(self, message: str, *, extra: str, module: str) -> None:
        super().__init__(message)
        self.name = module
        self.extra = extra


class SandboxIsolationError(UserError):
    """The local code sandbox cannot isolate programs here.

    bubblewrap (``bwrap``) is missing, or it cannot create the namespaces it needs; the
    message says which. ``toolrollout sandbox serve --unsafe-no-isolation`` runs without it.
    """


class ImageError(UserError):
    """Image data cannot be read, or the ids' image placeholders do not match the images.

    From a request's ``image_data`` it is the caller's mistake (HTTP 400); from a tool's
    result the rollout turns it into that tool call's error result.
    """


class InexactLogprobsError(FieldError):
    """The engine's logprobs are not the sampling distribution a trainer recomputes from
    the checkpoint (e.g. SGLang serving a float32 checkpoint in float16): refused at the
    start of a run unless ``RolloutConfig.inexact_logprobs="label"``."""


class ModelBehaviorError(ToolRolloutError):
    """The model's output cannot be acted upon (bad tool-call syntax, unknown tool)."""


class ToolParseError(ModelBehaviorError):
    """A model turn contains malformed tool calls.

    Parsers never raise this themselves (they report errors on ``ParsedTurn.errors``);
    ``ParsedTurn.raise_for_errors()`` raises it for callers that want to stop instead.
    """

    def __init__(self, message: str, *, errors: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.errors = errors


class EngineError(ToolRolloutError):
    """The inference engine failed to produce a result."""


class EngineConnectionError(EngineError):
    """The engine could not be reached, or the connection broke mid-response."""


class EngineTimeout(EngineError):
    """The engine did not answer within the configured timeout."""


class EngineUnavailable(EngineError):
    """The engine never became healthy, or every retry was used up."""


class EngineHTTPError(EngineError):
    """The engine answered with an HTTP error status."""

    def __init__(self, message: str, *, status_code: int, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.url = url


class EngineRequestRejected(EngineHTTPError):
    """A 4xx answer: the request itself is invalid, so retrying cannot help."""


class OverlongPromptError(EngineRequestRejected):
    """The prompt (plus ``max_new_tokens``) does not fit the model's context."""


class ToolError(ToolRolloutError):
    """A tool backend failed (crashed, timed out, or refused the call)."""


class ToolNotFound(ModelBehaviorError):
    """The model called a tool that is not registered (the model's fault, not the tool's)."""


class ToolArgumentError(ModelBehaviorError):
    """The model's arguments are not valid JSON or do not match the tool's parameter schema."""


class ToolExecutionError(ToolError):
    """The tool itself raised; the original exception is chained as ``__cause__``."""


class ToolTimeout(ToolError):
    """The tool call exceeded its per-call timeout and was cancelled."""


class ToolUnavailable(ToolError):
    """The tool's backend is temporarily unreachable; the retry policy retries only these."""


class CircuitOpen(ToolUnavailable):
    """The tool's circuit breaker is open (or half-open with its trial call in flight).

    The call failed fast without reaching the tool. Never retried and never counted as a
    failure by the breaker itself. ``retry_after`` is the number of seconds until the breaker
    lets a trial call through (0.0 while half-open).
    """

    def __init__(self, message: str, *, tool: str, retry_after: float) -> None:
        super().__init__(message)
        self.tool = tool
        self.retry_after = retry_after


class InteractionError(ToolRolloutError):
    """An interaction handler raised, timed out or answered in an unusable shape.

    Like a tool backend failure this is environment infrastructure, not the model's fault:
    the trajectory is recorded as failed with this error and the run goes on. The original
    exception is the ``__cause__``.
    """


class TokenizationError(ToolRolloutError):
    """The chat template or tokenizer cannot produce a consistent token delta.

    Raised when a template fails to render, when the family's stop token is not a single
    token of the tokenizer, or when the rendered turn boundary differs from the family's
    documented rule (a sign that the wrong template family was configured).
    """


class TrackingError(ToolRolloutError):
    """An experiment tracker failed while recording a run; the message is the backend's.

    The evaluation itself is done and written to disk when this is raised.
    """


class BenchmarkError(ToolRolloutError):
    """A benchmark service did not start, or a benchmark driver failed or ran too long."""


class DistributedError(ToolRolloutError):
    """The Ray cluster could not be reached, or a rollout worker (actor) died or raised.

    The message names the shard and the node, so the lost part of a run can be found.
    """
