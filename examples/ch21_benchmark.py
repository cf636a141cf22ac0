"""第 21 章示例：任选一个模型（--model 指向含 config.json 的目录），算它在 H200 上一步 decode 的
屋顶线下界：每步必须搬运的字节、浮点运算，以及 decode 吞吐的上限（batch ÷ 下界）。只读 config.json，
不载入权重，所以 CPU 上也是一眨眼。

    python examples/ch21_benchmark.py --model models/SmolLM2-135M-Instruct --context 1024
"""

import argparse

from minisgl.benchmark.roofline import H200, ModelShape, StepShape, step_cost
from minisgl.models import ModelConfig

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
parser.add_argument("--context", type=int, default=1024, help="每个请求已缓存的 token 数")
parser.add_argument("--dtype-bytes", type=int, default=2, help="2：bfloat16")
args = parser.parse_args()

shape = ModelShape.of(ModelConfig.from_dir(args.model))
print(f"{args.model}：参数 {shape.parameters:,}，每步读权重 "
      f"{shape.weights_read_per_step * args.dtype_bytes / 1e6:,.1f} MB，每个 token 的 KV "
      f"{shape.kv_per_token * args.dtype_bytes / 1e3:.1f} KB")
for batch in (1, 8, 64, 256):
    step = StepShape.of("decode", [(args.context, args.context + 1)] * batch)
    cost = step_cost(shape, step, args.dtype_bytes)
    bound = cost.bound(H200)
    print(f"  batch {batch:>3}：{cost.bytes / 1e6:>9,.1f} MB，{cost.flops / 1e9:>7,.1f} GFLOP，"
          f"下界 {bound * 1e6:>7,.1f} μs（{'访存' if cost.memory_bound(H200) else '算力'}），"
          f"最多 {batch / bound:>11,.0f} token/s")
