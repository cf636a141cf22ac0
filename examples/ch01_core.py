"""第 1 章示例：Req 的三段长度怎样随前向推进，SamplingParams 怎样拒绝坏参数，forward_batch 不能嵌套。"""

import torch

from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx

req = Req(torch.tensor([504, 3575, 282, 4649, 314], dtype=torch.int32), table_idx=0,
          cached_len=0, output_len=3, uid=7, sampling_params=SamplingParams(max_tokens=3))
print("新请求       ", req, f"extend_len={req.extend_len} remain_len={req.remain_len}")
for token in [7042, 30, 198]:  # 假装模型依次采样出这三个 token
    req.complete_one()  # 这一段的 KV 已写好；刚采样的 token 成为下一轮要算的 1 个
    req.append_host(token)
    print("前向 + 采样后", req, f"extend_len={req.extend_len} can_decode={req.can_decode}")
print("输出 token:", req.output_ids)

for bad in [dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=0), dict(max_tokens=0)]:
    try:
        SamplingParams(**bad)
    except ValueError as error:
        print(f"SamplingParams({bad}) → ValueError: {error}")


class NoAttention:  # 满足 core.AttentionBackend 协议即可
    def forward(self, q, k, v, layer_id, batch):
        return q


ctx = Context(attn_backend=NoAttention())
set_global_ctx(ctx)
batch = Batch([req], "decode")
with ctx.forward_batch(batch):
    print("forward_batch 里：ctx.batch 就是", ctx.batch.phase, "batch")
    try:
        with ctx.forward_batch(batch):
            pass
    except RuntimeError as error:
        print("嵌套 forward_batch → RuntimeError:", error)
try:
    ctx.batch
except RuntimeError as error:
    print("forward_batch 之外读 ctx.batch → RuntimeError:", error)
