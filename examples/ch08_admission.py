"""第 8 章示例：准入控制。KV 池只有 12 页（每页 4 个 token），5 个请求同时到达，每个一生要
ceil((12 + 10 - 1) / 4) = 6 页。只有"在跑的请求已占的页 + 还要的页 + 新请求一生要的页"不超过
12 页时才放行，所以同时只跑两个；其余按到达顺序排队，等在跑的请求结束、还回它们的页。"""

import os

# 第 11 章起调度默认重叠，每一步交出的是上一步的结果；本例要看逐步的调度，所以关掉它。
# 本章的代码里还没有这个开关，这一行在本章不起作用。
os.environ.setdefault("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1")

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.scheduler import Scheduler, SchedulerConfig  # noqa: E402

scheduler = Scheduler(SchedulerConfig("models/SmolLM2-135M-Instruct", max_running_req=8,
                                      page_size=4, num_page_override=12, max_seq_len_override=48))
for uid in range(5):  # 提示词是 12 个任意的 token id
    scheduler.add_request(uid, list(range(1000 + 20 * uid, 1012 + 20 * uid)),
                          SamplingParams(max_tokens=10, ignore_eos=True))
outputs, step = {}, 0
while scheduler.has_work:
    results = scheduler.step()
    for r in results:
        outputs.setdefault(r.uid, []).append(r.token)
    running = scheduler.decode.running
    held = sum(-(-r.cached_len // 4) for r in running)  # 每个请求已算的 token 占的页
    print(f"第 {step:2d} 步：算了 {[r.uid for r in results]}，排队 {len(scheduler.prefill.pending)}；"
          f"在跑的请求已占 {held} 页、还要 {scheduler.decode.reserved_pages} 页")
    step += 1
for uid, ids in outputs.items():
    print(f"请求 {uid}：{ids}")
