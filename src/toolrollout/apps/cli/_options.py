"""Command options as data: each flag declared once, with the ``RunSpec`` field it sets.

:data:`RUN` holds the run options (engine, model, tools, sampling, budgets, the client's
retries); ``generate``, ``eval``, ``bench`` and ``gateway`` take theirs from it, with a default
or help of their own where a command differs (:meth:`Opt.but`), and add their own.
:func:`command` makes a typer command of an option list, :func:`spec_from` the
:class:`~toolrollout.spec.RunSpec` of the parsed values, and :func:`user_message` shows a
library error that names a spec field (:class:`~toolrollout.spec._spec.FieldError`) with the
flag that sets it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from toolrollout._exceptions import FieldError
from toolrollout._security import ADMIN_API_KEY_ENV, API_KEY_ENV, ENGINE_API_KEY_ENV
from toolrollout.apps.cli._common import parse_template_kwargs

if TYPE_CHECKING:
    from toolrollout.spec import RunSpec

__all__ = ["RUN", "SERVER", "Opt", "command", "opt", "pick", "spec_from", "user_message"]


@dataclass(frozen=True)
class Opt:
    """One command-line option."""

    name: str
    """The parameter name; the flag is ``--name`` with dashes unless ``decls`` say."""
    type: Any
    default: Any
    help: str | None = None
    field: str | None = None
    """The ``RunSpec`` field it sets, dotted into nested ones (``config.sampling.top_p``);
    None: the command's own option."""
    convert: Callable[[Any], Any] | None = None
    """From the parsed value to the field's."""
    decls: tuple[str, ...] = ()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """typer.Option's other arguments (min, max, envvar...)."""

    @property
    def flag(self) -> str:
        return self.decls[0].split("/")[0] if self.decls else "--" + self.name.replace("_", "-")

    def but(self, **changes: Any) -> Opt:
        """This option with another default, help..."""
        return dataclasses.replace(self, **changes)

    def parameter(self) -> inspect.Parameter:
        option = typer.Option(*self.decls, help=self.help, **self.extra)
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=self.default,
            annotation=Annotated[self.type, option],
        )


def opt(
    name: str,
    type_: Any,
    default: Any,
    help: str | None = None,
    *decls: str,
    field: str | None = None,
    convert: Callable[[Any], Any] | None = None,
    **extra: Any,
) -> Opt:
    """An :class:`Opt`, written on one line where it fits."""
    return Opt(name, type_, default, help, field, convert, decls, extra)


def command(
    app: typer.Typer, name: str, options: Iterable[Opt], body: Callable[[Any], None]
) -> None:
    """Add command ``name`` taking ``options``; ``body`` gets the parsed values as attributes
    and its docstring is the command's help."""

    def run(**values: Any) -> None:
        body(SimpleNamespace(**values))

    run.__signature__ = inspect.Signature([o.parameter() for o in options])  # type: ignore[attr-defined]
    run.__doc__ = body.__doc__
    app.command(name)(run)


def pick(table: Mapping[str, Opt], *names: str) -> list[Opt]:
    """The options ``names`` of ``table``, in that order."""
    return [table[name] for name in names]


def spec_from(
    values: Any, options: Iterable[Opt], changes: Mapping[str, Any] | None = None
) -> RunSpec:
    """The RunSpec the parsed ``values`` describe; ``changes`` (by dotted field) win."""
    from toolrollout.engines import SamplingParams
    from toolrollout.rewards import RewardMix
    from toolrollout.rollout import RolloutConfig
    from toolrollout.spec import RunSpec

    fields: dict[str, Any] = {}
    for option in options:
        if option.field is not None:
            value = getattr(values, option.name)
            fields[option.field] = value if option.convert is None else option.convert(value)
    fields.update(changes or {})
    nested = {"config": RolloutConfig, "sampling": SamplingParams, "reward_mix": RewardMix}

    def build(prefix: str) -> dict[str, Any]:
        """The keyword arguments of the object at ``prefix`` (``""``: the RunSpec)."""
        names = {p[len(prefix) :].split(".")[0] for p in fields if p.startswith(prefix)}
        return {
            n: nested[n](**build(f"{prefix}{n}."))
            if f"{prefix}{n}" not in fields
            else fields[f"{prefix}{n}"]
            for n in names
        }

    return RunSpec(**build(""))


def user_message(exc: Exception, options: Iterable[Opt] = ()) -> str:
    """The one line for ``exc``: a spec field it names is shown as the flag that sets it."""
    if isinstance(exc, FieldError):
        return exc.render({o.field: o.flag for o in options if o.field is not None})
    return str(exc)


