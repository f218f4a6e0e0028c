"""The control plane of :class:`~toolrollout.engines.SGLangClient`.

Every call but the raw info ones goes to all servers, and failures on several servers
raise :class:`~toolrollout.engines.EngineServersFailed`, so that a pause or a weight
update is never left half-applied silently.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..._exceptions import EngineError, EngineRequestRejected
from .. import _wire
from .._checkpoint import checkpoint_dtype
from .._control import EngineInfo, PauseMode, ServerInfo, ServerWeightUpdate, WeightUpdate
from .._http_client import HTTPClient
from .._types import SamplingParams

__all__: list[str] = []

logger = logging.getLogger("toolrollout.engines.sglang")

_MODEL_INFO = ("/model_info", "/get_model_info")
_SERVER_INFO = ("/server_info", "/get_server_info")


class _ControlPlane(HTTPClient):
    """The control calls of the SGLang client (a mixin: the client holds the state)."""

    _seed_checked = False
    """Whether the servers were asked if they honour ``sampling_seed`` (once a client)."""

    async def _check_seed_honoured(self) -> None:
        """Log once which servers ignore ``sampling_seed`` (SGLang reads it only with
        ``--enable-deterministic-inference``); a server that does not say is not judged."""
        if self._seed_checked:
            return
        self._seed_checked = True
        ignoring = []
        for url in self._router.urls:
            try:
                response = await self._request_once(url, "GET", "/server_info", account=False)
                server = _wire.parse_json(response.content, what=f"GET {url}/server_info")
            except EngineError as exc:
                logger.debug("%s: cannot say whether it honours sampling_seed: %s", url, exc)
                continue
            if isinstance(server, dict) and server.get("enable_deterministic_inference") is False:
                ignoring.append(url)
        if ignoring:
            logger.warning(
                "%s ignore%s sampling_seed: seeded samples are not reproducible (SGLang "
                "reads the seed only when started with --enable-deterministic-inference)",
                ", ".join(ignoring),
                "s" if len(ignoring) == 1 else "",
            )

    async def model_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /model_info`` (``/get_model_info`` on servers older than 2025-11)."""
        return await self._get_info(url, ("/model_info", "/get_model_info"))

    async def get_loads(
        self, url: str | None = None, include: str = "core,queues"
    ) -> dict[str, Any]:
        """``GET /v1/loads``: running and waiting requests, KV use, per DP rank."""
        return await self._get_info(url, (f"/v1/loads?include={include}",))

    async def server_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /server_info`` (``/get_server_info`` on older servers): args and limits."""
        return await self._get_info(url, ("/server_info", "/get_server_info"))

    async def info(self) -> EngineInfo:
        """What every server serves (``/model_info`` and ``/server_info``), merged."""

        async def one(url: str) -> ServerInfo:
            model = await self._get_info(url, _MODEL_INFO)
            server = await self._get_info(url, _SERVER_INFO)
            return _server_info(url, model, server)

        answers = await self._gather("info", one)
        return EngineInfo.merge(tuple(answers[url] for url in self._router.urls))

    async def logprob_mismatch(self, sampling: SamplingParams) -> str | None:
        """Why some server's logprobs are not the checkpoint's, or None: SGLang's are
        ``log_softmax(logits / T)`` of the weights it serves, which ``--dtype auto`` narrows
        for a float32 checkpoint (logprobs moved by up to 0.016 on the demo model)."""
        del sampling  # SGLang's logprob definition does not depend on it

        async def one(url: str) -> str | None:
            try:
                server = await self._get_info(url, _SERVER_INFO)
            except EngineRequestRejected as exc:
                if exc.status_code == 404:
                    return None  # no /server_info: not SGLang, nothing to judge it by
                raise
            return served_dtype_mismatch(url, server)

        answers = await self._gather("logprob_mismatch", one)
        reasons = [answers[url] for url in self._router.urls if answers[url] is not None]
        return "; ".join(r for r in reasons if r) or None

    async def flush_cache(self) -> bool:
        """Flush the prefix cache on every server; False when one refused (HTTP 400 while
        requests are running or waiting), the others still flushed."""
        self._check_open()
        flushed = True
        for url in self._router.urls:
            try:
                await self._call(url, "POST", "/flush_cache", what=f"flush_cache on {url}")
            except EngineRequestRejected as exc:
                if exc.status_code != 400:
                    raise
                logger.warning("flush_cache refused by %s: %s", url, exc)
                flushed = False
        return flushed

    # ------------------------------------------------------------------ weight sync

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """``POST /pause_generation`` on every server, before a trainer swaps weights."""
        self._check_pause_mode(mode)
        await self._on_every_server("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self, *, torch_empty_cache: bool = False) -> None:
        """``POST /continue_generation`` on every server: paused and waiting work resumes."""
        body = {"torch_empty_cache": True} if torch_empty_cache else {}
        await self._on_every_server("POST", "/continue_generation", body)

    async def update_weights_from_disk(
        self,
        model_path: str | os.PathLike[str],
        *,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> WeightUpdate:
        """Make every server load the weights in ``model_path`` (a path *on the server*);
        a refusal raises :class:`EngineRequestRejected` after all servers answered."""
        path = os.fspath(model_path)
        body: dict[str, Any] = {
            "model_path": path,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        if load_format is not None:
            body["load_format"] = load_format

        async def one(url: str) -> ServerWeightUpdate:
            try:
                response = await self._call(url, "POST", "/update_weights_from_disk", body)
                data = _wire.parse_json(response.content, what=f"update_weights_from_disk on {url}")
                status = response.status_code
            except EngineRequestRejected as exc:
                # SGLang answers 400 when the weights were loaded but the cache could not be
                # flushed (requests paused in place or retracted are still queued).
                if not (flush_cache and await self._applied_unflushed(url, weight_version, exc)):
                    raise
                data, status = {"success": True, "message": str(exc)}, exc.status_code
            if not isinstance(data, dict) or data.get("success") is not True:
                message = data.get("message") if isinstance(data, dict) else data
                raise EngineRequestRejected(
                    f"{url} could not update its weights from {path!r}: {message}",
                    status_code=status,
                )
            paused = data.get("num_paused_requests")
            return ServerWeightUpdate(
                url=url,
                message=str(data.get("message") or ""),
                num_paused_requests=paused if isinstance(paused, int) else 0,
            )

        answered = await self._gather("/update_weights_from_disk", one)
        answers = [answered[url] for url in self._router.urls]
        return WeightUpdate(model_path=path, weight_version=weight_version, servers=tuple(answers))

    async def _applied_unflushed(
        self, url: str, weight_version: str | None, refusal: EngineRequestRejected
    ) -> bool:
        """Whether a refusal is SGLang's "weights updated, cache not flushed" (paused
        requests still queued): its scheduler then reports ``weight_version`` already."""
        if weight_version is None:
            return False
        server = await self._get_info(url, _SERVER_INFO)
        if _scheduler_version(server) != weight_version:
            return False
        logger.warning(
            "%s loaded %s but kept its prefix cache (%s): call flush_cache() once the "
            "paused requests have finished, or new requests may reuse KV of the old weights",
            url,
            weight_version,
            refusal,
        )
        return True


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _scheduler_version(server: dict[str, Any]) -> str | None:
    """The weight version every DP rank's scheduler labels results with (``/server_info``'s
    ``internal_states``): after an unflushed update, the new one (``/model_info`` lags)."""
    states = server.get("internal_states")
    if not isinstance(states, list) or not states:
        return None
    versions = {s.get("weight_version") if isinstance(s, dict) else None for s in states}
    version = versions.pop() if len(versions) == 1 else None
    return version if isinstance(version, str) else None


def _engine_kind(server: dict[str, Any]) -> str:
    """``sglang``, or which of the project's SGLang-speaking servers this is."""
    if server.get("is_embedded_engine") is True:
        return "toolrollout-embedded"
    return "toolrollout-latency-model" if server.get("is_latency_model") is True else "sglang"


