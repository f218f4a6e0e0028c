"""The ``mcpServers`` JSON file (Claude Desktop / Cursor convention) read into typed specs.

``command``: a stdio server; ``url``: a remote one (SSE when its path matches ``/sse``, as
fastmcp infers, else streamable HTTP); both: an HTTP server the run starts itself. Unknown
keys are ignored. Strings may hold ``${PYTHON}``, ``${CONFIG_DIR}`` and ``${env:NAME}``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, PositiveFloat, ValidationError

from toolrollout._exceptions import ConfigError
from toolrollout.tools._config import _validation_error, read_config_file

__all__ = [
    "HttpServer",
    "McpServerSpec",
    "StdioServer",
    "load_mcp_servers",
    "parse_mcp_servers",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class StdioServer:
    """A server run as a child process, speaking MCP over its stdin/stdout."""

    name: str
    """The key of the entry in ``mcpServers``."""
    command: str
    """Executable to run (looked up on ``PATH`` unless it is a path)."""
    args: tuple[str, ...] = ()
    """Its command-line arguments."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Extra environment variables (on top of the MCP SDK's safe subset of ours)."""
    cwd: str | None = None
    """Working directory of the child (None: ours)."""

    def describe(self) -> str:
        """The command line, for messages (no environment: it may hold secrets)."""
        return shlex.join([self.command, *self.args])


@dataclass(frozen=True, kw_only=True, slots=True)
class HttpServer:
    """A remote server reached over streamable HTTP or (legacy) SSE."""

    name: str
    """The key of the entry in ``mcpServers``."""
    url: str
    """Endpoint URL, e.g. ``http://127.0.0.1:8000/mcp`` or ``http://host/sse``."""
    transport: Literal["streamable-http", "sse"] = "streamable-http"
    """Wire protocol."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """HTTP headers sent with every request (e.g. ``Authorization``)."""
    timeout: float = 30.0
    """Seconds for connecting and for each HTTP request."""
    sse_read_timeout: float = 300.0
    """Seconds an event stream may stay silent before it is dropped."""
    command: str | None = None
    """With a command, the run starts (and supervises) the server on the URL's local port."""
    args: tuple[str, ...] = ()
    """The command's arguments."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Extra environment variables of the launched server."""
    cwd: str | None = None
    """Working directory of the launched server (None: ours)."""

    def describe(self) -> str:
        """Transport and URL, for messages (no headers: they may hold secrets)."""
        return f"{self.transport} {self.url}"


McpServerSpec = StdioServer | HttpServer
"""Where and how to reach one MCP server."""

_Transport = Literal["stdio", "http", "streamable-http", "streamable_http", "sse"]
_SSE_PATH = re.compile(r"/sse(/|\?|&|$)")
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class _ServerModel(BaseModel):
    """One ``mcpServers`` entry; other hosts' keys (``description``, ...) are ignored."""

    model_config = ConfigDict(extra="allow")

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    transport: _Transport | None = None
    type: _Transport | None = None
    """VS Code's spelling of ``transport``."""
    auth_token: str | None = None
    """verl's key: sent as ``Authorization: Bearer <token>``."""
    api_key: str | None = None
    """The same, under the name toolrollout's other tool configs use."""
    timeout: PositiveFloat | None = None
    sse_read_timeout: PositiveFloat | None = None
    disabled: bool = False


class _FileModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    mcpServers: dict[str, _ServerModel]


def _expand(value: str, key: str, source: str, config_dir: Path) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "PYTHON":
            return sys.executable
        if name == "CONFIG_DIR":
            return str(config_dir)
        if name.startswith("env:"):
            variable = name[4:]
            if variable not in os.environ:
                raise ConfigError(f"{source}: {key}: environment variable {variable!r} is not set")
            return os.environ[variable]
        raise ConfigError(
            f"{source}: {key}: unknown placeholder '${{{name}}}' "
            "(known: ${PYTHON}, ${CONFIG_DIR}, ${env:NAME})"
        )

    return _PLACEHOLDER.sub(replace, value)


def _launch(
    command: str,
    model: _ServerModel,
    expand: Callable[[str, str], str],
    config_dir: Path,
    where: str,
) -> dict[str, Any]:
    """How to start a server the run starts itself: command, args, env and cwd, expanded."""
    if not command.strip():
        raise ConfigError(f"{where}.command: must not be empty")
    cwd = None
    if model.cwd is not None:
        cwd_path = Path(expand(model.cwd, "cwd"))
        cwd = str(cwd_path if cwd_path.is_absolute() else config_dir / cwd_path)
    return {
        "command": expand(command, "command"),
        "args": tuple(expand(arg, f"args[{i}]") for i, arg in enumerate(model.args)),
        "env": {k: expand(v, f"env.{k}") for k, v in model.env.items()},
        "cwd": cwd,
    }


