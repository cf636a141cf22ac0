"""kvcache.MHAKVPool: slot addressing, per-layer views, store_kv, and the page size in bytes."""

from __future__ import annotations

import pytest
import torch

from minisgl.kvcache import MHAKVPool

CHAPTER = 4  # tools/steps.py check runs this module on chapter 4's own tree

LAYERS, PAGES, PAGE_SIZE, HEADS, DIM = 3, 5, 4, 2, 8


@pytest.fixture
def pool() -> MHAKVPool:
    return MHAKVPool(LAYERS, PAGES, PAGE_SIZE, HEADS, DIM, torch.float32, "cpu")


def test_pool_has_pages_times_page_size_slots(pool):
    assert pool.num_slots == PAGES * PAGE_SIZE
    assert pool.k_cache(0).shape == (PAGES * PAGE_SIZE, HEADS, DIM)
    assert pool.v_cache(LAYERS - 1).shape == (PAGES * PAGE_SIZE, HEADS, DIM)


def test_new_pool_is_zero(pool):
    assert all(pool.k_cache(l).abs().sum() == 0 and pool.v_cache(l).abs().sum() == 0
               for l in range(LAYERS))


def snapshot(pool: MHAKVPool) -> list[torch.Tensor]:
    return [c.clone() for l in range(LAYERS) for c in (pool.k_cache(l), pool.v_cache(l))]


def test_store_kv_writes_exactly_the_given_slots(pool):
    before = snapshot(pool)
    slots = torch.tensor([17, 2, 9])
    k, v = torch.randn(3, HEADS, DIM), torch.randn(3, HEADS, DIM)
    pool.store_kv(k, v, slots, layer_id=1)
    assert torch.equal(pool.k_cache(1)[slots], k) and torch.equal(pool.v_cache(1)[slots], v)
    after = snapshot(pool)
    k_changed = (after[2] != before[2]).any(dim=(1, 2)).nonzero().flatten()
    v_changed = (after[3] != before[3]).any(dim=(1, 2)).nonzero().flatten()
    assert k_changed.tolist() == [2, 9, 17] and v_changed.tolist() == [2, 9, 17]


def test_store_kv_leaves_other_layers_untouched(pool):
    before = snapshot(pool)
    pool.store_kv(torch.randn(2, HEADS, DIM), torch.randn(2, HEADS, DIM), torch.tensor([0, 19]),
                  layer_id=1)
    after = snapshot(pool)
    for index in range(2 * LAYERS):
        if index not in (2, 3):  # layer 1's K and V
            assert torch.equal(after[index], before[index]), index


def test_store_kv_keeps_k_and_v_apart(pool):
    k, v = torch.full((1, HEADS, DIM), 1.0), torch.full((1, HEADS, DIM), 2.0)
    pool.store_kv(k, v, torch.tensor([5]), layer_id=0)
    assert pool.k_cache(0)[5].unique().tolist() == [1.0]
    assert pool.v_cache(0)[5].unique().tolist() == [2.0]


def test_k_cache_views_are_per_layer(pool):
    pool.k_cache(2)[3] = 7.0
    assert pool.k_cache(2)[3].eq(7.0).all()
    assert pool.k_cache(0).abs().sum() == 0 and pool.k_cache(1).abs().sum() == 0
    assert pool.v_cache(2).abs().sum() == 0


def test_k_cache_is_a_view_of_the_pool_not_a_copy(pool):
    view = pool.k_cache(1)
    view[0] = 3.0
    assert pool.k_cache(1)[0].eq(3.0).all()


def test_slot_is_page_times_page_size_plus_offset(pool):
    page, offset, layer = 3, 2, 1
    pool.store_kv(torch.ones(1, HEADS, DIM), torch.ones(1, HEADS, DIM),
                  torch.tensor([page * PAGE_SIZE + offset]), layer)
    # The buffer is [2, layers, pages, page_size, heads, dim]: K is index 0, V index 1.
    written = {tuple(index[:4]) for index in (pool._buffer != 0).nonzero().tolist()}
    assert written == {(0, layer, page, offset), (1, layer, page, offset)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_bytes_matches_the_buffer_size(dtype, page_size):
    pool = MHAKVPool(LAYERS, 6, page_size, HEADS, DIM, dtype, "cpu")
    buffer_bytes = pool._buffer.numel() * pool._buffer.element_size()
    assert pool.bytes_per_page * pool.num_pages == buffer_bytes
    assert MHAKVPool.page_bytes(LAYERS, page_size, HEADS, DIM, dtype) == buffer_bytes // 6


# --- the chapter's example ---

import json  # noqa: E402
import re  # noqa: E402

from conftest import MODELS_DIR, SMOLLM2  # noqa: E402
from processes import run_example  # noqa: E402


def test_example_prints_page_sizes_and_where_store_kv_wrote():
    out = run_example("ch04_kv_pool.py")
    hf = json.loads((MODELS_DIR / SMOLLM2 / "config.json").read_text())
    head_dim = hf["hidden_size"] // hf["num_attention_heads"]
    # bytes per page = 2 (K and V) × layers × page_size × kv_heads × head_dim × 4 (float32)
    smol = 2 * hf["num_hidden_layers"] * 4 * hf["num_key_value_heads"] * head_dim * 4
    assert re.search(rf"^SmolLM2.*page_size=4：一页 {smol} 字节$", out, re.M)
    toy = 2 * 2 * 4 * 2 * 3 * 4  # its pool: 2 layers, page_size 4, 2 KV heads, head_dim 3
    assert f"玩具池：6 页 × 4 token = {6 * 4} 个 slot；一页 {toy} 字节（K 和 V，2 层）" in out
    # Token i (K = i, V = -i) went to slot page_table_row[i] = [12, 13, 14, 15, 4][i]: page 3
    # holds tokens 0-3, page 1 starts with token 4, the rest of page 1 was never written.
    assert "第 1 层 K 的第 3 页（每个 slot 取头 0、维 0）： [0.0, 1.0, 2.0, 3.0]" in out
    assert "第 1 层 K 的第 1 页（每个 slot 取头 0、维 0）： [4.0, 0.0, 0.0, 0.0]" in out
    assert f"第 1 层 V 的 slot 4： {[[-4.0] * 3] * 2}" in out
    assert "第 0 层没写过，仍是 0： 0.0" in out
