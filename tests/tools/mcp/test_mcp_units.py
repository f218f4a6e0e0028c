"""Parts of the MCP backend that need no server: result conversion, tool building,
allow-lists and names, argument checks, and the manager's lifecycle rules."""

from __future__ import annotations

import base64
import io
import logging
import struct
import sys
import zlib
from typing import Any

import pytest
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
)
from mcp.types import Tool as McpToolInfo
from PIL import Image

from toolrollout.exceptions import ToolExecutionError, ToolUnavailable, UserError
from toolrollout.tools import ToolCallRequest, ToolExecutor, calculator_tool
from toolrollout.tools.mcp import McpClientManager, McpTool, mcp_sessions
from toolrollout.tools.mcp._results import decode_image, mcp_result_to_tool_result
from toolrollout.tools.mcp._servers import StdioServer
from toolrollout.tools.mcp._tool import build_mcp_tools, mcp_managers


def png(color: str = "green", size: tuple[int, int] = (2, 3)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def info(name: str, schema: dict[str, Any] | None = None, description: str = "") -> McpToolInfo:
    return McpToolInfo(
        name=name,
        description=description or None,
        input_schema=schema if schema is not None else {"type": "object", "properties": {}},
    )


def manager(*names: str) -> McpClientManager:
    return McpClientManager([StdioServer(name=n, command="true") for n in names or ("s",)])


class TestResultConversion:
    def test_text_images_and_structured_content(self) -> None:
        result = CallToolResult(
            content=[
                TextContent(text="first"),
                ImageContent(data=png("green"), mime_type="image/png"),
                TextContent(text="second"),
                EmbeddedResource(
                    type="resource",
                    resource=BlobResourceContents(
                        uri="file:///p.png", mime_type="image/png", blob=png("blue", (1, 1))
                    ),
                ),
            ],
            structured_content={"answer": 42},
        )
        converted = mcp_result_to_tool_result(result, tool_name="t")
        assert converted.text == "first\nsecond"
        assert [image.size for image in converted.images] == [(2, 3), (1, 1)]
        assert converted.images[0].convert("RGB").getpixel((0, 0)) == (0, 128, 0)
        assert converted.structured == {"answer": 42}
        assert not converted.is_error and converted.error is None

    def test_is_error_keeps_the_text_and_a_typed_error(self) -> None:
        result = CallToolResult(content=[TextContent(text="no such city")], is_error=True)
        converted = mcp_result_to_tool_result(result, tool_name="weather")
        assert (converted.text, converted.is_error) == ("no such city", True)
        assert isinstance(converted.error, ToolExecutionError)
        assert "weather" in str(converted.error) and "no such city" in str(converted.error)
        empty = mcp_result_to_tool_result(CallToolResult(content=[], is_error=True), tool_name="w")
        assert empty.is_error and empty.text.startswith("Error: ")

    def test_undecodable_image_is_dropped_with_a_note_and_the_rest_kept(self) -> None:
        garbage = base64.b64encode(b"not an image").decode()
        result = CallToolResult(
            content=[
                TextContent(text="before"),
                ImageContent(data=garbage, mime_type="image/png"),
                ImageContent(data=png("red"), mime_type="image/png"),
                TextContent(text="after"),
            ]
        )
        converted = mcp_result_to_tool_result(result, tool_name="t")
        assert not converted.is_error
        assert converted.text == (
            "before\n[image dropped: image/png data (12 bytes) is not a readable image]\nafter"
        )
        assert [image.size for image in converted.images] == [(2, 3)]

    def test_png_with_a_bad_ancillary_chunk_crc_is_an_image(self) -> None:
        # A valid PNG with a tEXt chunk whose CRC is wrong: libpng and browsers skip the
        # chunk; Pillow refuses the file unless the chunk is dropped first.
        raw = base64.b64decode(png("blue", (4, 4)))
        body = b"tEXtComment\x00hello"
        chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body) ^ 1)
        broken = raw[:33] + chunk + raw[33:]  # after the signature and IHDR
        with pytest.raises(OSError, match="cannot identify"):  # strict Pillow
            Image.open(io.BytesIO(broken)).load()
        image = decode_image(base64.b64encode(broken).decode())
        assert image.size == (4, 4) and image.convert("RGB").getpixel((1, 1)) == (0, 0, 255)
        # A bad CRC in a critical chunk (IHDR, bytes 29-32) is still an error.
        bad_header = raw[:29] + bytes([raw[29] ^ 1]) + raw[30:]
        with pytest.raises(ValueError, match="not a readable image"):
            decode_image(base64.b64encode(bad_header).decode())

    def test_textual_blob_resource_shows_its_text(self) -> None:
        def blob(mime: str, data: bytes) -> EmbeddedResource:
            contents = BlobResourceContents(
                uri="demo://r", mime_type=mime, blob=base64.b64encode(data).decode()
            )
            return EmbeddedResource(type="resource", resource=contents)

        result = CallToolResult(
            content=[
                blob("text/plain", "Resource 1: café".encode()),
                blob("application/json", b'{"a": 1}'),
                blob("application/octet-stream", b"\x00\x01"),
                blob("text/plain", b"\xff\xfe not utf-8"),
            ]
        )
        converted = mcp_result_to_tool_result(result, tool_name="t")
        assert converted.text.splitlines() == [
            "Resource 1: café",
            '{"a": 1}',
            "[resource demo://r (application/octet-stream): 2 bytes]",
            "[resource demo://r (text/plain): 12 bytes]",
        ]


