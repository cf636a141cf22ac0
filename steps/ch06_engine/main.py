"""第 6 章：Engine 与采样器 —— 阶段一的里程碑。

Engine 把模型、KV 池、页表、注意力后端和采样器装在一起，一次 forward_batch 就是"前向 + 采样"。
batch 仍由这里手工准备（第 7 章起交给调度器）。两件事要和 transformers 逐 token 一致：
  1. 一个提示词，16 个 token；
  2. 4 个长度不同的请求放在同一个 batch 里，每个请求都等于 transformers 单独跑它的结果。
有 CUDA 时同一份代码自动跑在 GPU 上。
"""

import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Phase, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
MAX_TOKENS = 16
PROMPTS = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):",
           "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole"]


class HandBatcher:
    """手工准备 batch：分页、写页表、拼 input_ids / positions / out_loc、准备注意力元数据。"""

    def __init__(self, engine: Engine):
        self.engine, self.free_pages = engine, list(range(engine.num_pages))

    def out_loc(self, req: Req) -> torch.Tensor:
        row, size = self.engine.page_table[req.table_idx], self.engine.page_size
        for pos in range(req.cached_len, req.device_len):
            row[pos] = self.free_pages.pop(0) * size if pos % size == 0 else row[pos - 1] + 1
        return row[req.cached_len : req.device_len]

    def run(self, reqs: list[Req]) -> None:
        phase: Phase = "prefill"
        device = self.engine.device
        while any(r.can_decode for r in reqs):
            batch = Batch(reqs, phase)
            batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]
                                        ).to(device, torch.long)
            batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]
                                        ).to(device)
            batch.out_loc = torch.cat([self.out_loc(r) for r in reqs]).long()
            self.engine.attn_backend.prepare_metadata(batch)
            output = self.engine.forward_batch(batch, self.engine.sampler.prepare(batch))
            output.copy_done.synchronize()
            for req, token in zip(reqs, output.next_tokens_host.tolist()):
                req.complete_one()
                req.append_host(token)
            phase = "decode"


def hf_greedy(hf, prompt_ids: list[int]) -> list[int]:
    ids = torch.tensor([prompt_ids], device=hf.device)
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                      eos_token_id=None, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def main() -> int:
    failed = False
    for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"]:
        path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
        engine = Engine(EngineConfig(str(path), max_running_req=len(PROMPTS), page_size=4,
                                     num_page_override=256, max_seq_len_override=256))
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(engine.device)
        where = (torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda"
                 else f"CPU，{engine.num_threads} 个线程")
        print(f"[{name}] 设备 {engine.device}（{where}），KV 池 {engine.num_pages} 页 × "
              f"{engine.page_size} token，max_seq_len={engine.max_seq_len}")
        prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]

        def new_req(slot: int) -> Req:
            return Req(torch.tensor(prompt_ids[slot], dtype=torch.int32), table_idx=slot,
                       cached_len=0, output_len=MAX_TOKENS, uid=slot,
                       sampling_params=SamplingParams(max_tokens=MAX_TOKENS))

        single = new_req(0)
        HandBatcher(engine).run([single])
        theirs = hf_greedy(hf, prompt_ids[0])
        ok = single.output_ids == theirs
        print(f"  单个请求: {PROMPTS[0]!r} → {tokenizer.decode(single.output_ids)!r}")
        print(f"    16 个 token 与 HF 一致: {ok}")
        failed |= not ok

        reqs = [new_req(slot) for slot in range(len(PROMPTS))]
        start = time.perf_counter()
        HandBatcher(engine).run(reqs)
        elapsed = time.perf_counter() - start
        print(f"  一个 batch 里 {len(reqs)} 个请求（提示词长度 {[len(i) for i in prompt_ids]}），"
              f"{MAX_TOKENS} 步用时 {elapsed:.2f} 秒")
        for req in reqs:
            ok = req.output_ids == hf_greedy(hf, prompt_ids[req.uid])
            print(f"    请求 {req.uid}: {tokenizer.decode(req.output_ids)!r}  与 HF 单独运行一致: {ok}")
            failed |= not ok
        engine.close()  # 交还全局 Context 和线程数，下一个模型的 Engine 从干净的进程开始
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
