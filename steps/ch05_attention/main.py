"""第 5 章：注意力后端。torch 参考后端在一次调用里处理长短不一（ragged）的多个请求：
prefill、在已缓存前缀之上继续 prefill、decode 都走同一段代码，元数据每个 batch 只算一次。

三个长度不同的提示词放进同一个 prefill batch，再一起 decode；每个请求的输出都要等于
transformers 单独跑这个请求的结果。另外把一个提示词拆成两段：先 prefill 前半段，再在
缓存之上 prefill 后半段，最后一个位置的 logits 应与一次性 prefill 相同。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Phase, Req, SamplingParams, get_global_ctx, set_global_ctx
from minisgl.kvcache import MHAKVPool
from minisgl.models import CausalLM, load_model

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPTS = ["The capital of France is", "List three prime numbers:",
           "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole"]
MAX_TOKENS, PAGE_SIZE, NUM_PAGES, MAX_SEQ_LEN = 12, 4, 128, 128


class Runner:
    """手工填 batch：给请求分页、写页表、拼出 input_ids / positions / out_loc。"""

    def __init__(self, model: CausalLM, num_slots: int):
        c = model.config
        self.model, self.next_page = model, 0
        self.pool = MHAKVPool(c.num_layers, NUM_PAGES, PAGE_SIZE, c.num_kv_heads, c.head_dim,
                              torch.float32, "cpu")
        self.page_table = torch.zeros(num_slots, MAX_SEQ_LEN, dtype=torch.int32)
        self.backend = create_attention_backend("torch", self.pool, self.page_table)
        set_global_ctx(Context(attn_backend=self.backend))

    def slots_for(self, req: Req) -> torch.Tensor:
        row = self.page_table[req.table_idx]
        for pos in range(req.cached_len, req.device_len):
            if pos % PAGE_SIZE == 0:  # 写到新一页的开头：拿下一个空闲页
                self.next_page += 1
                row[pos] = self.next_page * PAGE_SIZE
            else:  # 同一页里的下一个 slot
                row[pos] = row[pos - 1] + 1
        return row[req.cached_len : req.device_len]

    def forward(self, reqs: list[Req], phase: Phase) -> torch.Tensor:
        batch = Batch(reqs, phase)
        batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]).long()
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
        batch.out_loc = torch.cat([self.slots_for(r) for r in reqs]).long()
        self.backend.prepare_metadata(batch)
        with get_global_ctx().forward_batch(batch):
            return self.model.forward()


def new_req(ids: list[int], slot: int, cached_len: int = 0, max_tokens: int = MAX_TOKENS) -> Req:
    return Req(torch.tensor(ids, dtype=torch.int32), table_idx=slot, cached_len=cached_len,
               output_len=max_tokens, uid=slot, sampling_params=SamplingParams(max_tokens=max_tokens))


def main() -> int:
    torch.set_grad_enabled(False)
    failed = False
    for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"]:
        path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        runner = Runner(load_model(path, dtype=torch.float32), num_slots=len(PROMPTS) + 1)
        prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]
        reqs = [new_req(ids, slot) for slot, ids in enumerate(prompt_ids)]
        print(f"[{name}] 一个 batch 里 {len(reqs)} 个请求，提示词长度 {[len(i) for i in prompt_ids]}")
        phase: Phase = "prefill"
        while any(r.can_decode for r in reqs):
            logits = runner.forward(reqs, phase)
            for req, row in zip(reqs, logits):
                req.complete_one()
                req.append_host(int(row.argmax()))
            phase = "decode"
        for req, ids in zip(reqs, prompt_ids):
            theirs = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                 max_new_tokens=MAX_TOKENS, eos_token_id=None,
                                 do_sample=False)[0, len(ids) :].tolist()
            ok = req.output_ids == theirs
            print(f"  请求 {req.uid}: {tokenizer.decode(req.output_ids)!r}  与 HF 单独运行一致: {ok}")
            failed |= not ok

        # 前缀已在缓存里：先 prefill 前 10 个 token，再只算剩下的部分
        ids = prompt_ids[2]
        req = new_req(ids[:10], slot=len(PROMPTS), max_tokens=1)
        runner.forward([req], "prefill")
        req = new_req(ids, slot=len(PROMPTS), cached_len=10, max_tokens=1)
        cached = runner.forward([req], "prefill")[0]
        full = hf(torch.tensor([ids])).logits[0, -1]
        diff = (cached - full).abs().max().item()
        print(f"  缓存 10 个 token 后再 prefill {len(ids) - 10} 个：logits 与 HF 一次算完的最大误差 {diff:.2e}")
        failed |= diff > 1e-3
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
