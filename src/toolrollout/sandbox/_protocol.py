"""Sandbox Fusion's ``POST /run_code`` wire format, field for field.

Mirrors ``sandbox/server/sandbox_api.py`` and ``sandbox/runners/types.py`` of
bytedance/SandboxFusion, so the client speaks to a real deployment and the local server
answers exactly like one: same field names (``memory_limit_MB`` included), same defaults,
same status rule (:func:`parse_run_status`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

from pydantic import BaseModel, Field

__all__ = [
    "LANGUAGES",
    "CommandRunResult",
    "CommandRunStatus",
    "Language",
    "RunCodeRequest",
    "RunCodeResponse",
    "RunStatus",
    "parse_run_status",
]

Language = Literal[
    "python",
    "cpp",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
    # Sent by the official client (its models' Language), unknown to the server's.
    "python2",
    "gtest",
    "react",
    # toolrollout's own: C (Sandbox Fusion has no key for it).
    "c",
]
"""Every ``language`` Sandbox Fusion's server or official client knows, plus ``c``; anything
else is a 422, as there."""

LANGUAGES: tuple[str, ...] = get_args(Language)
""":data:`Language` as a tuple, for membership checks."""


class CommandRunStatus(StrEnum):
    """How one command (compile or run) ended."""

    Finished = "Finished"
    """It exited by itself (with any return code)."""
    Error = "Error"
    """The sandbox could not run it."""
    TimeLimitExceeded = "TimeLimitExceeded"
    """It ran past its timeout and was killed."""


class RunStatus(StrEnum):
    """The request's overall outcome (see :func:`parse_run_status`)."""

    Success = "Success"
    """Every command finished with return code 0."""
    Failed = "Failed"
    """A command timed out or returned non-zero: the code's fault."""
    SandboxError = "SandboxError"
    """The sandbox failed: the service's fault."""


class CommandRunResult(BaseModel):
    """Outcome of one command: Sandbox Fusion's ``CommandRunResult``."""

    status: CommandRunStatus
    execution_time: float | None = None
    """Wall-clock seconds."""
    return_code: int | None = None
    """None when the command timed out or could not run."""
    stdout: str | None = None
    stderr: str | None = None


class RunCodeRequest(BaseModel):
    """The body of ``POST /run_code``: Sandbox Fusion's ``RunCodeRequest``."""

    compile_timeout: float = Field(default=10, description="compile timeout for compiled languages")
    run_timeout: float = Field(default=10, description="code run timeout")
    memory_limit_MB: int = Field(default=-1, description="maximum memory allowed in megabytes")
    code: str = Field(..., examples=['print("hello")'], description="the code to run")
    stdin: str | None = Field(
        default=None, examples=[""], description="optional string passed on stdin"
    )
    language: Language = Field(..., examples=["python"], description="the language to run")
    files: dict[str, str | None] = Field(
        default_factory=dict, description="a dict from file path to base64 encoded file content"
    )
    fetch_files: list[str] = Field(
        default_factory=list, description="a list of file paths to fetch after code execution"
    )


class RunCodeResponse(BaseModel):
    """The answer of ``POST /run_code``: Sandbox Fusion's ``RunCodeResponse``."""

    status: RunStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    """Fetched files, base64-encoded, by the path asked for."""


def parse_run_status(
    compile_result: CommandRunResult | None, run_result: CommandRunResult | None
) -> tuple[RunStatus, str]:
    """Sandbox Fusion's rule: any ``Error`` is a SandboxError (its stderr is the message);
    any timeout or non-zero return code is Failed; otherwise Success."""
    results = [r for r in (compile_result, run_result) if r is not None]
    for result in results:
        if result.status == CommandRunStatus.Error:
            return RunStatus.SandboxError, result.stderr or ""
    if any(r.status == CommandRunStatus.TimeLimitExceeded for r in results):
        return RunStatus.Failed, ""
    if any(r.return_code is not None and r.return_code != 0 for r in results):
        return RunStatus.Failed, ""
    return RunStatus.Success, ""
