"""The code-running tool: a Sandbox Fusion ``POST /run_code`` client (verl's
``SandboxFusionTool`` config keys are accepted as they are)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from toolrollout._exceptions import (
    ToolArgumentError,
    ToolExecutionError,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)
from toolrollout._retrying_post import RetryableAnswer, RetryingPost
from toolrollout._security import bearer_headers, expand_env
from toolrollout.tools import (
    RetryPolicy,
    Tool,
    ToolContext,
    ToolLimits,
    ToolResult,
    ToolService,
)
from toolrollout.tools._config import native_entry_builder, own_config

from ._background import LocalSandboxService
from ._protocol import (
    LANGUAGES,
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunStatus,
)

__all__ = [
    "DEFAULT_SANDBOX_URL",
    "SandboxTool",
    "build_sandbox_entry",
    "format_run_code_response",
    "sandbox_tool",
]

DEFAULT_SANDBOX_URL = "http://127.0.0.1:8080/run_code"
"""Where ``toolrollout sandbox serve`` and a default Sandbox Fusion container listen."""

_RETRY_STATUS = frozenset({429, 502, 503, 504})
"""HTTP statuses of an overloaded or restarting service: retried."""

_LANGUAGE_NAMES = {
    "python": "Python 3",
    "bash": "bash",
    "c": "C",
    "cpp": "C++17",
    "go": "Go",
    "java": "Java (class Main)",
    "nodejs": "Node.js",
    "typescript": "TypeScript",
    "rust": "Rust",
}


class SandboxConfigModel(BaseModel):
    """The tool's own keys in a tool-config entry's ``config``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    sandbox_fusion_url: str = Field(default=DEFAULT_SANDBOX_URL, alias="url", min_length=1)
    default_language: str = "python"
    default_timeout: PositiveFloat = 30.0
    max_timeout: PositiveFloat | None = None
    compile_timeout: PositiveFloat | None = None
    memory_limit_mb: int = 1024
    max_output_chars: PositiveInt = 4000
    http_retries: int = Field(default=3, ge=0)
    http_timeout: PositiveFloat | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    api_key: str | None = Field(default=None, repr=False)
    local_sandbox: bool = False