class TestBuildTools:
    def test_names_schemas_and_allow_list(self) -> None:
        owner = manager("files", "web")
        listings = {
            "files": [
                info("read.file", {"type": "object", "properties": {"p": {"type": "string"}}}),
                info("list", None, description="List things."),
            ],
            "web": [info("fetch")],
        }
        tools = build_mcp_tools(owner, listings)
        assert [t.name for t in tools] == ["read_file", "list", "fetch"]
        assert [(t.server, t.remote_name) for t in tools] == [
            ("files", "read.file"),
            ("files", "list"),
            ("web", "fetch"),
        ]
        assert tools[1].description == "List things."
        assert tools[0].schema()["function"]["parameters"]["properties"] == {
            "p": {"type": "string"}
        }

        selected = build_mcp_tools(owner, listings, selected=["fetch", "list"])
        assert [t.name for t in selected] == ["list", "fetch"]  # in the servers' order
        prefixed = build_mcp_tools(owner, listings, selected=["fetch"], name_prefix="{server}__")
        assert [t.name for t in prefixed] == ["web__fetch"]
        with pytest.raises(UserError, match=r"'nope'.*available: fetch, list, read\.file"):
            build_mcp_tools(owner, listings, selected=["fetch", "nope"])

    def test_task_required_tools_are_left_out_with_a_reason(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        listed = [
            McpToolInfo.model_validate(
                {
                    "name": "research",
                    "inputSchema": {"type": "object"},
                    "execution": {"taskSupport": "required"},
                }
            ),
            McpToolInfo.model_validate(
                {
                    "name": "maybe",
                    "inputSchema": {"type": "object"},
                    "execution": {"taskSupport": "optional"},
                    "annotations": {"readOnlyHint": True},
                    "outputSchema": {"type": "object", "properties": {"n": {"type": "number"}}},
                    "title": "Maybe",
                }
            ),
        ]
        owner = manager()
        with caplog.at_level(logging.WARNING, logger="toolrollout.tools.mcp"):
            tools = build_mcp_tools(owner, {"s": listed})
        assert [t.name for t in tools] == ["maybe"]
        assert "'research' of server 's' left out" in caplog.text
        assert "taskSupport: required" in caplog.text
        assert tools[0].annotations == {"readOnlyHint": True}
        assert tools[0].output_schema == {"type": "object", "properties": {"n": {"type": "number"}}}
        assert tools[0].title == "Maybe"
        with pytest.raises(UserError, match="'research' of server 's': it requires MCP task"):
            build_mcp_tools(owner, {"s": listed}, selected=["research"])

    def test_same_name_on_two_servers_needs_a_prefix(self) -> None:
        owner = manager("a", "b")
        listings = {"a": [info("search")], "b": [info("search")]}
        with pytest.raises(UserError, match=r"both be named 'search'.*tool_name_prefix"):
            build_mcp_tools(owner, listings)
        tools = build_mcp_tools(owner, listings, name_prefix="{server}_")
        assert [t.name for t in tools] == ["a_search", "b_search"]

    async def test_arguments_are_checked_against_the_input_schema(self) -> None:
        schema = {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1}},
            "required": ["n"],
        }
        (tool,) = build_mcp_tools(manager(), {"s": [info("count", schema)]})
        tool.check_arguments({"n": 3})
        executor = ToolExecutor([tool])
        below = await executor.run_call(ToolCallRequest("count", {"n": 0}))
        assert below.error_kind == "ToolArgumentError"
        assert "n: 0 is less than the minimum of 1" in below.text
        missing = await executor.run_call(ToolCallRequest("count", {}))
        assert missing.error_kind == "ToolArgumentError" and "'n'" in missing.text
        assert executor.statistics().tools["count"].invalid_arguments == 2
        # A schema the validator cannot read is left to the server.
        (loose,) = build_mcp_tools(
            manager(), {"s": [info("odd", {"type": "object", "properties": {"x": {"type": 5}}})]}
        )
        loose.check_arguments({"x": "anything"})


