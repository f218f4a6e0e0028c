"""Fine-tune the tiny VL demo to look at video windows with ``crop_video``, deterministically.

Run ``python -m toolrollout.apps.demo_vl.train --out src/toolrollout/apps/demo_vl/model`` (a few
CPU minutes on two threads). It builds the starting point (:mod:`~toolrollout.apps.demo_vl.build`),
makes dialogs about synthetic clips with the real ``crop_video`` results
(:mod:`~toolrollout.apps.demo_vl.dialogs`), mixes in the text demo's calculator dialogs, and
trains every weight, loss on assistant tokens only; docs/multimodal.md, "Retraining the VL
demo", has the details. A rerun on the same machine writes the same weights byte for byte.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from toolrollout.apps.demo.dialogs import training_dialogs
from toolrollout.apps.demo.train import cosine_lr, log_line, optimizer_step, padded_batch
from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH, DEMO_VL_TEXT_BASE_PATH
from toolrollout.apps.demo_vl.build import build
from toolrollout.apps.demo_vl.dialogs import (
    HELDOUT_SEED_BASE,
    clip_name,
    crop_turn,
    png,
    question,
    tool_result,
    video_dialogs,
    video_tool_schemas,
    windows,
)
from toolrollout.apps.demo_vl.video import COLOURS, make_video, plan_segments
from toolrollout.tools.calculator import CALCULATOR_TOOL

__all__ = ["Quality", "VideoExample", "evaluate", "main"]


@dataclass(frozen=True, slots=True)
class VideoExample:
    """One training dialog: expanded ids, loss mask, and the images' PNG bytes."""

    ids: tuple[int, ...]
    mask: tuple[bool, ...]
    pngs: tuple[bytes, ...]


def _encode(
    tokenizer: Any, fmt: Any, messages: list[dict[str, Any]], tools: list[Any], pngs: list[bytes]
) -> VideoExample:
    from toolrollout.apps.demo.tokenizer import assistant_header, encode_dialog

    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    prepared = [fmt.prepare(data) for data in pngs]
    expanded, _ = fmt.expand(ids, [p.num_tokens for p in prepared])
    mask = encode_dialog(tokenizer, expanded, assistant_header(tokenizer))
    return VideoExample(tuple(expanded), tuple(mask), tuple(p.png for p in prepared))