def _scheduling(names: str) -> Any:
    from toolrollout.engines import SchedulingConfig

    return SchedulingConfig.from_names(names)


_TOOL_PARSER = "Tool-call format of the model. Default: its model family's."
_ENGINE_HELP = (
    "What serves --engine-url: sglang (SGLang, sglang-router, toolrollout serve), vllm (a "
    "vLLM server with --enable-scale-out, docs/engines.md#vllm), or auto: ask the servers. "
    "Servers of different kinds in one run are refused."
)
_SCHEDULE_HELP = (
    "Client-side scheduling policies, comma-separated: priority (SGLang's per-request "
    "priority, sent only to servers started with --enable-priority-scheduling), history "
    "(priority from how long each prompt's trajectories ran before), admission (in-flight "
    "limit from the servers' /v1/loads), lag (in-flight limit from this client's own "
    "event-loop lag), oldest (turns waiting for the in-flight limit served by their group's "
    "start order, so groups complete one after another; with priority, the servers' queues "
    "too), affinity (a GRPO group on one server); 'none' (default) sends what a server gets "
    "without them (docs/scheduling.md)."
)

# fmt: off
RUN: dict[str, Opt] = {
    o.name: o
    for o in (
        opt("engine_url", list[str] | None, None, "SGLang or vLLM server (repeatable; see "
            "--engine). Default: the embedded engine.", "--engine-url", field="engine_urls",
            convert=lambda urls: tuple(urls or ())),
        opt("engine", str, "auto", _ENGINE_HELP, "--engine", field="engine"),
        opt("engine_api_key", str | None, None, "API key sent as 'Authorization: Bearer' to "
            "the --engine-url servers. Prefer the environment variable: a flag shows in the "
            "process list.", "--engine-api-key", field="engine_api_key",
            convert=lambda key: key or None, envvar=ENGINE_API_KEY_ENV, show_envvar=True,
            show_default=False),
        opt("model", Path | None, None, "Model folder (embedded engine) or tokenizer folder "
            "of the served model. Default: the bundled demo model.", field="model"),
        opt("dataset", Path | None, None, "Prompts (.jsonl or .parquet; verl RL layout "
            "accepted). Default: the demo prompts for the configured tools (python, search "
            "or calculator)."),
        opt("tool_config", Path | None, None, "verl-layout tool config YAML. Default: "
            "calculator.", field="tool_config"),
        opt("interaction_config", Path | None, None, "verl-layout interaction config YAML; "
            "rows pick one by extra_info.interaction_kwargs.name.", field="interaction_config"),
        opt("max_interaction_turns", int | None, None, "Interaction messages appended per "
            "trajectory at most.", field="config.max_interaction_turns", min=0),
        opt("turn_reward_weight", float, 0.0, "Weight of the summed interaction turn rewards "
            "in the reward.", field="config.reward_mix.turn_weight"),
        opt("tool_reward_weight", float, 0.0, "Weight of the summed tool rewards in the "
            "reward.", field="config.reward_mix.tool_weight"),
        opt("n", int | None, None, "Samples per prompt (GRPO group). Default 1; with "
            "--resume-leftover, the leftover's own.", "--n", field="config.n", min=1),
        opt("max_turns", int, 4, "Assistant turns per trajectory.", field="config.max_turns",
            min=1),
        opt("max_new_tokens", int, 128, "Tokens per model turn.",
            field="config.sampling.max_new_tokens", min=1),
        opt("max_response_tokens", int, 1024, "Budget over all response tokens.",
            field="config.max_response_tokens", min=1),
        opt("temperature", float, 1.0, field="config.sampling.temperature", min=0.0),
        opt("top_p", float, 1.0, field="config.sampling.top_p", min=0.0, max=1.0),
        opt("concurrency", int, 64, "In-flight engine requests.", field="config.concurrency",
            min=1),
        opt("seed", int | None, None, "Base sampling seed.", field="config.seed"),
        opt("limit", int | None, None, "Use the first N prompts.", min=1),
        opt("tool_parser", str | None, None, _TOOL_PARSER, field="config.tool_parser"),
        opt("family", str | None, None, "Model family (qwen3, llama3, mistral, glm45, "
            "gpt_oss, ...; `toolrollout.chat.template_families()`). Default: detected from "
            "the chat template.", field="config.family"),
        opt("chat_template_kwargs", str | None, None, "Extra chat-template variables as a "
            "JSON object, e.g. '{\"enable_thinking\": false}'.",
            field="config.chat_template_kwargs", convert=parse_template_kwargs),
        opt("tool_error_penalty", float, 0.0, "Reward penalty per failed or malformed tool "
            "call.", field="tool_error_penalty", min=0.0),
        opt("health_timeout", float, 120.0, "Seconds to wait for --engine-url servers to be "
            "healthy.", field="health_timeout"),
        opt("threads", int, 1, "Torch threads of the embedded engine (1 suits tiny models).",
            field="threads", min=1),
        opt("max_images", int | None, None, "Images per trajectory (vision models).",
            field="config.max_images", min=0),
        opt("max_image_tokens", int | None, None, "Image placeholder tokens per trajectory.",
            field="config.max_image_tokens", min=0),
        opt("resume", bool, False, "Complete an interrupted run: only samples without a row "
            "are run.", field="resume"),
        opt("flush_every", int, 64, "Rows per crash-safe shard (at most this many are lost).",
            field="flush_every", min=1),
        opt("request_timeout", float, 600.0, "Seconds to wait for one engine answer.",
            field="request_timeout", min=0.1),
        opt("retries", int, 30, "Attempts per engine request at most (5xx, resets, "
            "timeouts).", field="retries", min=1),
        opt("retry_budget", float, 60.0, "Seconds an engine request keeps being retried "
            "after its first failure (rides out a server or router restart).",
            field="retry_budget", min=0.0),
        opt("failover_after", int, 3, "With several --engine-url: failed attempts in a row "
            "after which a server's trajectories move to a healthy one (0: never move).",
            field="failover_after", min=0),
        opt("trajectory_timeout", float | None, None, "Seconds per trajectory before it is "
            "failed.", field="config.trajectory_timeout", min=0.1),
        opt("target_groups", int | None, None, "Straggler control: stop once this many "
            "complete groups are done; the rest is aborted on the server and saved to the "
            "leftover file, not the output.", field="target_groups", min=1),
        opt("keep_groups_whole", bool, True, "With --target-groups: a group counts only when "
            "all its samples finished (--no-keep-groups-whole: any target x n finished "
            "samples).", field="keep_groups_whole"),
        opt("finish_tools", bool, False, "With --target-groups: tool calls still running at "
            "the target finish first (their results kept for the resume) instead of being "
            "cancelled.", "--finish-tools", field="config.tools_at_target",
            convert=lambda finish: "finish" if finish else "cancel"),
        opt("inexact_logprobs", str, "refuse", "When the engine's logprobs are not the "
            "checkpoint's (e.g. SGLang serving a float32 model in float16): refuse the run, "
            'or label every row (metrics["logprob_mismatch"]): refuse or label.',
            field="config.inexact_logprobs"),
        opt("schedule", str, "none", _SCHEDULE_HELP, field="config.scheduling",
            convert=_scheduling),
    )
}
"""The run options, by parameter name, in the order ``generate --help`` lists them."""
# fmt: on

