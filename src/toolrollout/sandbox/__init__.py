"""Code sandbox: a Sandbox Fusion client tool and a local, bubblewrap-isolated server.

- :class:`SandboxTool` / :func:`sandbox_tool`: runs the model's code through Sandbox
  Fusion's ``POST /run_code`` (a real deployment, or the local server).
- ``toolrollout sandbox serve``: the same API on one machine, under bubblewrap with resource
  limits; :func:`serve_sandbox_in_background` runs it as a child process, and a tool with
  ``local_sandbox: true`` asks for one (:class:`LocalSandboxService`).

See ``docs/sandbox.md`` for the isolation model and its limits.
"""

from __future__ import annotations

from ._background import LocalSandboxService as LocalSandboxService
from ._background import serve_local_sandboxes as serve_local_sandboxes
from ._background import serve_sandbox_in_background as serve_sandbox_in_background
from ._protocol import RunCodeRequest as RunCodeRequest
from ._protocol import RunCodeResponse as RunCodeResponse
from ._tool import SandboxTool as SandboxTool
from ._tool import sandbox_tool as sandbox_tool

__all__ = [
    "LocalSandboxService",
    "RunCodeRequest",
    "RunCodeResponse",
    "SandboxTool",
    "sandbox_tool",
    "serve_local_sandboxes",
    "serve_sandbox_in_background",
]
