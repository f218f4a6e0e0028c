"""Whether a leftover file can be continued by this run: its token ids only mean the same
with the same tokenizer, tools and tool-call format. :func:`leftover_info` is what a run
writes next to its leftover; :func:`check_leftover_matches` checks a resuming run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolrollout._exceptions import FieldError, UserError
from toolrollout._version import __version__

from ._config import RolloutConfig
from ._state import sampling_record

if TYPE_CHECKING:
    from toolrollout.chat import ChatFormat
    from toolrollout.engines import EngineInfo

__all__ = [
    "chat_setup",
    "check_leftover_matches",
    "effective_tool_parser",
    "engine_facts",
    "leftover_info",
    "run_metadata",
    "run_sampling",
    "sampling_changes",
    "tokenizer_fingerprint",
]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of the vocabulary and chat template: equal means the token ids mean the same."""
    digest = hashlib.sha256()
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(str(getattr(tokenizer, "chat_template", None) or "").encode())
    return digest.hexdigest()[:16]


def effective_tool_parser(config: RolloutConfig | str | None, tokenizer: Any) -> str:
    """The parser a run uses: the one named, else its model family's. ``config`` is the
    run's :class:`RolloutConfig`, or just a parser name (None: detect the family)."""
    if not isinstance(config, RolloutConfig):
        config = RolloutConfig(tool_parser=config)
    if config.tool_parser is not None:
        return config.tool_parser
    return _chat(config, tokenizer).family.tool_parser


def chat_setup(config: RolloutConfig, tokenizer: Any) -> dict[str, Any]:
    """The model family and template variables a run renders with (for a leftover's info)."""
    chat = _chat(config, tokenizer)
    return {"family": chat.family.name, "chat_template_kwargs": chat.template_kwargs}


def _chat(config: RolloutConfig, tokenizer: Any) -> ChatFormat:
    from toolrollout.chat import ChatFormat

    return ChatFormat(tokenizer, family=config.family, template_kwargs=config.chat_template_kwargs)


def run_sampling(config: RolloutConfig) -> dict[str, Any]:
    """A run's sampling settings as its files record them (:func:`sampling_record`, less the
    runner's ``seed_round``, which is per call)."""
    sampling = sampling_record(config)
    del sampling["seed_round"]
    return sampling


def engine_facts(info: EngineInfo) -> dict[str, Any]:
    """What an engine's ``info()`` says about how it samples, as the files record it."""
    keys = ("engine", "engine_version", "dtype", "model_path", "weight_version")
    return {key: getattr(info, key) for key in keys}


def run_metadata(
    config: RolloutConfig,
    tokenizer: Any,
    *,
    chat: Mapping[str, Any] | None = None,
    engine: EngineInfo | None = None,
) -> dict[str, Any]:
    """The object a run's output file carries under ``RUN_METADATA_KEY`` (``chat``:
    :func:`chat_setup`'s answer; ``engine``: once it is known)."""
    metadata: dict[str, Any] = {
        "toolrollout": __version__,
        "sampling": run_sampling(config),
        "tokenizer": {
            "name_or_path": str(getattr(tokenizer, "name_or_path", "") or "") or None,
            "fingerprint": tokenizer_fingerprint(tokenizer),
            **dict(chat or {}),
        },
    }
    if engine is not None:
        metadata["engine"] = engine_facts(engine)
    return metadata


def leftover_info(
    *,
    n: int,
    tool_names: Sequence[str],
    tool_parser: str,
    tokenizer: Any,
    model: str | Path,
    chat: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The metadata a leftover file carries so that a later run can check it can resume it
    (``chat``: :func:`chat_setup`'s answer; ``sampling``: :func:`run_sampling`'s)."""
    info: dict[str, Any] = {
        "n": n,
        "tools": sorted(tool_names),
        "tool_parser": tool_parser,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "model": str(model),
    }
    if chat is not None:
        info["chat"] = dict(chat)
    if sampling is not None:
        info["sampling"] = dict(sampling)
    return info


def check_leftover_matches(
    path: str | Path,
    saved: Mapping[str, Any],
    *,
    tool_names: Sequence[str],
    tool_parser: str,
    tokenizer: Any = None,
    model: str | Path | None = None,
    chat: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> None:
    """A one-line :class:`~toolrollout.spec.FieldError` naming the :class:`RunSpec` fields
    to change when ``saved`` (a leftover's info) does not suit this run. The tokenizer is
    checked when given; chat setup and sampling when both sides recorded them."""
    names = sorted(tool_names)
    if saved.get("tools") != names:
        raise FieldError(
            f"{path} was rolled out with tools {saved.get('tools')} but this run has "
            f"{names}: pass the same {{tool_config}}",
            "tool_config",
        )
    if saved.get("tool_parser") != tool_parser:
        raise FieldError(
            f"{path} was rolled out with {{config.tool_parser}} {saved.get('tool_parser')!r}, "
            f"not {tool_parser!r}",
            "config.tool_parser",
        )
    if tokenizer is not None and saved.get("tokenizer") != tokenizer_fingerprint(tokenizer):
        raise UserError(
            f"{path} was rolled out with another tokenizer than {model} "
            f"(model {saved.get('model')!r}): its token ids would mean something else"
        )
    recorded = saved.get("chat")
    if chat is not None and recorded is not None and dict(recorded) != dict(chat):
        raise FieldError(
            f"{path} was rolled out with family {recorded.get('family')!r} and chat-template "
            f"kwargs {recorded.get('chat_template_kwargs')}, not {chat.get('family')!r} and "
            f"{chat.get('chat_template_kwargs')}: pass the same {{config.family}} / "
            "{config.chat_template_kwargs}",
            "config.family",
            "config.chat_template_kwargs",
        )
    before = saved.get("sampling")
    if sampling is not None and before is not None and _changed(before, sampling):
        fields = [f"config.sampling.{key}" for key in _changed(before, sampling)]
        raise FieldError(
            f"{path} was sampled with {sampling_changes(before, sampling)}: a continued "
            "trajectory's turns must come from one distribution; pass the same "
            + ", ".join(f"{{{f}}}" for f in fields),
            *fields,
        )


DISTRIBUTION_KEYS = ("temperature", "top_p", "top_k", "min_p")
"""The sampling settings that define the distribution a token is drawn from. The seed and
the token budgets do not (each row records them in its ``sampling``)."""


def sampling_changes(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """The distribution's settings that differ, as ``"temperature 1.0 (now 0.7), ..."``;
    empty if none."""
    return ", ".join(
        f"{key} {recorded.get(key)!r} (now {now.get(key)!r})" for key in _changed(recorded, now)
    )


def _changed(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    return [key for key in DISTRIBUTION_KEYS if recorded.get(key) != now.get(key)]