class TestLifecycle:
    async def test_calls_need_an_open_manager(self) -> None:
        owner = manager("s")
        (tool,) = build_mcp_tools(owner, {"s": [info("ping")]})
        result = await ToolExecutor([tool]).run_call(ToolCallRequest("ping", {}))
        assert result.is_error and result.error_kind == "UserError"
        assert "not open" in result.text and "mcp_sessions" in result.text
        async with owner:
            with pytest.raises(UserError, match="already open"):
                await owner.start()
        result = await ToolExecutor([tool]).run_call(ToolCallRequest("ping", {}))
        assert result.error_kind == "UserError" and "closed" in result.text
        await owner.aclose()  # idempotent

    async def test_mcp_sessions_opens_each_manager_once(self) -> None:
        first, second = manager("a"), manager("b")
        tools = [
            *build_mcp_tools(first, {"a": [info("x"), info("y")]}),
            *build_mcp_tools(second, {"b": [info("z")]}),
            calculator_tool(),
        ]
        assert mcp_managers(tools) == [first, second]
        async with mcp_sessions(tools) as managers:
            assert managers == [first, second]
            assert first.is_open and second.is_open
        assert not first.is_open and not second.is_open
        async with mcp_sessions([calculator_tool()]) as none:
            assert none == []

    async def test_unknown_server_and_bad_specs(self) -> None:
        owner = manager("s")
        async with owner:
            with pytest.raises(UserError, match=r"unknown MCP server 'x'; known: s"):
                await owner.call_tool("x", "t")
        with pytest.raises(UserError, match="two MCP servers are named 's'"):
            McpClientManager(
                [StdioServer(name="s", command="a"), StdioServer(name="s", command="b")]
            )
        with pytest.raises(UserError, match="at least one server"):
            McpClientManager([])

    async def test_failed_connection_is_tool_unavailable(self) -> None:
        owner = McpClientManager(
            [StdioServer(name="s", command=sys.executable, args=("-c", "pass"))],
            connect_timeout=10,
        )
        (tool,) = build_mcp_tools(owner, {"s": [info("t")]})
        async with owner:
            result = await ToolExecutor([tool.with_limits(tool.limits)]).run_call(
                ToolCallRequest("t", {})
            )
        assert result.is_error and result.error_kind == "ToolUnavailable"
        assert "cannot connect to MCP server 's'" in result.text
        assert owner.statistics()["s"].connect_failures == 3  # the first try and 2 retries
        async with owner:
            with pytest.raises(ToolUnavailable, match="cannot connect to MCP server 's'"):
                await owner.connect()  # eager, and not wrapped in an exception group
            with pytest.raises(UserError, match="unknown MCP server 'x'"):
                await owner.connect("x")


def test_mcp_tool_is_a_tool() -> None:
    (tool,) = build_mcp_tools(manager(), {"s": [info("t")]})
    assert isinstance(tool, McpTool)
    renamed = tool.with_schema({"name": "other"})
    assert renamed.name == "other" and renamed.manager is tool.manager
