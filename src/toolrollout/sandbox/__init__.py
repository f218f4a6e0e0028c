"""Code sandbox: a Sandbox Fusion client tool and a local, bubblewrap-isolated server.

- :class:`SandboxTool` / :func:`sandbox_tool`: a tool that runs the model's code through
  Sandbox Fusion's ``POST /run_code`` (a real deployment, or the local server). Tool
  configs build it with ``config: {type: sandbox, sandbox_fusion_url: ...}``
  (the ``sandbox`` tool type).
- ``toolrollout sandbox serve`` (:func:`run_sandbox_server`): the same API on one machine,
  running ``python``, ``bash`` and, where their toolchain is installed, ``c``, ``cpp``,
  ``go``, ``java``, ``nodejs``, ``typescript``, ``rust``, ``perl``, ``ruby`` and ``lua``
  (:data:`SUPPORTED_LANGUAGES`) under bubblewrap with resource limits.
- :func:`serve_sandbox_in_background`: that server as a child process for an ``async with``;
  a tool configured with ``local_sandbox: true`` asks for one (:class:`LocalSandboxService`)
  in its ``services()``, which :func:`toolrollout.tools.open_tools` opens;
  :func:`serve_local_sandboxes` starts them for a list of tools.
- The wire models (:class:`RunCodeRequest`, :class:`RunCodeResponse`...) mirror Sandbox
  Fusion's field for field.

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