def _server(name: str, model: _ServerModel, source: str, config_dir: Path) -> McpServerSpec:
    where = f"mcpServers.{name}"

    def expand(value: str, key: str) -> str:
        return _expand(value, f"{where}.{key}", source, config_dir)

    if model.transport is not None and model.type is not None and model.transport != model.type:
        raise ConfigError(f"{source}: {where}: 'transport' and 'type' disagree")
    transport = model.transport or model.type
    if model.command is not None and model.url is None:
        if transport not in (None, "stdio"):
            raise ConfigError(
                f"{source}: {where}.transport: must be 'stdio' for a server with a 'command' "
                f"(got {transport!r})"
            )
        return StdioServer(
            name=name, **_launch(model.command, model, expand, config_dir, f"{source}: {where}")
        )
    if model.url is None:
        raise ConfigError(f"{source}: {where}: needs either 'command' (stdio) or 'url' (HTTP)")
    url = expand(model.url, "url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{source}: {where}.url: must be an http(s) URL (got {url!r})")
    if transport == "stdio":
        raise ConfigError(
            f"{source}: {where}.transport: 'stdio' needs a 'command' and no 'url' "
            "(a 'command' with a 'url' is an HTTP server the run starts)"
        )
    launch: dict[str, Any] = {}
    if model.command is not None:  # an HTTP server the run starts itself
        if parts.hostname not in _LOCAL_HOSTS:
            raise ConfigError(
                f"{source}: {where}.url: a server with a 'command' is started on this "
                f"machine, so its url must be local (127.0.0.1 or localhost), got {url!r}"
            )
        if parts.port is None:
            raise ConfigError(f"{source}: {where}.url: a started server needs a port: {url!r}")
        launch = _launch(model.command, model, expand, config_dir, f"{source}: {where}")
    if transport is None:
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        resolved: Literal["streamable-http", "sse"] = (
            "sse" if _SSE_PATH.search(tail) else "streamable-http"
        )
    else:
        resolved = "sse" if transport == "sse" else "streamable-http"
    headers = {k: expand(v, f"headers.{k}") for k, v in model.headers.items()}
    for key in ("auth_token", "api_key"):
        token = getattr(model, key)
        if token is not None:
            headers.setdefault("Authorization", f"Bearer {expand(token, key)}")
    return HttpServer(
        name=name,
        url=url,
        transport=resolved,
        headers=headers,
        timeout=model.timeout or 30.0,
        sse_read_timeout=model.sse_read_timeout or 300.0,
        **launch,
    )


def parse_mcp_servers(
    data: object,
    *,
    source: str = "<mcpServers>",
    config_dir: str | PathLike[str] | None = None,
) -> dict[str, McpServerSpec]:
    """Read already-parsed ``mcpServers`` JSON (or VS Code's ``servers``, or a bare mapping
    of entries) into specs, by server name, skipping disabled ones. ``config_dir`` is where
    relative ``cwd`` values and ``${CONFIG_DIR}`` point (default: the current one)."""
    folder = Path(config_dir) if config_dir is not None else Path.cwd()
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a JSON object with 'mcpServers', got {type(data).__name__}"
        )
    if "mcpServers" not in data:
        if isinstance(data.get("servers"), Mapping):
            data = {"mcpServers": data["servers"]}
        elif data and all(
            isinstance(v, Mapping) and ("command" in v or "url" in v) for v in data.values()
        ):
            data = {"mcpServers": data}
    try:
        parsed = _FileModel.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(source, exc) from exc
    servers = {
        name: _server(name, model, source, folder)
        for name, model in parsed.mcpServers.items()
        if not model.disabled
    }
    if not servers:
        raise ConfigError(f"{source}: mcpServers: no (enabled) servers")
    return servers


def load_mcp_servers(path: str | PathLike[str]) -> dict[str, McpServerSpec]:
    """Load an ``mcpServers`` JSON file (see :func:`parse_mcp_servers`)."""
    source = str(path)
    text = read_config_file(path)
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from exc
    return parse_mcp_servers(data, source=source, config_dir=Path(path).resolve().parent)
