"""第 5 章示例：torch 注意力后端一次处理三个长度不同的请求，和逐个请求的稠密 SDPA 比较。"""

import torch
import torch.nn.functional as F

from minisgl.attention import TorchAttentionBackend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVPool

torch.manual_seed(0)
heads, kv_heads, dim, page = 4, 2, 8, 4
pool = MHAKVPool(1, num_pages=32, page_size=page, num_kv_heads=kv_heads, head_dim=dim,
                 dtype=torch.float32, device="cpu")
page_table = torch.zeros(3, 64, dtype=torch.int32)
backend = TorchAttentionBackend(pool, page_table)

lengths = [3, 9, 5]
reqs = [Req(torch.zeros(n, dtype=torch.int32), table_idx=i, cached_len=0, output_len=1, uid=i,
            sampling_params=SamplingParams()) for i, n in enumerate(lengths)]
next_page = 0
for req in reqs:  # 每个请求占几整页
    for start in range(0, req.device_len, page):
        page_table[req.table_idx, start : start + page] = torch.arange(page) + next_page * page
        next_page += 1
batch = Batch(reqs, "prefill")
batch.out_loc = torch.cat([page_table[r.table_idx, : r.device_len] for r in reqs]).long()
backend.prepare_metadata(batch)
q = torch.randn(sum(lengths), heads, dim)
k, v = torch.randn(sum(lengths), kv_heads, dim), torch.randn(sum(lengths), kv_heads, dim)
out = backend.forward(q, k, v, layer_id=0, batch=batch)
print("每个请求最后一个 token 在 batch 中的下标：", batch.attn_metadata.last_indices.tolist())

start = 0
for n in lengths:
    s = slice(start, start + n)
    dense = F.scaled_dot_product_attention(q[s].transpose(0, 1), k[s].transpose(0, 1),
                                           v[s].transpose(0, 1), is_causal=True, enable_gqa=True)
    diff = (out[s] - dense.transpose(0, 1)).abs().max().item()
    print(f"长度 {n} 的请求：与稠密因果 SDPA 的最大误差 {diff:.1e}")
    start += n
