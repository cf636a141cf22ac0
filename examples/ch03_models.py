"""第 3 章示例：按 config.json 建模型、加载权重，看看参数名和注册表；未知结构会清楚地报错。"""

import json
import shutil
import tempfile
from pathlib import Path

import torch

from minisgl.models import MODELS, ModelConfig, load_model

path = Path("models/tiny-qwen3")
config = ModelConfig.from_dir(path)
print(config)
model = load_model(path, dtype=torch.float32)
names = list(model.state_dict())
print(f"{len(names)} 个参数，比如 {names[:3]} … {names[-2:]}")
print("注册过的结构：", MODELS.names())

with tempfile.TemporaryDirectory() as tmp:
    copy = Path(tmp) / "model"
    shutil.copytree(path, copy)
    hf = json.loads((copy / "config.json").read_text())
    hf["architectures"] = ["MysteryForCausalLM"]
    (copy / "config.json").write_text(json.dumps(hf))
    try:
        load_model(copy)
    except ValueError as error:
        print("ValueError:", error)
try:
    load_model("models/does-not-exist")
except FileNotFoundError as error:
    print("FileNotFoundError:", error)
