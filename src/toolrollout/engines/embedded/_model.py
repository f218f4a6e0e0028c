"""Loading a Hugging Face causal LM and talking to its forward pass and KV cache.

Transformers renamed the cache keyword (``past_key_values`` -> ``cache``) and the cache
internals (``key_cache`` lists -> ``layers``) across versions; everything version-specific
is kept in this module so the scheduler only sees plain per-layer tensors.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from toolrollout._exceptions import ConfigError

if TYPE_CHECKING:
    from ._vision import VisionInputs

__all__ = ["LayerKV", "LoadedModel", "ModelMeta", "load_meta", "load_model"]

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""Keys and values of one attention layer, each ``[batch, kv_heads, seq, head_dim]``."""


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """What is known about a model folder before its weights are loaded."""

    model_path: str
    model_type: str
    architectures: tuple[str, ...]
    context_length: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    has_vision: bool
    has_audio: bool
    config: Any
    tokenizer: Any


def _generation_eos_ids(path: str) -> set[int]:
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(path)
    except (OSError, ValueError):
        return set()
    eos = gen.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


def load_meta(
    model_path: str | os.PathLike[str],
    *,
    context_length: int | None = None,
    trust_remote_code: bool = False,
) -> ModelMeta:
    """Read the config, tokenizer and generation config of ``model_path`` (no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    path = str(Path(model_path).resolve())
    if not Path(path).is_dir():
        raise ConfigError(f"model path {path!r} is not a directory with a Hugging Face model")
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    max_positions = getattr(text_config, "max_position_embeddings", None)
    if context_length is None:
        if max_positions is None:
            raise ConfigError(
                f"{path}: config has no max_position_embeddings; pass context_length explicitly"
            )
        context_length = int(max_positions)
    if context_length < 2:
        raise ConfigError(f"context_length must be at least 2, got {context_length}")
    eos: set[int] = set()
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    eos |= _generation_eos_ids(path)
    return ModelMeta(
        model_path=path,
        model_type=str(getattr(config, "model_type", "")),
        architectures=tuple(getattr(config, "architectures", None) or ()),
        context_length=context_length,
        vocab_size=int(text_config.vocab_size),
        eos_token_ids=frozenset(eos),
        has_vision=getattr(config, "vision_config", None) is not None,
        has_audio=getattr(config, "audio_config", None) is not None,
        config=config,
        tokenizer=tokenizer,
    )


class LoadedModel:
    """A causal LM in eval mode plus the calls the scheduler needs.

    Only models whose attention caches are standard ``[batch, heads, seq, dim]`` key/value
    tensors are supported (every decoder-only transformer in transformers; not state-space
    or hybrid linear-attention models).
    """

    def __init__(self, model: Any, device: torch.device) -> None:
        self.model = model
        self.device = device
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        if "logits_to_keep" in params:
            self._keep_kw: str | None = "logits_to_keep"
        elif "num_logits_to_keep" in params:
            self._keep_kw = "num_logits_to_keep"
        else:
            self._keep_kw = None

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = next(self.model.parameters()).dtype
        return dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        kv: Sequence[LayerKV] | None,
        *,
        all_logits: bool = False,
        **inputs: Any,
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Run one forward pass over ``input_ids`` (and the model's other ``inputs``) on top of
        the cached ``kv``; returns the logits (only the last position unless ``all_logits``)
        and the KV."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer, (keys, values) in enumerate(kv or ()):
            cache.update(keys, values, layer)
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "attention_mask": attention_mask,
            "use_cache": True,
            self._cache_kw: cache,
            **inputs,
        }
        if self._keep_kw is not None:
            kwargs[self._keep_kw] = 0 if all_logits else 1
        out = self.model(**kwargs)
        logits = out.logits if all_logits else out.logits[:, -1:, :]
        return logits, _cache_tensors(cache)

    def prefill_vision(
        self, vision: VisionInputs, *, all_logits: bool = False
    ) -> tuple[torch.Tensor, list[LayerKV], int]:
        """Prefill one prompt with images (Qwen2-VL family).

        The vision features replace the placeholder embeddings under 3-D rotary positions;
        returns the logits, the KV and the position offset of every later token.
        """
        device = self.device
        ids = torch.tensor([vision.input_ids], device=device)
        grid = vision.image_grid_thw.to(device)
        types = vision.mm_token_type_ids.to(device)
        positions, deltas = self.model.model.get_rope_index(
            ids, mm_token_type_ids=types, image_grid_thw=grid
        )
        logits, kv = self.forward(
            ids,
            positions,
            None,
            None,
            all_logits=all_logits,
            pixel_values=vision.pixel_values.to(device=device, dtype=self.dtype),
            image_grid_thw=grid,
            mm_token_type_ids=types,
        )
        return logits, kv, int(deltas.reshape(-1)[0])


def _cache_tensors(cache: Any) -> list[LayerKV]:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        # float32 on CPU: half-precision matmuls are slow there and change the logprobs.
        return "auto" if device.type == "cuda" else torch.float32
    if dtype == "auto":
        return "auto"
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ConfigError(f"unknown dtype {dtype!r} (use e.g. float32, bfloat16, float16, auto)")
    return resolved


def load_model(
    meta: ModelMeta,
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load the weights of ``meta.model_path`` onto ``device`` (CUDA when available)."""
    import transformers
    from packaging.version import Version
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch_dtype = _resolve_dtype(dtype, target)
    dtype_kw = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    auto = AutoModelForImageTextToText if meta.has_vision else AutoModelForCausalLM
    model: Any = auto.from_pretrained(
        meta.model_path,
        trust_remote_code=trust_remote_code,
        **{dtype_kw: torch_dtype},
    )
    model.to(target)
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(model, target)