def _clip(text: str, limit: int) -> str:
    """Keep the start and the end of ``text`` (tracebacks end with the error)."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    omitted = len(text) - limit
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def _streams(result: CommandRunResult, limit: int) -> str:
    stdout = _clip(result.stdout or "", limit)
    stderr = _clip(result.stderr or "", limit)
    parts = [stdout.rstrip("\n")] if stdout else []
    if stderr:
        parts.append("[stderr]\n" + stderr.rstrip("\n"))
    return "\n".join(parts)


def format_run_code_response(
    response: RunCodeResponse, *, run_timeout: float | None = None, max_output_chars: int = 4000
) -> str:
    """The text a model sees for a ``/run_code`` answer: stdout, ``[stderr]`` and its text,
    then a bracketed line when the program did not end normally (``[exit status 1]``...);
    ``[no output]`` rather than an empty answer."""
    compiled = response.compile_result
    if compiled is not None and (
        compiled.status != CommandRunStatus.Finished or compiled.return_code != 0
    ):
        body = _streams(compiled, max_output_chars)
        if compiled.status == CommandRunStatus.TimeLimitExceeded:
            status = "[compilation timed out]"
        else:
            status = f"[compilation failed with exit status {compiled.return_code}]"
        return f"{body}\n{status}" if body else status
    result = response.run_result
    if result is None:
        return f"[no run result: {response.status.value}] {response.message}".strip()
    body = _streams(result, max_output_chars)
    if result.status == CommandRunStatus.TimeLimitExceeded:
        limit = f"{run_timeout:g} s" if run_timeout is not None else "its time limit"
        status = f"[timed out after {limit}: the program was killed]"
    elif result.return_code not in (0, None):
        status = f"[exit status {result.return_code}]"
    elif not body:
        return "[no output]"
    else:
        return body
    return f"{body}\n{status}" if body else status


@dataclass(frozen=True, kw_only=True)
class SandboxTool(Tool):
    """Runs the model's ``code`` (and optional ``timeout``, ``language``) through Sandbox
    Fusion's ``POST /run_code``. A program that fails is a normal result; a sandbox that
    fails raises: unreachable or overloaded after the retries ToolUnavailable, no answer in
    time ToolTimeout, anything else ToolExecutionError.
    """

    url: str = DEFAULT_SANDBOX_URL
    """The full ``/run_code`` URL (verl: ``sandbox_fusion_url``)."""
    language: str = "python"
    """Language used when the call gives none (verl: ``default_language``)."""
    run_timeout: float = 30.0
    """Seconds a program may run when the call gives no timeout (verl: ``default_timeout``)."""
    max_timeout: float = 120.0
    """Cap on a call's ``timeout``."""
    compile_timeout: float | None = None
    """Seconds for compiled languages' compile step (None: the run timeout, as in verl)."""
    memory_limit_mb: int = 1024
    """Sent as ``memory_limit_MB`` (-1: the service's default)."""
    max_output_chars: int = 4000
    """stdout and stderr are each clipped to this many characters (start and end kept)."""
    http_retries: int = 3
    """Extra attempts after connection errors and 429/502/503/504 answers."""
    http_timeout: float | None = None
    """Seconds per HTTP attempt (None: compile + run timeout + 30 s)."""
    retry_backoff: float = 0.5
    """First wait (seconds) before an HTTP retry; doubled each time, plus jitter."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra HTTP headers (e.g. authorization for a hosted deployment)."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer <key>`` (``toolrollout sandbox serve --api-key``);
    a config's ``api_key: ${NAME}`` reads it from the environment."""
    local_sandbox: bool = False
    """Whether ``toolrollout sandbox serve`` should run on :attr:`url`'s port while the
    tool is used (its :meth:`services`)."""
    transport: httpx.AsyncBaseTransport | None = field(default=None, compare=False, repr=False)
    """httpx transport override (tests replay recorded answers with ``httpx.MockTransport``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.language not in LANGUAGES:
            raise UserError(
                f"default_language {self.language!r} is not a Sandbox Fusion language "
                f"(one of: {', '.join(LANGUAGES)})"
            )
        for name in ("run_timeout", "max_timeout"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise UserError(f"{name} must be a positive number of seconds, got {value}")
        if self.http_retries < 0:
            raise UserError(f"http_retries must be >= 0, got {self.http_retries}")
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"sandbox URL {self.url!r} must start with http:// or https://")

    @classmethod
    def create(
        cls,
        url: str = DEFAULT_SANDBOX_URL,
        *,
        language: str = "python",
        name: str | None = None,
        run_timeout: float = 30.0,
        max_timeout: float | None = None,
        memory_limit_mb: int = 1024,
        limits: ToolLimits | None = None,
        **options: Any,
    ) -> SandboxTool:
        """A tool named after ``language`` with its schema; ``options`` are the other
        fields. Default limits: 10 calls at once, no executor retries or timeout (the HTTP
        layer has its own)."""
        cap = max_timeout if max_timeout is not None else max(run_timeout, 120.0)
        shown = _LANGUAGE_NAMES.get(language, language)
        description = options.pop(
            "description",
            f"Run a {shown} program in an isolated sandbox and return what it prints "
            "(stdout, stderr and the exit status). The program has no network access and "
            "nothing persists between calls: print every result you need.",
        )
        parameters = {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": f"The complete {shown} program."},
                "timeout": {
                    "type": "number",
                    "description": f"Seconds the program may run (default {run_timeout:g}, "
                    f"at most {cap:g}).",
                },
            },
            "required": ["code"],
        }
        return cls(
            name=name or (language if language in ("python", "bash") else "code_interpreter"),
            description=description,
            parameters=parameters,
            limits=limits
            if limits is not None
            else ToolLimits(timeout=None, max_concurrency=10, retry=RetryPolicy(max_attempts=1)),
            url=url,
            language=language,
            run_timeout=run_timeout,
            max_timeout=cap,
            memory_limit_mb=memory_limit_mb,
            **options,
        )

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None = None
    ) -> Tool:
        """Build from a tool-config entry's ``config`` (verl's SandboxFusionTool keys)."""
        parsed = own_config(SandboxConfigModel, config)
        return cls.create(
            parsed.sandbox_fusion_url,
            language=parsed.default_language,
            run_timeout=parsed.default_timeout,
            max_timeout=parsed.max_timeout,
            memory_limit_mb=parsed.memory_limit_mb,
            compile_timeout=parsed.compile_timeout,
            max_output_chars=parsed.max_output_chars,
            http_retries=parsed.http_retries,
            http_timeout=parsed.http_timeout,
            headers=parsed.headers,
            api_key=(
                expand_env(parsed.api_key, where="config.api_key")
                if parsed.api_key is not None
                else None
            ),
            local_sandbox=parsed.local_sandbox,
        )

    def services(self) -> Sequence[ToolService]:
        """The local sandbox on :attr:`url`'s port when :attr:`local_sandbox` asks for it."""
        if not self.local_sandbox:
            return ()
        return (LocalSandboxService.for_url(self.url, tool=self.name),)

    # --- arguments --------------------------------------------------------------------

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """``code`` must be a string, ``timeout`` a positive number, ``language`` known."""
        super().check_arguments(arguments)
        self._parse(arguments)

    def _parse(self, arguments: Mapping[str, Any]) -> tuple[str, str, float]:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolArgumentError(
                f"invalid arguments for tool {self.name!r}: 'code' must be a string"
            )
        language = arguments.get("language", self.language)
        if language not in LANGUAGES:
            raise ToolArgumentError(
                f"invalid arguments for tool {self.name!r}: unknown language {language!r}"
            )
        raw = arguments.get("timeout")
        timeout = self.run_timeout
        if raw is not None:
            try:
                if isinstance(raw, bool):
                    raise ValueError
                timeout = float(raw)
            except (TypeError, ValueError):
                timeout = math.nan
            if not (timeout > 0 and math.isfinite(timeout)):
                raise ToolArgumentError(
                    f"invalid arguments for tool {self.name!r}: 'timeout' must be a positive "
                    f"number of seconds (got {raw!r})"
                )
        return code, str(language), min(timeout, self.max_timeout)

    # --- the call -----------------------------------------------------------------------

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        code, language, timeout = self._parse(arguments)
        request = RunCodeRequest(
            code=code,
            language=language,  # type: ignore[arg-type]  # checked against LANGUAGES
            run_timeout=timeout,
            compile_timeout=self.compile_timeout or timeout,
            memory_limit_MB=self.memory_limit_mb,
        )
        response = await self.run_code(request)
        if response.status == RunStatus.SandboxError:
            raise ToolExecutionError(
                f"the sandbox failed to run the code: {response.message or 'no message'}"
            )
        text = format_run_code_response(
            response, run_timeout=timeout, max_output_chars=self.max_output_chars
        )
        result = response.run_result
        metrics: dict[str, float] = {}
        if result is not None:
            metrics["timed_out"] = float(result.status == CommandRunStatus.TimeLimitExceeded)
            if result.execution_time is not None:
                metrics["execution_time"] = result.execution_time
            if result.return_code is not None:
                metrics["return_code"] = float(result.return_code)
        structured = {
            "status": response.status.value,
            "run_status": None if result is None else result.status.value,
            "return_code": None if result is None else result.return_code,
            "execution_time": None if result is None else result.execution_time,
        }
        return ToolResult(text=text, structured=structured, metrics=metrics)

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        """POST ``request`` to :attr:`url`, retrying transient failures; the parsed answer
        (``SandboxError`` included)."""
        seconds = self.http_timeout or (request.compile_timeout + request.run_timeout + 30.0)
        timeout = httpx.Timeout(seconds, connect=min(seconds, 10.0))
        async with httpx.AsyncClient(
            timeout=timeout,
            headers={**self.headers, **bearer_headers(self.api_key)},
            transport=self.transport,
        ) as client:
            post = RetryingPost(
                client=client,
                url=self.url,
                retries=self.http_retries,
                backoff=self.retry_backoff,
                max_backoff=8.0,
                jitter=self.retry_backoff,
                retry_statuses=_RETRY_STATUS,
                retry_read_timeouts=False,
                local=self.local_sandbox,
            )
            try:
                answer = await post.send(request.model_dump(mode="json"))
            except RetryableAnswer as exc:
                failure = f"HTTP {exc.response.status_code}: {exc.response.text[:200]}"
                raise self._unavailable(failure, post) from exc
            except httpx.TimeoutException as exc:
                if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
                    raise self._unavailable(f"{type(exc).__name__}: {exc}", post) from exc
                raise ToolTimeout(
                    f"the sandbox at {self.url} did not answer within {timeout.read:g} s"
                ) from exc
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {str(exc) or 'connection lost'}"
                raise self._unavailable(failure, post) from exc
        if answer.status_code != 200:
            raise ToolExecutionError(
                f"the sandbox at {self.url} answered HTTP {answer.status_code}: {answer.text[:500]}"
            )
        try:
            return RunCodeResponse.model_validate_json(answer.content)
        except ValidationError as exc:
            raise ToolExecutionError(
                f"the sandbox at {self.url} sent an answer that is not a /run_code response: "
                f"{answer.text[:200]}"
            ) from exc

    def _unavailable(self, failure: str, post: RetryingPost) -> ToolUnavailable:
        return ToolUnavailable(
            f"sandbox at {self.url} unavailable after {post.attempts} attempt(s): "
            f"{failure}{post.fault()}"
        )


def sandbox_tool(
    url: str = DEFAULT_SANDBOX_URL,
    *,
    language: str = "python",
    name: str | None = None,
    run_timeout: float = 30.0,
    limits: ToolLimits | None = None,
    **options: Any,
) -> SandboxTool:
    """A code-running tool for the service at ``url`` (:meth:`SandboxTool.create`)."""
    return SandboxTool.create(
        url, language=language, name=name, run_timeout=run_timeout, limits=limits, **options
    )


build_sandbox_entry = native_entry_builder(
    "sandbox",
    SandboxTool,
    "toolrollout.sandbox.SandboxTool (or verl.tools.sandbox_fusion_tools.SandboxFusionTool)",
)
"""Builds ``type: sandbox`` entries (``class_name``: a sandbox tool class)."""
