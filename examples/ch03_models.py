"""第 3 章示例：按 config.json 建模型、加载权重，看看参数名和注册表；未知结构会清楚地报错。"""

import json
import tempfile
from pathlib import Path

import torch

from minisgl.models import MODELS, ModelConfig, load_model

path = Path("models/SmolLM2-135M-Instruct")
config = ModelConfig.from_dir(path)
print(config)
model = load_model(path, dtype=torch.float32)
names = list(model.state_dict())
print(f"{len(names)} 个参数张量（q/k/v、gate/up 加载时已拼接；共享 embedding 的 lm_head 不单独占一个），"
      f"比如 {names[:3]} … {names[-2:]}")
print("注册过的结构：", MODELS.names())

with tempfile.TemporaryDirectory() as tmp:  # 只抄 config.json，把结构名改成没人认识的：查表就失败
    hf = json.loads((path / "config.json").read_text())
    hf["architectures"] = ["MysteryForCausalLM"]
    (Path(tmp) / "config.json").write_text(json.dumps(hf))
    try:
        load_model(tmp)
    except ValueError as error:
        print("ValueError:", error)
try:
    load_model("models/does-not-exist")
except FileNotFoundError as error:
    print("FileNotFoundError:", error)
