"""The shard folder of a ``generate`` run (``<out>.parts/``): its manifest, the checks
that a ``--resume`` continues the same run, and the clean-up a killed finish left."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from toolrollout.rollout._output import MANIFEST

if TYPE_CHECKING:
    from toolrollout.engines import EngineInfo

__all__ = ["finish_earlier_run", "open_run_folder", "record_engine"]


def finish_earlier_run(out: Path, *, resume: bool) -> bool:
    """Complete the clean-up of a run killed while finishing; True when nothing is left.

    The folder of a run whose merged file is written carries the ``finished`` mark (or,
    at the very end, no manifest and no shard): its rows are all in ``--out``, so it is
    only deleted. ``--resume`` then has nothing to do (exit 0); a fresh run goes on.
    """
    from toolrollout._exceptions import UserError
    from toolrollout.rollout import clean_finished, finished_mark

    parts = out.with_name(out.name + ".parts")
    if not parts.is_dir():
        if resume and out.is_file():
            typer.echo(f"nothing to resume: {out} is complete (no {parts} left)")
            return True
        return False
    mark = finished_mark(parts)
    if mark is None:
        bare = not (parts / MANIFEST).exists() and not any(parts.glob("**/part-*.parquet"))
        if not (bare and out.is_file()):
            return False  # an unfinished run (or an empty folder of a run never started)
    elif not Path(str(mark.get("out"))).is_file():
        raise UserError(
            f"{parts} says its run finished into {mark.get('out')}, but that file is "
            f"missing: delete {parts} and run again"
        )
    clean_finished(parts)
    rows = f" ({mark['rows']} rows)" if mark is not None else ""
    if resume:
        typer.echo(
            f"nothing to resume: the run had finished into {out}{rows}; "
            f"removed what its interrupted clean-up left in {parts}"
        )
        return True
    typer.echo(
        f"note: removed {parts}, left by a finished run of {out}{rows} whose "
        "clean-up was cut short",
        err=True,
    )
    return False


def record_engine(
    metadata: dict[str, Any], folder: Path, info: EngineInfo, *, resumed: bool
) -> None:
    """Add the engine's facts to the run metadata; on a resume, warn when the rows kept were
    sampled by another engine, version or dtype than the rows to come (their sampling
    settings and tokenizer were checked against the run manifest already)."""
    from toolrollout.rollout import read_run_metadata
    from toolrollout.rollout._compat import engine_facts

    metadata["engine"] = facts = engine_facts(info)
    if not resumed:
        return
    shards = sorted(folder.glob("part-*.parquet"))
    before = (read_run_metadata(shards[-1]) or {}).get("engine") if shards else None
    if not isinstance(before, dict):
        return
    keys = ("engine", "engine_version", "dtype", "model_path")
    changed = [k for k in keys if before.get(k) != facts[k]]
    if changed:
        detail = ", ".join(f"{k} {before.get(k)!r} (now {facts[k]!r})" for k in changed)
        typer.echo(
            f"warning: --resume: the rows kept were sampled with {detail}; the file's "
            "metadata records the engine of the rows written last",
            err=True,
        )


def open_run_folder(
    parts: Path,
    *,
    dataset: Path,
    num_prompts: int,
    n: int,
    resume: bool,
    sampling: dict[str, Any],
    tokenizer: dict[str, Any],
) -> str:
    """Start or reopen the shard folder; returns the run id that makes group ids stable.

    A resume must sample from the interrupted run's distribution (temperature, top-p,
    top-k, min-p) and render with the same tokenizer; manifests written before these were
    recorded are not checked for them.
    """
    from toolrollout._exceptions import UserError
    from toolrollout.rollout._compat import sampling_changes

    identity = {
        "dataset": str(dataset.resolve()),
        "num_prompts": num_prompts,
        "n": n,
    }
    rendering = {
        "fingerprint": tokenizer.get("fingerprint"),
        "family": tokenizer.get("family"),
        "chat_template_kwargs": tokenizer.get("chat_template_kwargs"),
    }
    manifest = parts / MANIFEST
    if resume:
        if not manifest.is_file():
            raise UserError(f"nothing to resume: {manifest} not found")
        try:
            saved = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{manifest}: unreadable run manifest ({exc})") from exc
        for key, value in identity.items():
            if saved.get(key) != value:
                raise UserError(
                    f"--resume: {key} is {value!r} but the interrupted run used "
                    f"{saved.get(key)!r} ({manifest})"
                )
        if "sampling" in saved and sampling_changes(saved["sampling"], sampling):
            raise UserError(
                f"--resume: the interrupted run sampled with "
                f"{sampling_changes(saved['sampling'], sampling)}: pass its sampling flags "
                f"({manifest})"
            )
        if "tokenizer" in saved and saved["tokenizer"] != rendering:
            raise UserError(
                f"--resume: the interrupted run rendered with another tokenizer, family or "
                f"chat-template kwargs ({saved['tokenizer']}; now {rendering}) ({manifest})"
            )
        return str(saved["run_id"])
    # */part-*: the worker folders of a `--ray` run (docs/scale-out.md)
    if any(parts.glob("part-*.parquet")) or any(parts.glob("*/part-*.parquet")):
        raise UserError(
            f"{parts} holds an unfinished run: pass --resume to complete it, or delete it"
        )
    parts.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    saved = {"run_id": run_id, **identity, "sampling": sampling, "tokenizer": rendering}
    manifest.write_text(json.dumps(saved) + "\n", encoding="utf-8")
    return run_id
