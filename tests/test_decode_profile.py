"""benchmark/decode_profile.py's pure parts: which category a kernel's name falls in, and the
long gaps between the GPU's busy intervals (the runs themselves need a GPU)."""

from __future__ import annotations

import pytest

from benchmark_scripts import load_script

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

decode_profile = load_script("decode_profile")


@pytest.mark.parametrize("name,expected", [
    ("void sample_kernel<bf16>(int*, bf16 const*, long, long, float const*, unsigned long)", "采样"),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>", "注意力"),
    ("void flashinfer::PersistentVariableLengthMergeStatesKernel<8u, 16u>", "注意力"),
    ("void gemv_kernel<1, 4>(bf16*, bf16 const*, bf16 const*, long, long, long, long)", "矩阵乘"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "矩阵乘"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>", "norm/RoPE/激活"),
    ("void qk_norm_rope_kernel<bf16, 2>(bf16*, bf16*, long)", "norm/RoPE/激活"),
    ("void store_kv_kernel<uint4>(uint4*, uint4*, long const*)", "KV 写入/gather"),
    ("Memcpy HtoD (Pinned -> Device)", "其余"),
])
def test_a_kernel_falls_in_the_category_its_name_says(name, expected):
    assert decode_profile.category(name) == expected


def test_long_gaps_count_only_the_gaps_longer_than_the_threshold():
    # Overlapping kernels (PDL, several streams) merge first: the gaps are 2, 15 and 30 us.
    busy = decode_profile.merge([(0, 10), (5, 12), (14, 20), (35, 40), (70, 71)])
    assert busy == [(0, 12), (14, 20), (35, 40), (70, 71)]
    assert decode_profile.long_gaps(busy, 10.0) == 45
    assert decode_profile.long_gaps(busy, 20.0) == 30
    assert decode_profile.long_gaps(busy[:1], 0.0) == 0
