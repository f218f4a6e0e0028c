"""Train the bundled demo model, deterministically, on a CPU.

``python -m toolrollout.apps.demo.train`` is the first stage of the shipped recipe; the later
stages continue from its folder with ``--init-from`` (``scripts/train_demo.sh`` runs all
three; docs/quickstart.md, "Retraining"). A stage renders synthetic dialogs of the
``--tasks`` families, each with its tool config's tool list
(:mod:`~toolrollout.apps.demo.dialogs`), trains the tokenizer on them
(:mod:`~toolrollout.apps.demo.tokenizer`; a continued stage keeps the previous one's), then
a small Qwen2 with AdamW, loss on assistant tokens only: first ``--copy-steps`` steps of
"repeat after me" dialogs, a dense copying signal that makes the copy circuit appear early,
then the tool dialogs. It saves a Hugging Face folder (safetensors, float32) and the
held-out prompt sets.

Seeds and data order are fixed and the result does not depend on the thread count, so a
rerun on the same machine reproduces the same weights byte for byte.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from toolrollout.apps.demo import DEMO_MODEL_PATH, DEMO_PROMPT_SETS
from toolrollout.apps.demo.dialogs import FAMILIES, copy_dialogs, training_dialogs, write_prompts
from toolrollout.apps.demo.tokenizer import (
    IM_END,
    IM_START,
    PAD_TOKEN,
    assistant_header,
    build_tokenizer,
    chat_template,
    check_prefix_consistency,
    encode_dialog,
    load_tokenizer,
    render_dialogs,
    render_plain,
    token_id,
)

__all__ = ["main", "padded_batch", "train"]

_OUTPUT_FILES: Final = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "special_tokens_map.json",
    }
)


def log_line(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _model_config(tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=token_id(tokenizer, IM_END),
        pad_token_id=token_id(tokenizer, PAD_TOKEN),
    )


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.05) -> float:
    """Linear warm-up to ``peak``, then a cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer_step(model: Any, optimizer: torch.optim.Optimizer, loss: Any, lr: float) -> None:
    """Back-propagate ``loss`` and take one step at ``lr``, gradients clipped to norm 1."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _batches(
    encoded: Sequence[list[int]], prefix_lens: Sequence[int], batch_size: int, seed: int
) -> list[list[int]]:
    """Deterministic batches of dialogs that share the same system prefix.

    Within a prefix group, windows of 16 batches are sorted by length before being cut,
    so that a batch holds dialogs of similar length and little compute goes to padding.
    """
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(encoded), generator=generator).tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in order:
        groups.setdefault(tuple(encoded[i][: prefix_lens[i]]), []).append(i)
    batches = []
    window = 16 * batch_size
    for members in groups.values():
        for w in range(0, len(members), window):
            chunk = sorted(members[w : w + window], key=lambda i: (len(encoded[i]), i))
            batches += [
                chunk[j : j + batch_size] for j in range(0, len(chunk) - batch_size + 1, batch_size)
            ]
    shuffle = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffle]


def _load_stage(folder: Path) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """A previous stage's model and tokenizer, to continue training from."""
    tokenizer = load_tokenizer(folder)
    return Qwen2ForCausalLM.from_pretrained(str(folder), dtype=torch.float32), tokenizer