def _server_info(url: str, model: dict[str, Any], server: dict[str, Any]) -> ServerInfo:
    """One server's :class:`ServerInfo` from its ``/model_info`` and ``/server_info``."""

    def text(key: str) -> str | None:
        for source in (model, server):
            value = source.get(key)
            if isinstance(value, str):
                return value
        return None

    scheduler = _scheduler_version(server)
    length = _as_int(server.get("context_length"))
    if length is None:
        longest_input = _as_int(server.get("max_req_input_len"))
        length = longest_input + 1 if longest_input is not None else None
    return ServerInfo(
        url=url,
        model_path=text("model_path"),
        weight_version=scheduler if scheduler is not None else text("weight_version"),
        context_length=length,
        vision=model.get("has_image_understanding") is True,
        engine=_engine_kind(server),
        engine_version=text("version"),
        dtype=served_dtype(server),
    )


_FULL = frozenset({"float32", "float", "fp32"})


def served_dtype(server: dict[str, Any]) -> str | None:
    """The dtype a server (its ``/server_info``) computes in: ``auto`` is resolved as
    SGLang's ``_get_and_verify_dtype`` does, where the checkpoint is readable here."""
    flag = server.get("dtype")
    if not isinstance(flag, str):
        return None
    if flag.lower() != "auto":
        return flag
    model_path = server.get("model_path")
    checkpoint = checkpoint_dtype(model_path) if isinstance(model_path, str) else None
    if checkpoint is None:
        return flag
    dtype, model_type = checkpoint
    if dtype == "float32":
        return "bfloat16" if model_type.startswith("gemma") else "float16"
    return dtype


def served_dtype_mismatch(url: str, server: dict[str, Any]) -> str | None:
    """One line when ``server`` (its ``/server_info``) serves a float32 checkpoint narrower."""
    flag = server.get("dtype")
    if not isinstance(flag, str) or flag.lower() in _FULL:
        return None
    model_path = server.get("model_path")
    checkpoint = checkpoint_dtype(model_path) if isinstance(model_path, str) else None
    if checkpoint is None:
        logger.warning(
            "%s serves with --dtype %s and its checkpoint's dtype could not be read here "
            "(%s): logprob exactness unchecked (start it with --dtype float32 for a float32 "
            "checkpoint)",
            url,
            flag,
            model_path,
        )
        return None
    if checkpoint[0] != "float32":
        return None  # served in its own half dtype (auto), or cast between halves
    served = served_dtype(server)
    return (
        f"{url} serves the float32 checkpoint {model_path} in {served} (--dtype {flag}), "
        "so its logprobs are not the float32 model's: start it with --dtype float32"
    )
