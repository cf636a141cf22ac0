"""第 4 章：分页 KV 池。连续的 KV cache 换成按页分配的 MHAKVPool：请求的第 i 个 token 存在
page_table[槽位, i] 指向的 slot 里（slot = 页号 × page_size + 页内偏移），页可以散落在池中
任何地方。为了说明这一点，这里故意从打乱的空闲页列表里分配。输出仍与 HF 逐 token 一致。
"""

import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Context, Phase, Req, SamplingParams, get_global_ctx, set_global_ctx
from minisgl.kvcache import MHAKVPool
from minisgl.models import CausalLM, load_model

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPT, MAX_TOKENS, NUM_PAGES, MAX_SEQ_LEN = "The capital of France is", 16, 64, 128


@dataclass
class LastTokens:  # 满足 core.AttentionMetadata
    last_indices: torch.Tensor


class PagedAttention:
    """先把新 token 的 K/V 写进池（out_loc），再按页表取出这个请求全部的 K/V 做注意力。"""

    def __init__(self, pool: MHAKVPool, page_table: torch.Tensor):
        self.pool, self.page_table = pool, page_table

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        self.pool.store_kv(k, v, batch.out_loc, layer_id)
        outputs, start = [], 0
        for req in batch.reqs:
            n, slots = req.extend_len, self.page_table[req.table_idx, : req.device_len]
            keys = self.pool.k_cache(layer_id)[slots].transpose(0, 1)
            values = self.pool.v_cache(layer_id)[slots].transpose(0, 1)
            mask = torch.ones(n, req.device_len, dtype=torch.bool).tril(req.cached_len)
            out = F.scaled_dot_product_attention(q[start : start + n].transpose(0, 1), keys,
                                                 values, attn_mask=mask, enable_gqa=True)
            outputs.append(out.transpose(0, 1))
            start += n
        return torch.cat(outputs)


class PageAllocator:
    """手工分配：一个请求写到新的一页开头时，从空闲列表拿一页。第 7 章起交给调度器。"""

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor):
        self.free_pages = list(range(num_pages))
        random.Random(0).shuffle(self.free_pages)
        self.page_size, self.page_table = page_size, page_table

    def allocate(self, req: Req) -> torch.Tensor:
        """为 [cached_len, device_len) 分配 slot，写进页表，返回它们（即 out_loc）。"""
        row = self.page_table[req.table_idx]
        for pos in range(req.cached_len, req.device_len):
            if pos % self.page_size == 0:
                row[pos] = self.free_pages.pop() * self.page_size
            else:
                row[pos] = row[pos - 1] + 1
        return row[req.cached_len : req.device_len]


def generate(model: CausalLM, req: Req, allocator: PageAllocator) -> list[int]:
    ctx, phase = get_global_ctx(), "prefill"
    while req.can_decode:
        batch = Batch([req], phase)  # type: ignore[arg-type]
        batch.input_ids = req.input_ids[req.cached_len : req.device_len].long()
        batch.positions = torch.arange(req.cached_len, req.device_len)
        batch.out_loc = allocator.allocate(req)
        batch.attn_metadata = LastTokens(torch.tensor([req.extend_len - 1]))
        with ctx.forward_batch(batch):
            logits = model.forward()
        req.complete_one()
        req.append_host(int(logits[0].argmax()))
        phase = "decode"
    return req.output_ids


def hf_greedy(path: Path, prompt_ids: list[int], max_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                         eos_token_id=None, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def main() -> int:
    torch.set_grad_enabled(False)
    failed = False
    for name, page_size in [("SmolLM2-135M-Instruct", 4), ("tiny-qwen3", 1), ("tiny-qwen3", 16)]:
        path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
        model = load_model(path, dtype=torch.float32)
        c = model.config
        pool = MHAKVPool(c.num_layers, NUM_PAGES, page_size, c.num_kv_heads, c.head_dim,
                         torch.float32, "cpu")
        page_table = torch.zeros(1, MAX_SEQ_LEN, dtype=torch.int32)
        set_global_ctx(Context(attn_backend=PagedAttention(pool, page_table)))
        allocator = PageAllocator(NUM_PAGES, page_size, page_table)

        prompt_ids = tokenizer(PROMPT).input_ids
        req = Req(torch.tensor(prompt_ids, dtype=torch.int32), table_idx=0, cached_len=0,
                  output_len=MAX_TOKENS, uid=0, sampling_params=SamplingParams(max_tokens=16))
        ours = generate(model, req, allocator)
        theirs = hf_greedy(path, prompt_ids, MAX_TOKENS)
        used = req.device_len - 1  # 最后一个 token 还没算过，不占 KV
        pages = sorted({int(s) // page_size for s in page_table[0, :used]})
        print(f"[{name}] page_size={page_size}，KV 池 {NUM_PAGES} 页 × {pool.bytes_per_page / 1024:.0f} KiB")
        print(f"  页表前 {used} 项（slot）: {page_table[0, :used].tolist()}")
        print(f"  用到的页: {pages}")
        print(f"  {PROMPT!r} → {tokenizer.decode(ours)!r}")
        same = sum(a == b for a, b in zip(ours, theirs))
        print(f"  与 HF 逐 token 一致: {same}/{MAX_TOKENS}" + ("" if ours == theirs else "  ← 不一致！"))
        failed |= ours != theirs
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
