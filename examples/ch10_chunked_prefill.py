"""第 10 章示例：max_prefill_length 决定长提示词被切成几块；输出与不分块完全相同。"""

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

prompt = list(range(1000, 1100))  # 100 个 token
for budget in [8192, 40, 16]:
    scheduler = Scheduler(SchedulerConfig("models/tiny-qwen3", max_running_req=2,
                                          num_page_override=256, max_seq_len_override=256,
                                          max_prefill_length=budget, overlap=False))
    scheduler.add_request(0, prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    tokens, steps = [], 0
    while scheduler.has_work:
        tokens += [r.token for r in scheduler.step()]
        steps += 1
    print(f"max_prefill_length={budget:5d}：prefill 分 {steps - 5} 步算完，输出 {tokens}")
