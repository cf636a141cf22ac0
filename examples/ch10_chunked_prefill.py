"""第 10 章示例：max_prefill_length 决定一个长提示词被切成几块、分几步算完；输出与不分块完全相同。"""

import os

# 第 11 章起调度默认重叠，每一步交出的是上一步的结果；本例按步数数块，所以关掉它。
# 本章的代码里还没有这个开关，这一行在本章不起作用。
os.environ.setdefault("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1")

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.scheduler import Scheduler, SchedulerConfig  # noqa: E402

prompt = list(range(1000, 1100))  # 100 个任意的 token id
for budget in [8192, 40, 16]:
    scheduler = Scheduler(SchedulerConfig("models/SmolLM2-135M-Instruct", max_running_req=2,
                                          num_page_override=256, max_seq_len_override=256,
                                          max_prefill_length=budget))
    scheduler.add_request(0, prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    tokens, steps = [], 0
    while scheduler.has_work:
        tokens += [r.token for r in scheduler.step()]
        steps += 1
    # 6 个输出 token：第 1 个来自 prefill 的最后一块，其余 5 个各要一步 decode
    print(f"max_prefill_length={budget:5d}：prefill 分 {steps - 5} 步算完，输出 {tokens}")