def train(args: argparse.Namespace) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Build the tokenizer and model (or continue ``--init-from``) and train them.

    See the module docstring.
    """
    start = None if args.init_from is None else _load_stage(args.init_from)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()

    dialogs = training_dialogs(args.dialogs, seed=args.seed, families=args.tasks)
    texts = render_dialogs(dialogs)
    # A second stage keeps the first stage's tokenizer (the weights index into it).
    tokenizer = build_tokenizer(texts[: args.tokenizer_dialogs]) if start is None else start[1]
    check_prefix_consistency(tokenizer, dialogs[:48])
    encoded: list[list[int]] = tokenizer(texts, add_special_tokens=False)["input_ids"]
    header = assistant_header(tokenizer)
    masks = [encode_dialog(tokenizer, ids, header) for ids in encoded]
    # The system turn (with the tool list) is the same for many dialogs: it is computed once
    # per batch and its KV cache shared by the rows, which makes a step ~3x cheaper.
    im_start = token_id(tokenizer, IM_START)
    prefix_lens = [ids.index(im_start, 1) if ids[0] == im_start else 0 for ids in encoded]
    lengths = [len(ids) for ids in encoded]
    log_line(
        f"data: {len(dialogs)} dialogs, tokens/dialog mean {sum(lengths) / len(lengths):.0f} "
        f"max {max(lengths)}, vocab {len(tokenizer)}, prep {time.perf_counter() - t0:.1f}s"
    )

    n_copy = args.copy_steps * args.copy_batch_size
    copy_encoded = _copy_encoded(tokenizer, n_copy, args.seed)
    copy_batches = [
        list(range(len(encoded) + j, len(encoded) + j + args.copy_batch_size))
        for j in range(0, n_copy, args.copy_batch_size)
    ]
    encoded += copy_encoded
    masks += [encode_dialog(tokenizer, ids, header) for ids in copy_encoded]
    prefix_lens += [0] * len(copy_encoded)

    model = Qwen2ForCausalLM(_model_config(tokenizer, args)) if start is None else start[0]
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log_line(
        f"model: {n_params / 1e6:.2f}M params, {model.config.num_hidden_layers} layers, "
        f"hidden {model.config.hidden_size}"
        + ("" if start is None else ", continuing the previous stage")
    )

    optimizer = _optimizer(model, args.lr)
    main = encoded[: len(encoded) - len(copy_encoded)]
    batches = copy_batches + _epochs(main, prefix_lens, args.steps, args.batch_size, args.seed)
    total = len(batches)
    pad_id = token_id(tokenizer, PAD_TOKEN)
    running = 0.0
    for step, idx in enumerate(batches):
        p = prefix_lens[idx[0]]
        input_ids, _, labels = padded_batch(
            [encoded[i][p:] for i in idx], [masks[i][p:] for i in idx], pad_id
        )
        loss = _loss(model, encoded[idx[0]][:p], input_ids, labels)
        optimizer_step(model, optimizer, loss, cosine_lr(step, total, args.lr, args.warmup))
        running = loss.item() if step == 0 else 0.9 * running + 0.1 * loss.item()
        if step % args.log_every == 0 or step == total - 1:
            log_line(
                f"step {step:4d}/{total} loss {loss.item():.4f} (ema {running:.4f}) "
                f"lr {optimizer.param_groups[0]['lr']:.2e} {time.perf_counter() - t0:.0f}s"
            )
    log_line(f"final loss {loss.item():.4f} (ema {running:.4f}), {time.perf_counter() - t0:.0f}s")
    model.eval()  # type: ignore[no-untyped-call]
    return model, tokenizer


def _epochs(
    encoded: Sequence[list[int]], prefix_lens: Sequence[int], steps: int, size: int, seed: int
) -> list[list[int]]:
    """``steps`` batches, epoch after epoch (each epoch shuffled with its own seed)."""
    batches: list[list[int]] = []
    epoch = 0
    while len(batches) < steps:
        batches += _batches(encoded, prefix_lens, size, seed + epoch)
        epoch += 1
    return batches[:steps]


def _copy_encoded(tokenizer: PreTrainedTokenizerFast, n: int, seed: int) -> list[list[int]]:
    """The warm-up phase's short copy dialogs without tools (see dialogs.copy_dialogs)."""
    texts = render_plain(copy_dialogs(n, seed=seed), tools=[])
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def _optimizer(model: Qwen2ForCausalLM, lr: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )


def padded_batch(
    rows: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 where the mask excludes a
    token)."""
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for row, (tokens, mask) in enumerate(zip(rows, masks, strict=True)):
        ids = torch.tensor(tokens, dtype=torch.long)
        input_ids[row, : len(ids)] = ids
        attention[row, : len(ids)] = 1
        keep = torch.tensor(mask, dtype=torch.bool)
        labels[row, : len(ids)] = torch.where(keep, ids, torch.full_like(ids, -100))
    return input_ids, attention, labels


def _loss(
    model: Qwen2ForCausalLM, prefix_ids: list[int], input_ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The batch's next-token loss; its shared ``prefix_ids`` are run once, their KV cache
    repeated for every row."""
    rows, width = input_ids.shape
    p = len(prefix_ids)
    cache = None
    if p:
        prefix = torch.tensor([prefix_ids], dtype=torch.long)
        cache = model.model(input_ids=prefix, use_cache=True).cache
        cache.batch_repeat_interleave(rows)
    positions = torch.arange(p, p + width).unsqueeze(0).expand(rows, width)
    # Right padding under a causal mask: real tokens never attend to the pads after them.
    hidden = model.model(
        input_ids=input_ids, cache=cache, position_ids=positions, use_cache=False
    ).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    selected = targets != -100
    logits = model.lm_head(hidden[selected])
    return torch.nn.functional.cross_entropy(logits, targets[selected])


