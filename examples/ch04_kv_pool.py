"""第 4 章示例：分页 KV 池的形状、一页多少字节，以及 store_kv 按 slot 写入。"""

import torch

from minisgl.kvcache import MHAKVPool
from minisgl.models import ModelConfig

config = ModelConfig.from_dir("models/SmolLM2-135M-Instruct")
smol = MHAKVPool.page_bytes(config.num_layers, 4, config.num_kv_heads, config.head_dim,
                            torch.float32)
print(f"SmolLM2（{config.num_layers} 层，{config.num_kv_heads} 个 KV 头，{config.head_dim} 维），"
      f"float32、page_size=4：一页 {smol} 字节")

# 一个玩具池，小到可以把内容打印出来
pool = MHAKVPool(num_layers=2, num_pages=6, page_size=4, num_kv_heads=2, head_dim=3,
                 dtype=torch.float32, device="cpu")
print(f"玩具池：{pool.num_pages} 页 × {pool.page_size} token = {pool.num_slots} 个 slot；"
      f"一页 {pool.bytes_per_page} 字节（K 和 V，{pool.num_layers} 层）")

# 一个 5 个 token 的请求占了第 3 页和第 1 页：slot = 页号 × page_size + 页内偏移
page_table_row = torch.tensor([12, 13, 14, 15, 4])
k = torch.arange(5.0)[:, None, None].expand(5, 2, 3)  # 第 i 个 token 的 K 全是 i
pool.store_kv(k, -k, page_table_row, layer_id=1)
print("第 1 层 K 的第 3 页（每个 slot 取头 0、维 0）：", pool.k_cache(1)[12:16, 0, 0].tolist())
print("第 1 层 K 的第 1 页（每个 slot 取头 0、维 0）：", pool.k_cache(1)[4:8, 0, 0].tolist())
print("第 1 层 V 的 slot 4：", pool.v_cache(1)[4].tolist())
print("第 0 层没写过，仍是 0：", pool.k_cache(0).abs().sum().item())