def _padded(
    batch: Sequence[VideoExample], skip: int, pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels of ``example.ids[skip:]``."""
    return padded_batch([e.ids[skip:] for e in batch], [e.mask[skip:] for e in batch], pad)


def _masked_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    targets = labels[:, 1:]
    selected = targets != -100
    return torch.nn.functional.cross_entropy(logits[:, :-1][selected], targets[selected])


def _text_loss(model: Any, batch: Sequence[VideoExample], pad: int) -> torch.Tensor:
    ids, attention, labels = _padded(batch, 0, pad)
    logits = model(input_ids=ids, attention_mask=attention).logits
    return _masked_loss(logits, labels)


def _video_loss(
    model: Any, processor: Any, batch: Sequence[VideoExample], prefix: int, pad: int
) -> torch.Tensor:
    """Loss of dialogs sharing their first ``prefix`` ids (the system turn with the tools).

    The shared prefix is run once and its KV cache repeated over the rows (gradients flow
    through it), which makes a step several times cheaper than running each row whole.
    """
    from toolrollout.chat._multimodal import load_image

    image_token = model.config.image_token_id
    full, full_attention, _ = _padded(batch, 0, pad)
    ids, _, labels = _padded(batch, prefix, pad)
    pixels = processor(images=[load_image(p) for e in batch for p in e.pngs])
    grid = torch.as_tensor(pixels["image_grid_thw"], dtype=torch.long)
    positions, _ = model.model.get_rope_index(
        full,
        mm_token_type_ids=(full == image_token).to(torch.int),
        image_grid_thw=grid,
        attention_mask=full_attention,
    )
    head = torch.tensor([batch[0].ids[:prefix]])
    cache = model.model(input_ids=head, use_cache=True).cache
    cache.batch_repeat_interleave(len(batch))
    # Right padding under a causal mask: real tokens never attend to the pads after them.
    logits = model(
        input_ids=ids,
        position_ids=positions[..., prefix:],
        cache=cache,
        use_cache=False,
        pixel_values=torch.as_tensor(pixels["pixel_values"], dtype=torch.float32),
        image_grid_thw=grid,
        mm_token_type_ids=(ids == image_token).to(torch.int),
    ).logits
    return _masked_loss(logits, labels)


def train(args: argparse.Namespace, workdir: Path) -> Any:
    """Build the starting folder in ``workdir``, fine-tune it, return the model."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

    from toolrollout.chat import VisionFormat

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    start = build(workdir / "start", args.text_base)
    tokenizer = AutoTokenizer.from_pretrained(str(start))
    fmt = VisionFormat.from_pretrained(start)
    auto: Any = AutoImageProcessor  # the embedded engine's processor (Pillow backend)
    processor = auto.from_pretrained(str(start), backend="pil")
    tools = video_tool_schemas()
    video = [
        _encode(tokenizer, fmt, messages, tools, pngs)
        for messages, pngs in video_dialogs(args.clips, seed=args.seed, workdir=workdir / "clips")
    ]
    calc = [
        _encode(tokenizer, fmt, cast(Any, messages), [CALCULATOR_TOOL], [])
        for messages in training_dialogs(args.calc_dialogs, seed=args.seed)
    ]
    lengths = [len(e.ids) for e in video]
    log_line(
        f"data: {len(video)} video dialogs (mean {sum(lengths) / len(lengths):.0f} tokens, "
        f"max {max(lengths)}), {len(calc)} calculator dialogs, {time.perf_counter() - t0:.0f}s"
    )
    im_start = int(cast(int, tokenizer.convert_tokens_to_ids("<|im_start|>")))
    prefix = video[0].ids.index(im_start, 1)
    if any(e.ids[:prefix] != video[0].ids[:prefix] for e in video):
        raise RuntimeError("video dialogs must share their system turn")
    model: Any = Qwen2VLForConditionalGeneration.from_pretrained(str(start), dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng = random.Random(args.seed)
    pad = int(tokenizer.pad_token_id)
    running = 0.0
    for step in range(args.steps):
        calc_step = args.calc_every > 0 and step % args.calc_every == args.calc_every - 1
        pool = calc if calc_step else video
        batch = [pool[rng.randrange(len(pool))] for _ in range(args.batch_size)]
        if calc_step:
            loss = _text_loss(model, batch, pad)
        else:
            loss = _video_loss(model, processor, batch, prefix, pad)
        lr = cosine_lr(step, args.steps, args.lr, args.warmup, floor=0.1)
        optimizer_step(model, optimizer, loss, lr)
        running = loss.item() if step == 0 else 0.9 * running + 0.1 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            kind = "calc" if calc_step else "video"
            log_line(
                f"step {step:4d}/{args.steps} {kind} loss {loss.item():.4f} (ema {running:.4f}) "
                f"{time.perf_counter() - t0:.0f}s"
            )
    model.eval()
    return model


def save(model: Any, start: Path, out: Path) -> None:
    """Write the build script's folder with the trained weights (every other file as built)."""
    import shutil

    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        shutil.copytree(start, out)
        shutil.copyfile(Path(tmp) / "model.safetensors", out / "model.safetensors")
    for path in out.iterdir():
        path.chmod(0o644)


_CALL = re.compile(r"<tool_call>\s*(\{.*\})\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Quality:
    """Held-out results: how many calls were exactly right, how many answers named the colour."""

    cases: int
    calls_right: int
    answers_right: int


def _sample(
    model: Any, ids: list[int], images: dict[str, Any], stop: int, limit: int, gen: Any
) -> list[int]:
    """Sample at temperature 1.0 (full forward per token: short replies, tiny model)."""
    out: list[int] = []
    image_token = model.config.image_token_id
    with torch.no_grad():
        for _ in range(limit):
            full = torch.tensor([ids + out])
            extra = dict(images)
            if images:
                extra["mm_token_type_ids"] = (full == image_token).to(torch.int)
            logits = model(input_ids=full, **extra).logits[0, -1]
            token = int(torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen))
            out.append(token)
            if token == stop:
                break
    return out


def _parsed_call(reply: str) -> Any:
    """The JSON inside a reply's ``<tool_call>`` tags; ``{}`` when there is none or it is bad."""
    found = _CALL.search(reply)
    try:
        return json.loads(found.group(1)) if found else {}
    except json.JSONDecodeError:
        return {}


def evaluate(model_dir: Path, workdir: Path, *, cases: int = 24, seed: int = 0) -> Quality:
    """Ask about held-out clips at T=1.0, run the real ``crop_video``, check call and answer.

    The clips use seeds from :data:`HELDOUT_SEED_BASE` on, never seen in training.
    """
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

    from toolrollout.chat import VisionFormat
    from toolrollout.chat._multimodal import load_image

    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
    auto: Any = AutoImageProcessor
    processor = auto.from_pretrained(str(model_dir), backend="pil")
    fmt = VisionFormat.from_pretrained(model_dir)
    model: Any = Qwen2VLForConditionalGeneration.from_pretrained(
        str(model_dir), dtype=torch.float32
    )
    model.eval()
    tools = video_tool_schemas()
    stop = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    calls_right = answers_right = 0
    for case in range(cases):
        segments = plan_segments(HELDOUT_SEED_BASE + seed * 1000 + case)
        name = clip_name(rng)
        folder = workdir / str(case)
        make_video(folder / name, segments)
        a, b, colour = rng.choice(windows(segments))
        messages: list[dict[str, Any]] = [{"role": "user", "content": question(rng, name, a, b)}]
        prompt = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        reply = tokenizer.decode(_sample(model, ids, {}, stop, 80, gen), skip_special_tokens=True)
        call = _parsed_call(reply)
        args = call.get("arguments", {}) if isinstance(call, dict) else {}
        if call.get("name") != "crop_video" or not isinstance(args, dict):
            continue
        if args == {"video_path": name, "start_time": a, "end_time": b}:
            calls_right += 1
        try:
            path = (folder / str(args["video_path"])).resolve()
            text, frames = tool_result(path, args["start_time"], args["end_time"])
        except Exception:  # a wrong call (bad path, bad window) scores nothing
            continue
        pngs = [fmt.prepare(png(frame)) for frame in frames]
        messages += crop_turn(call, text, len(pngs))
        prompt = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        ids, _ = fmt.expand(
            tokenizer.encode(prompt, add_special_tokens=False), [p.num_tokens for p in pngs]
        )
        pixels = processor(images=[load_image(p.png) for p in pngs])
        images = {
            "pixel_values": torch.as_tensor(pixels["pixel_values"], dtype=torch.float32),
            "image_grid_thw": torch.as_tensor(pixels["image_grid_thw"], dtype=torch.long),
        }
        answer = tokenizer.decode(
            _sample(model, ids, images, stop, 24, gen), skip_special_tokens=True
        )
        named = [c for c in COLOURS if c in answer]
        if named == [colour]:
            answers_right += 1
    return Quality(cases, calls_right, answers_right)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEMO_VL_MODEL_PATH)
    parser.add_argument(
        "--text-base",
        type=Path,
        default=DEMO_VL_TEXT_BASE_PATH,
        help="the text model to start from (see toolrollout.apps.demo_vl.build)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clips", type=int, default=192)
    parser.add_argument("--calc-dialogs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--calc-every", type=int, default=5)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument(
        "--evaluate", type=int, default=0, metavar="N", help="then sample N held-out cases"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m toolrollout.apps.demo_vl.train``."""
    args = parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model = train(args, Path(tmp))
        save(model, Path(tmp) / "start", args.out)
    log_line(f"saved {args.out}; total {time.perf_counter() - t0:.0f}s")
    if args.evaluate:
        with tempfile.TemporaryDirectory() as tmp:
            quality = evaluate(args.out, Path(tmp), cases=args.evaluate)
        log_line(
            f"held-out at T=1.0: {quality.calls_right}/{quality.cases} exact crop_video calls, "
            f"{quality.answers_right}/{quality.cases} right colours"
        )


if __name__ == "__main__":
    main()
