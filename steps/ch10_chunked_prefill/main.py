"""第 10 章：分块 prefill 与混合 batch。一个长提示词在 2 个请求 decode 到一半时到达；
max_prefill_length=32，它被切成若干块，一块一步；正在 decode 的请求搭进同一步（混合 batch），
每一步照样各拿一个 token，不会被它卡住。打印每一步算了什么；最后所有请求的输出都要与不分块时
相同，也与 transformers 单独运行一致。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
LONG = ("In the beginning the universe was created. This has made a lot of people very angry "
        "and been widely regarded as a bad move. Many races believe that it was created by some "
        "sort of god, though the Jatravartid people of Viltvodle VI believe that the entire "
        "universe was in fact sneezed out of the nose of a being called the Great Green "
        "Arkleseizure. The Jatravartids, who live in perpetual fear of the time they call The "
        "Coming of the Great White Handkerchief, are small blue creatures with more than fifty "
        "arms each, who are therefore unique in being the only race in history to have invented "
        "the aerosol deodorant before the wheel. Summarise this in one sentence:")
SHORT = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 10


def run(path: Path, prompts: list[list[int]], max_prefill_length: int, show: bool):
    scheduler = Scheduler(SchedulerConfig(str(path), max_running_req=4, page_size=4,
                                          num_page_override=128, max_seq_len_override=256,
                                          max_prefill_length=max_prefill_length))
    outputs: dict[int, list[int]] = {uid: [] for uid in range(len(prompts))}
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    for uid in (0, 1):
        scheduler.add_request(uid, prompts[uid], params)
    step, chunk_end, stalled = 0, 0, 0
    while scheduler.has_work:
        if step == 3:  # 两个短请求正在 decode 时，长提示词到达
            scheduler.add_request(2, prompts[2], params)
        results = scheduler.step()
        for r in results:
            outputs[r.uid].append(r.token)
        pending = scheduler.prefill.pending
        chunk = pending[0].chunk if pending else None  # 切了一半的长提示词，块尾就是它的 cached_len
        what = []
        started = [r.uid for r in results if len(outputs[r.uid]) == 1]
        decoded = [r.uid for r in results if len(outputs[r.uid]) > 1]
        if chunk is not None and chunk.cached_len > chunk_end:
            chunk_end = chunk.cached_len
            what.append(f"长提示词的一块（算到第 {chunk_end} 个 token）")
        if 2 in started:
            what.append(f"长提示词的最后一块（{len(prompts[2])} 个 token 算完，采样出第 1 个）")
        if what:  # 这一步算了长提示词的一块：还没结束的短请求也必须各拿到一个 token
            got = {r.uid for r in results}
            stalled += any(uid not in got for uid in (0, 1) if len(outputs[uid]) < MAX_TOKENS)
        if short := [uid for uid in started if uid != 2]:
            what.append(f"prefill 请求 {short}")
        if decoded:
            what.append(f"decode 请求 {decoded}")
        if show:
            print(f"  第 {step:2d} 步 {' + '.join(what)}")
        step += 1
    return outputs, scheduler.prefill_computed_tokens, stalled


def main() -> int:
    name = "SmolLM2-135M-Instruct"
    path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
    prompts = [tokenizer(p).input_ids for p in SHORT + [LONG]]
    print(f"[{name}] 长提示词 {len(prompts[2])} 个 token，max_prefill_length=32")
    chunked, computed_chunked, stalled = run(path, prompts, 32, show=True)
    whole, computed_whole, _ = run(path, prompts, 8192, show=False)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    failed = chunked != whole or computed_chunked != computed_whole or stalled > 0
    print(f"  算块的那些步里，在跑的请求停下了 {stalled} 步")
    print(f"  分块与不分块：输出相同 {chunked == whole}，prefill 共计算 "
          f"{computed_chunked} / {computed_whole} 个 token")
    for uid, ids in enumerate(prompts):
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                          max_new_tokens=MAX_TOKENS, eos_token_id=None, do_sample=False)
        ok = chunked[uid] == ref[0, len(ids) :].tolist()
        print(f"  请求 {uid}: {tokenizer.decode(chunked[uid])!r}  与 HF 单独运行一致: {ok}")
        failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