def training_texts(args: argparse.Namespace) -> list[str]:
    """The rendered training dialogs of a run (what the tokenizer is trained on, in order)."""
    return render_dialogs(training_dialogs(args.dialogs, seed=args.seed, families=args.tasks))


def save(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Write the Hugging Face folder: weights, configs, tokenizer with its chat template."""
    out.mkdir(parents=True, exist_ok=True)
    unknown = sorted(p.name for p in out.iterdir() if p.name not in _OUTPUT_FILES)
    if unknown:
        raise SystemExit(f"refusing to write into {out}: it holds unrelated files {unknown}")
    for p in out.iterdir():
        p.unlink()
    model.save_pretrained(out)
    GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=None,
        eos_token_id=token_id(tokenizer, IM_END),
        pad_token_id=token_id(tokenizer, PAD_TOKEN),
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text(encoding="utf-8"))
    # transformers 5 writes the template to chat_template.jinja only; older loaders and
    # non-Python tokenizers (e.g. the Rust router) read tokenizer_config.json: keep a copy.
    tok_config["chat_template"] = chat_template()
    # transformers 5 saves "TokenizersBackend", a class transformers 4 does not know.
    # Qwen2Tokenizer loads everywhere, and build_tokenizer() matches its pipeline.
    tok_config["tokenizer_class"] = "Qwen2Tokenizer"
    tok_config["unk_token"] = None
    tok_config["bos_token"] = None
    tok_config["add_prefix_space"] = False
    # transformers 4 only treats <|im_start|> as special (skip_special_tokens) if listed here.
    tok_config["additional_special_tokens"] = [IM_START, IM_END]
    config_path.write_text(
        json.dumps(tok_config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    )
    # Likewise, engines built on transformers 4.x read a top-level rope_theta.
    model_config_path = out / "config.json"
    model_config = json.loads(model_config_path.read_text(encoding="utf-8"))
    model_config["rope_theta"] = model_config["rope_parameters"]["rope_theta"]
    model_config_path.write_text(json.dumps(model_config, indent=2, sort_keys=True) + "\n")
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors are written 0600; the package data must be readable


def _task_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(FAMILIES)} (got {text!r})")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEMO_MODEL_PATH)
    parser.add_argument(
        "--prompts-dir",
        type=Path,
        default=None,
        help="Where the held-out prompt files go (default: next to the package's own).",
    )
    parser.add_argument(
        "--tasks",
        type=_task_list,
        default=FAMILIES,
        help="Comma-separated task families to train on: calculator, python, search "
        "(default: all three, as the shipped model).",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dialogs", type=int, default=12000)
    parser.add_argument("--copy-steps", type=int, default=200)
    parser.add_argument("--copy-batch-size", type=int, default=64)
    parser.add_argument("--tokenizer-dialogs", type=int, default=2000)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="Continue from this model folder (its weights and tokenizer; the size options "
        "are then ignored) instead of starting from scratch: the later stages of the "
        "shipped recipe (scripts/train_demo.sh).",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m toolrollout.apps.demo.train``."""
    args = parse_args(argv)
    start = time.perf_counter()
    model, tokenizer = train(args)
    save(model, tokenizer, args.out)
    paths = {
        family: path if args.prompts_dir is None else args.prompts_dir / path.name
        for family, path in DEMO_PROMPT_SETS.items()
    }
    write_prompts(paths)
    where = args.prompts_dir or DEMO_PROMPT_SETS["calculator"].parent
    log_line(f"saved {args.out} and prompts in {where}; total {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
