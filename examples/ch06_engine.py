"""第 6 章示例：Engine 一步"前向 + 采样"；同一个 batch 里两个请求，一个贪心、一个按温度采样。"""

import torch
from transformers import AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams, fit_max_tokens
from minisgl.engine import Engine, EngineConfig

path = "models/SmolLM2-135M-Instruct"
engine = Engine(EngineConfig(path, max_running_req=2, num_page_override=64,
                             max_seq_len_override=64, seed=1))
tokenizer = AutoTokenizer.from_pretrained(path)
print(f"设备 {engine.device}，{engine.num_threads} 个线程，KV 池 {engine.num_pages} 页")
params = [SamplingParams(max_tokens=12), SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9)]
ids = tokenizer("The capital of France is").input_ids
reqs = [Req(torch.tensor(ids, dtype=torch.int32), table_idx=i, cached_len=0, output_len=12,
            uid=i, sampling_params=p) for i, p in enumerate(params)]
for req in reqs:  # page_size=1：每个请求独占 32 个连续的 slot
    slots = torch.arange(req.max_device_len) + 32 * req.table_idx
    engine.page_table[req.table_idx, : req.max_device_len] = slots
phase = "prefill"
while reqs[0].can_decode:
    batch = Batch(reqs, phase)
    batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]).long()
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.out_loc = torch.cat([engine.page_table[r.table_idx, r.cached_len : r.device_len]
                               for r in reqs]).long()
    engine.attn_backend.prepare_metadata(batch)
    output = engine.forward_batch(batch, engine.sampler.prepare(batch))
    output.copy_done.synchronize()
    for req, token in zip(reqs, output.next_tokens_host.tolist()):
        req.complete_one()
        req.append_host(token)
    phase = "decode"
for req in reqs:
    print(f"{req.sampling_params}\n  → {tokenizer.decode(req.output_ids)!r}")
try:
    fit_max_tokens(60, 16, engine.max_seq_len)  # 提示词 60 个 token，最多再生成 16 个
except ValueError as error:
    print("ValueError:", error)
engine.close()  # 还原构造时对进程做的设置（全局 Context、CPU 线程数）
