"""第 7 章示例：连续批处理。page table 只有 2 行，4 个请求在不同的步到达：有空行的新请求先
prefill，否则在跑的请求一起 decode；谁的 max_tokens 用完谁就离开，空出的行马上给排队的请求。
第 10 章起，在跑的请求搭进新请求的 prefill 步（混合 batch），第 3 步里 B 也拿到一个 token。"""

import os

# 第 11 章起调度默认重叠，每一步交出的是上一步的结果；本例要看逐步的调度，所以关掉它。
# 本章的代码里还没有这个开关，这一行在本章不起作用。
os.environ.setdefault("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1")

from transformers import AutoTokenizer  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.scheduler import Scheduler, SchedulerConfig  # noqa: E402

path = "models/SmolLM2-135M-Instruct"
tokenizer = AutoTokenizer.from_pretrained(path)
scheduler = Scheduler(SchedulerConfig(path, max_running_req=2, page_size=4, num_page_override=64,
                                      max_seq_len_override=64))
arrivals = {0: [("A", "The capital of France is", 3), ("B", "def fibonacci(n):", 5)],
            2: [("C", "The quick brown fox", 2)], 4: [("D", "Once upon a time", 2)]}  # 到达的步
names, outputs, step = [], {}, 0
while scheduler.has_work or any(s >= step for s in arrivals):
    for name, prompt, max_tokens in arrivals.get(step, []):
        scheduler.add_request(len(names), tokenizer(prompt).input_ids,
                              SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        names.append(name)
    results = scheduler.step()
    for r in results:
        outputs.setdefault(names[r.uid], []).append(r.token)
    print(f"第 {step} 步：" + "、".join(names[r.uid] + ("（完成）" if r.finished else "")
                                      for r in results) + f"；排队 {len(scheduler.prefill.pending)} 个")
    step += 1
for name, ids in outputs.items():
    print(f"{name}：{tokenizer.decode(ids)!r}")
