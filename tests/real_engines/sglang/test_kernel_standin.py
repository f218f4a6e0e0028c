"""The sgl_kernel stand-in (requirements/sglang-cpu) against the contracts it implements.

SGLang calls neither function on the path the tests use (docs/engines.md), so these are
checked here directly: SGLang's ``csrc/cpu/kvcache.cpp`` contract for the KV copy (gather
every source row before any target row is written, in every buffer) and the Triton
kernel ``assign_req_to_token_pool``'s for the table write.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

STANDIN = Path(__file__).resolve().parents[3] / "requirements/sglang-cpu/sgl_kernel/__init__.py"


@pytest.fixture(scope="module")
def sgl_kernel() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sgl_kernel_standin", STANDIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_copy_all_layer_kv_cache_reads_before_it_writes(
    sgl_kernel: ModuleType, index_dtype: torch.dtype
) -> None:
    generator = torch.Generator().manual_seed(0)
    # two layers' K and V, 16 slots; rows of different widths and dtypes
    buffers = [
        torch.randn(16, 2, 8, generator=generator),
        torch.randn(16, 2, 8, generator=generator),
        torch.randn(16, 4, generator=generator).to(torch.bfloat16),
        torch.randn(16, 4, generator=generator).to(torch.bfloat16),
    ]
    before = [b.clone() for b in buffers]
    src = torch.tensor([1, 2, 3, 9], dtype=index_dtype)
    tgt = torch.tensor([2, 3, 4, 0], dtype=index_dtype)  # overlaps the sources
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers])
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for buffer, old in zip(buffers, before, strict=True):
        expected = old.clone()
        expected[tgt.long()] = old[src.long()]
        assert torch.equal(buffer, expected)


def test_assign_req_to_token_pool_fills_each_request_s_row(sgl_kernel: ModuleType) -> None:
    table = torch.zeros(4, 10, dtype=torch.int32)
    slots = torch.tensor([50, 51, 52, 60, 70, 71], dtype=torch.int64)
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0, 3]),  # rows of the three requests
        table,
        torch.tensor([1, 0, 8]),  # their new positions start...
        torch.tensor([4, 1, 10]),  # ...and end
        slots,
        10,
    )
    assert table[2, 1:4].tolist() == [50, 51, 52]
    assert table[0, 0:1].tolist() == [60]
    assert table[3, 8:10].tolist() == [70, 71]
    assert int(table.count_nonzero()) == 6  # nothing else written


def test_speculative_names_exist_and_refuse(sgl_kernel: ModuleType) -> None:
    with pytest.raises(NotImplementedError, match="speculative"):
        sgl_kernel.verify_tree_greedy_cpu()
    assert not hasattr(torch.ops, "sgl_kernel") or not hasattr(
        torch.ops.sgl_kernel, "convert_weight_packed"
    )  # what cpu_has_amx_support() looks for
