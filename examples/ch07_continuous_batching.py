"""第 7 章示例：请求在不同的步到达、在不同的步离开，调度器每一步只算在跑的请求。"""

from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

path = "models/tiny-llama"
tokenizer = AutoTokenizer.from_pretrained(path)
scheduler = Scheduler(SchedulerConfig(path, max_running_req=2, num_page_override=64,
                                      max_seq_len_override=64, overlap=False))
arrivals = {0: [("A", 3), ("B", 5)], 2: [("C", 2)], 4: [("D", 2)]}  # 第几步到达：(名字, max_tokens)
names, step = {}, 0
while scheduler.has_work or any(s >= step for s in arrivals):
    for name, max_tokens in arrivals.get(step, []):
        uid = len(names)
        names[uid] = name
        scheduler.add_request(uid, tokenizer(f"Request {name}:").input_ids,
                              SamplingParams(max_tokens=max_tokens))
    results = scheduler.step()
    print(f"第 {step} 步：" + "，".join(
        f"{names[r.uid]}{'（完成）' if r.finished else ''}" for r in results) +
          f"；等待 {len(scheduler.prefill.pending)} 个")
    step += 1
