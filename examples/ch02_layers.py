"""第 2 章示例：BaseOP 怎样由属性名得到参数名，meta 槽位不占内存，加载时三种错误各自报出名字。"""

import torch

from minisgl.layers import BaseOP, MergedLinear, OPList, RMSNorm, RotaryEmbedding


class Block(BaseOP):
    def __init__(self) -> None:
        self.norm = RMSNorm(8, eps=1e-6)
        self.gate_up_proj = MergedLinear(8, [16, 16])


model = OPList([Block(), Block()])
for name, tensor in model.state_dict().items():
    print(f"{name:24s} {tuple(tensor.shape)!s:10s} device={tensor.device}")

good = {name: torch.randn(t.shape) for name, t in model.state_dict().items()}
for label, state in [("少一个张量", {k: v for k, v in good.items() if not k.startswith("1.norm")}),
                     ("多一个张量", {**good, "2.norm.weight": torch.ones(8)}),
                     ("形状不对", {**good, "0.norm.weight": torch.ones(9)})]:
    try:
        model.load_state_dict(state)
    except (KeyError, ValueError) as error:
        print(f"{label}: {type(error).__name__}: {error}")
model.load_state_dict(good)
print("加载成功后 0.norm.weight 在", model[0].norm.weight.device)

rope = RotaryEmbedding(head_dim=4, max_position=16, base=10000.0)
q = torch.ones(3, 4)
rope.forward(torch.tensor([0, 1, 2]), q, q.clone())  # 原地旋转 q（和 k）
print("全 1 的 q 在位置 0、1、2 上旋转后：")
for position, row in enumerate(q.tolist()):
    print(f"  位置 {position}：{[round(x, 4) for x in row]}")
