"""第 8 章示例：KV 池太小时，PrefillAdder 让放不下的请求排队，直到在跑的请求释放出页。"""

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

scheduler = Scheduler(SchedulerConfig("models/tiny-qwen3", max_running_req=8, page_size=4,
                                      num_page_override=12, max_seq_len_override=48, overlap=False))
for uid in range(5):  # 每个请求一生要 ceil((12 + 10 - 1) / 4) = 6 页；池里只有 12 页
    scheduler.add_request(uid, list(range(100 + uid, 112 + uid)),
                          SamplingParams(max_tokens=10, ignore_eos=True))
step = 0
while scheduler.has_work:
    results = scheduler.step()
    print(f"第 {step:2d} 步：{[r.uid for r in results]}，等待 {len(scheduler.prefill.pending)}，"
          f"空闲页 {len(scheduler.cache.free_pages)}，在跑请求还要 {scheduler.decode.reserved_pages} 页")
    step += 1