# fmt: off
SERVER: dict[str, Opt] = {
    o.name: o
    for o in (
        opt("host", str, "127.0.0.1", "Interface to bind."),
        opt("log_level", str, "info", "uvicorn log level."),
        opt("api_key", str | None, None, "Require 'Authorization: Bearer <key>' on every "
            "endpoint but health (SGLang's --api-key). Prefer the environment variable: a "
            "flag shows in the process list.", "--api-key", envvar=API_KEY_ENV,
            show_envvar=True, show_default=False),
        opt("admin_api_key", str | None, None, "Key for the control endpoints (serve: weight "
            "updates, pause/continue, flush, abort; gateway: scoring and closing sessions, "
            "and reading every session's), as SGLang's --admin-api-key; the --api-key then no "
            "longer opens them.", "--admin-api-key", envvar=ADMIN_API_KEY_ENV,
            show_envvar=True, show_default=False),
        opt("insecure", bool, False, "Serve a non-loopback --host without an API key (anyone "
            "who can reach it may use it). Without a key such a --host is refused.",
            "--insecure"),
        opt("max_body_mb", float, 64.0, "Largest request body (MiB); larger ones get 413.",
            "--max-body-mb", min=0.0),
        opt("max_requests", int, 4096, "Requests served at once; more get 429 with "
            "Retry-After (health not counted).", "--max-requests", min=1),
    )
}
"""The options every server command (serve, gateway, sandbox, retriever) shares."""
# fmt: on
