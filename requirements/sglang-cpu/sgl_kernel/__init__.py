"""What SGLang 0.5.23 imports from ``sgl_kernel`` on a CPU without AMX, written in torch.

No CPU build of SGLang's kernel package is on PyPI (``sglang-kernel`` and ``sgl-kernel``
wheels hold CUDA libraries only), yet on the CPU path ``sglang`` imports a few names from
it at start-up. This module provides them, so the real server can run in toolrollout's
test suite from package registries alone. It is the only stand-in in that set-up.

* ``copy_all_layer_kv_cache_cpu`` and ``assign_req_to_token_pool_cpu`` are implemented
  in torch from their contracts (SGLang's ``csrc/cpu`` kernels and their call sites).
* The speculative-decoding names exist so that the modules importing them load; calling
  one raises, because toolrollout never starts SGLang with speculative decoding.

No ``torch.ops.sgl_kernel`` operator is registered: SGLang's ``cpu_has_amx_support()``
checks for one, and with none it keeps every layer (norms, RoPE, activations, linear
layers, attention, sampling) on its torch-native path.
"""

from __future__ import annotations

import ctypes
from typing import NoReturn

import torch

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """In every KV buffer ``b``, copy slot row ``src_loc[i]`` onto slot row ``tgt_loc[i]``.

    ``data_ptrs`` holds each buffer's base address (uint64) and ``strides`` the bytes of
    one slot row of it (int64). All source rows of a buffer are read before any target
    row is written, so overlapping ``src_loc`` and ``tgt_loc`` copy what was there before.
    """
    if data_ptrs.dtype != torch.uint64 or strides.dtype != torch.int64:
        raise TypeError("copy_all_layer_kv_cache_cpu: data_ptrs must be uint64, strides int64")
    if tgt_loc.numel() != src_loc.numel() or data_ptrs.numel() != strides.numel():
        raise ValueError("copy_all_layer_kv_cache_cpu: mismatched lengths")
    if data_ptrs.numel() == 0 or tgt_loc.numel() == 0:
        return
    targets = tgt_loc.to(torch.int64)
    sources = src_loc.to(torch.int64)
    rows = int(torch.maximum(targets.max(), sources.max()).item()) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        memory = (ctypes.c_uint8 * (rows * row_bytes)).from_address(address)
        buffer = torch.frombuffer(memory, dtype=torch.uint8).view(rows, row_bytes)
        buffer[targets] = buffer[sources]  # advanced indexing gathers a copy first


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    Request ``i`` owns row ``req_pool_indices[i]`` of ``req_to_token`` (``pool_len``
    columns) and gets positions ``start_offset[i]:end_offset[i]`` filled from
    ``out_cache_loc``, which holds the requests' new slots one after another in batch
    order.
    """
    if req_to_token.shape[1] != pool_len:
        raise ValueError("assign_req_to_token_pool_cpu: pool_len is not req_to_token's width")
    taken = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + count].to(req_to_token.dtype)
        taken += count


def _speculative_only(name: str):  # type: ignore[no-untyped-def]
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is a speculative-decoding kernel that toolrollout's CPU "
            "stand-in does not provide; start SGLang without speculative decoding"
        )

    refuse.__name__ = name
    return refuse


assign_draft_cache_locs_contiguous_cpu = _speculative_only("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _speculative_only("assign_extend_cache_locs_cpu")
build_tree_kernel_efficient_cpu = _speculative_only("build_tree_kernel_efficient_cpu")
fill_accept_out_cache_loc_cpu = _speculative_only("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _speculative_only("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _speculative_only("rotate_input_ids_cpu")
verify_tree_greedy_cpu = _speculative_only("verify_tree_greedy_cpu")
