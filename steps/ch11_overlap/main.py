"""第 11 章：重叠调度与离线接口 —— 阶段二的里程碑。

8 个请求一次 LLM.generate，它们共用一段很长的前缀（一篇短文），各问一个问题：
  1. 打开 radix cache 时，prefill 实际计算的 token 比关掉（naive）时至少少四分之三；
  2. 两种情况下输出完全相同，且每个请求都等于 transformers 单独运行的结果；
  3. 重叠调度开（默认）与关（MINISGL_DISABLE_OVERLAP_SCHEDULING=1）输出也完全相同。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.llm import LLM

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
DOCUMENT = (
    "Mini-SGLang is a compact implementation of a large language model inference engine. It "
    "serves requests through an API server, a tokenizer process and one scheduler process per "
    "tensor-parallel rank. The scheduler batches requests continuously: new prompts are "
    "prefilled, running requests decode one token per step, and finished requests leave at "
    "once. Key-value tensors live in a paged pool, and a radix tree remembers the prefixes of "
    "earlier requests so that a new request can skip computing what is already cached. While "
    "the GPU computes one batch, the CPU prepares the next one, which hides the scheduling "
    "overhead. Tensor parallelism splits every layer across GPUs: attention heads and the "
    "rows or columns of each weight matrix are divided among the ranks, and an all-reduce "
    "joins the partial results. CUDA graphs record the kernels of a decode step once and replay "
    "them, so launching a step costs one call instead of hundreds. On a laptop without a GPU "
    "the same code runs on the CPU with reference kernels, and every chapter checks that its "
    "output equals Hugging Face transformers token for token. Read the text above and answer "
    "the question in a few words.\nQuestion: ")
QUESTIONS = ["What does the radix tree remember?", "How many tokens does a running request "
             "decode per step?", "Where do key-value tensors live?", "What hides the "
             "scheduling overhead?", "Which process serves requests first?", "What happens to "
             "finished requests?", "What is prefilled?", "How many scheduler processes are there?"]
MAX_TOKENS = 12


def run(path: Path, cache_type: str, overlap: bool) -> tuple[list[list[int]], int]:
    llm = LLM(str(path), dtype=torch.float32, max_running_req=8, num_page_override=512,
              max_seq_len_override=512, page_size=4, cache_type=cache_type, overlap=overlap)
    outputs = llm.generate([DOCUMENT + q for q in QUESTIONS],
                           SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    computed = llm.scheduler.prefill_computed_tokens
    llm.shutdown()
    return [o["token_ids"] for o in outputs], computed


def main() -> int:
    path = MODELS / "SmolLM2-135M-Instruct"
    radix, radix_computed = run(path, "radix", overlap=True)
    naive, naive_computed = run(path, "naive", overlap=True)
    serial, _ = run(path, "radix", overlap=False)
    saved = 1 - radix_computed / naive_computed
    print("8 个请求一次 generate（SmolLM2-135M-Instruct）")
    print(f"  prefill 实际计算：radix {radix_computed} 个 token，naive {naive_computed} 个，"
          f"少算 {saved:.1%}（目标 ≥ 75%）")
    print(f"  radix 与 naive 输出相同: {radix == naive}；重叠开与关输出相同: {radix == serial}")

    tokenizer = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    failed = saved < 0.75 or radix != naive or radix != serial
    for q, ours in zip(QUESTIONS, radix):
        ids = tokenizer(DOCUMENT + q).input_ids
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                          max_new_tokens=MAX_TOKENS, eos_token_id=None, do_sample=False)
        ok = ours == ref[0, len(ids) :].tolist()
        failed |= not ok
        print(f"  {q!r} → {tokenizer.decode(ours)!r}  与 HF 一致: {ok}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
