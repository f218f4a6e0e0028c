"""The ``search`` tool: a client of the Search-R1 retrieval API (``POST /retrieve``), as
verl's ``SearchTool`` but with typed errors, and plain text unless ``result_format: json``."""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)

from toolrollout._exceptions import (
    ToolArgumentError,
    ToolExecutionError,
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

from ._format import RetrievedDocument, format_results, parse_response
from ._local import LocalRetrieverService

__all__ = [
    "DEFAULT_DESCRIPTION",
    "RETRY_STATUSES",
    "ResultFormat",
    "SearchTool",
    "VerlSearchTool",
    "build_search_entry",
]

ResultFormat = Literal["text", "json"]
"""``text``: the formatted hits; ``json``: verl's ``{"result": "<formatted hits>"}``."""

RETRY_STATUSES: frozenset[int] = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses retried (verl retries 500/502/503/504; 429 means "later" too)."""

DEFAULT_DESCRIPTION = (
    "Search a document collection. Returns the most relevant passages for each query."
)


def _default_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "query_list": {
                "type": "array",
                "items": {"type": "string"},
                "description": "One or more fully-formed search queries; each gets its own "
                "results.",
            }
        },
        "required": ["query_list"],
    }


def _default_limits() -> ToolLimits:
    # The tool retries HTTP failures itself, so the executor does not retry on top.
    return ToolLimits(timeout=60.0, retry=RetryPolicy(max_attempts=1))


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verified TLS context for every client: building one per call costs milliseconds."""
    return httpx.create_ssl_context()


def _snippet(response: httpx.Response, limit: int = 200) -> str:
    text = " ".join(response.text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _SearchConfigModel(BaseModel):
    """The tool's own keys of a tool-config ``config`` mapping."""

    model_config = ConfigDict(extra="forbid")

    retrieval_service_url: str
    topk: PositiveInt = 3
    return_scores: bool = True
    request_timeout: PositiveFloat | None = None
    http_retries: NonNegativeInt = 3
    retry_backoff: NonNegativeFloat = 0.5
    max_retry_backoff: NonNegativeFloat = 5.0
    result_format: ResultFormat = "text"
    max_queries: PositiveInt | None = None
    headers: dict[str, str] = {}
    api_key: str | None = Field(default=None, repr=False)
    local_corpus: str | None = None


@dataclass(frozen=True, kw_only=True)
class SearchTool(Tool):
    """Search a Search-R1-compatible retrieval service with the model's ``query_list`` (or
    one ``query``), up to :attr:`topk` hits each, formatted as verl does.

    HTTP failures are retried :attr:`http_retries` times, then raised as ToolUnavailable;
    a 4xx answer or an unreadable body raises ToolExecutionError.
    """

    name: str = "search"
    description: str = DEFAULT_DESCRIPTION
    parameters: Mapping[str, Any] = field(default_factory=_default_parameters)
    limits: ToolLimits = field(default_factory=_default_limits)
    retrieval_service_url: str
    """Full URL of the endpoint, e.g. ``http://127.0.0.1:8000/retrieve`` (a URL without a
    path gets ``/retrieve``)."""
    topk: int = 3
    """Hits per query."""
    return_scores: bool = True
    """Ask the server for scores (they are reported in ``structured``; verl asks too)."""
    request_timeout: float = 30.0
    """Seconds one HTTP request may take (verl's ``timeout``)."""
    http_retries: int = 3
    """Extra attempts after a connection error, timeout or 429/5xx answer."""
    retry_backoff: float = 0.5
    """First wait between attempts in seconds, doubled each time (plus jitter)."""
    max_retry_backoff: float = 5.0
    """Longest wait between attempts."""
    result_format: ResultFormat = "text"
    """``text`` or ``json`` (verl's ``{"result": ...}`` wrapper)."""
    max_queries: int | None = None
    """Most queries one call may carry (None: no limit); more is the model's error."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra HTTP headers (e.g. an ``Authorization`` for a hosted retriever)."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer <key>`` (``toolrollout retriever serve --api-key``);
    a config's ``api_key: ${NAME}`` reads it from the environment."""
    local_corpus: str | None = None
    """When set (a corpus path, or ``demo``), toolrollout's BM25 retriever runs on this URL's
    port while the tool is used (its :meth:`services`)."""
    transport: httpx.AsyncBaseTransport | None = field(default=None, compare=False, repr=False)
    """An httpx transport to use instead of the network (tests: ``httpx.MockTransport``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            url = httpx.URL(self.retrieval_service_url)
        except httpx.InvalidURL as exc:
            raise UserError(f"retrieval_service_url is not a URL: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise UserError(
                "retrieval_service_url must be an http(s) URL such as "
                f"http://127.0.0.1:8000/retrieve, got {self.retrieval_service_url!r}"
            )
        if url.path in ("", "/"):
            object.__setattr__(self, "retrieval_service_url", str(url.copy_with(path="/retrieve")))
        if self.topk < 1:
            raise UserError(f"topk must be >= 1, got {self.topk}")
        if not self.request_timeout > 0:
            raise UserError(f"request_timeout must be > 0, got {self.request_timeout}")
        if self.http_retries < 0 or self.retry_backoff < 0 or self.max_retry_backoff < 0:
            raise UserError("http_retries, retry_backoff and max_retry_backoff must be >= 0")
        if self.result_format not in ("text", "json"):
            raise UserError(f"result_format must be 'text' or 'json', got {self.result_format!r}")
        if self.max_queries is not None and self.max_queries < 1:
            raise UserError(f"max_queries must be >= 1, got {self.max_queries}")

    def services(self) -> Sequence[ToolService]:
        """The local retriever on this URL's port when :attr:`local_corpus` asks for it."""
        if self.local_corpus is None:
            return ()
        return (
            LocalRetrieverService.for_url(
                self.retrieval_service_url, self.local_corpus, tool=self.name
            ),
        )

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None = None
    ) -> SearchTool:
        """Build from a tool-config ``config`` (verl's SearchTool keys; ``timeout`` also
        sets :attr:`request_timeout` unless that is given)."""
        parsed = own_config(_SearchConfigModel, config)
        # Only the keys given: unset ones keep the class's defaults (VerlSearchTool's differ).
        values = {k: v for k, v in parsed.model_dump(exclude_unset=True).items() if v is not None}
        if values.get("api_key") is not None:
            values["api_key"] = expand_env(values["api_key"], where="config.api_key")
        if "request_timeout" not in values and config.get("timeout") is not None:
            values["request_timeout"] = float(config["timeout"])
        return cls(**values)

    # -- arguments ---------------------------------------------------------------------

    def _queries(self, arguments: Mapping[str, Any]) -> list[str]:
        def bad(message: str) -> ToolArgumentError:
            return ToolArgumentError(f"invalid arguments for tool {self.name!r}: {message}")

        has_list = arguments.get("query_list") is not None
        has_one = arguments.get("query") is not None
        if has_list and has_one:
            raise bad("pass either 'query_list' or 'query', not both")
        if has_list:
            raw = arguments["query_list"]
            if not isinstance(raw, list) or not all(isinstance(q, str) for q in raw):
                raise bad("'query_list' must be a list of strings")
            queries: list[str] = raw
        elif has_one:
            if not isinstance(arguments["query"], str):
                raise bad("'query' must be a string")
            queries = [arguments["query"]]
        else:
            raise bad("missing required argument 'query_list' (a list of search queries)")
        if not queries:
            raise bad("'query_list' is empty")
        if any(not q.strip() for q in queries):
            raise bad("a query is empty")
        if self.max_queries is not None and len(queries) > self.max_queries:
            raise bad(f"{len(queries)} queries; at most {self.max_queries} per call")
        return queries

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Accept ``query_list`` (list of strings) or ``query`` (a string)."""
        self._queries(arguments)

    # -- HTTP --------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=self.transport,
            timeout=self.request_timeout,
            headers={"Accept": "application/json", **self.headers, **bearer_headers(self.api_key)},
            verify=_ssl_context(),
        )

    async def _post(self, payload: Mapping[str, Any]) -> tuple[Any, int]:
        """POST with retries; the decoded JSON body and the number of attempts."""
        url = self.retrieval_service_url
        client = self._client()
        post = RetryingPost(
            client=client,
            url=url,
            retries=self.http_retries,
            backoff=self.retry_backoff,
            max_backoff=self.max_retry_backoff,
            jitter=self.retry_backoff / 2,
            retry_statuses=RETRY_STATUSES,
            retry_read_timeouts=True,
            local=self.local_corpus is not None,
        )
        try:
            response = await post.send(payload)
        except RetryableAnswer as exc:
            raise ToolUnavailable(
                f"tool {self.name!r}: the retrieval service at {url} answered HTTP "
                f"{exc.response.status_code} ({post.attempts} attempts): "
                f"{_snippet(exc.response)}"
            ) from exc
        except httpx.TimeoutException as exc:
            raise ToolUnavailable(
                f"tool {self.name!r}: the retrieval service at {url} did not answer within "
                f"{self.request_timeout:g}s ({post.attempts} attempts){post.fault()}"
            ) from exc
        except httpx.TransportError as exc:
            raise ToolUnavailable(
                f"tool {self.name!r}: cannot reach the retrieval service at {url} "
                f"({post.attempts} attempts): {type(exc).__name__}: "
                f"{str(exc) or 'connection lost'}{post.fault()}"
            ) from exc
        except httpx.HTTPError as exc:
            raise ToolExecutionError(
                f"tool {self.name!r}: request to {url} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if self.transport is None:  # a caller's transport stays open for its next call
                await client.aclose()
        return self._decoded(response), post.attempts

    def _decoded(self, response: httpx.Response) -> Any:
        """The JSON body of a final answer; an error status or invalid JSON fails the call."""
        url = self.retrieval_service_url
        if response.is_error:
            raise ToolExecutionError(
                f"tool {self.name!r}: the retrieval service at {url} rejected the request "
                f"with HTTP {response.status_code}: {_snippet(response)}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise ToolExecutionError(
                f"tool {self.name!r}: the retrieval service at {url} answered with invalid "
                f"JSON: {_snippet(response)}"
            ) from exc

    # -- the call ----------------------------------------------------------------------

    async def search(self, queries: list[str]) -> tuple[list[list[RetrievedDocument]], int]:
        """Retrieve ``topk`` hits for each query; also returns the number of HTTP attempts."""
        payload = {"queries": queries, "topk": self.topk, "return_scores": self.return_scores}
        data, attempts = await self._post(payload)
        try:
            return parse_response(data, len(queries)), attempts
        except ValueError as exc:
            raise ToolExecutionError(
                f"tool {self.name!r}: unexpected answer from the retrieval service at "
                f"{self.retrieval_service_url}: {exc}"
            ) from exc

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Search every query and return the formatted hits."""
        queries = self._queries(arguments)
        results, attempts = await self.search(queries)
        text = format_results(results)
        if self.result_format == "json":
            text = json.dumps({"result": text}, ensure_ascii=False)
        total = sum(len(hits) for hits in results)
        return ToolResult(
            text=text,
            structured={
                "queries": queries,
                "results": [
                    [{"id": h.id, "title": h.title, "score": h.score} for h in hits]
                    for hits in results
                ],
            },
            metrics={
                "query_count": float(len(queries)),
                "total_results": float(total),
                "empty_queries": float(sum(1 for hits in results if not hits)),
                "attempts": float(attempts),
            },
        )


@dataclass(frozen=True, kw_only=True)
class VerlSearchTool(SearchTool):
    """:class:`SearchTool` with verl's output, ``{"result": "..."}``: what verl's name loads as."""

    result_format: ResultFormat = "json"


build_search_entry = native_entry_builder(
    "search", SearchTool, "toolrollout.search.SearchTool (or verl.tools.search_tool.SearchTool)"
)
"""Builds ``type: search`` entries (``class_name``: a search tool class)."""
