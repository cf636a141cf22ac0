"""`python -m minisgl`'s command line answers before the server's imports: --help, --version and
a mistaken command line never import torch (which takes seconds), while --help still lists every
name the registries accept for --attn, --cache-type, --moe and --dtype."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import TINY_QWEN3
from processes import ROOT, minisgl_env

CHAPTER = 15

# Runs `python -m minisgl ARGS` in this process of the child and reports what it imported.
RUN = """
import json, runpy, sys
sys.argv = ["minisgl", *json.loads(sys.argv[1])]
try:
    runpy.run_module("minisgl", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "uvicorn", "minisgl.server.launch")
               if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


def run_minisgl(*args: str) -> tuple[dict, str, str]:
    r = subprocess.run([sys.executable, "-c", RUN, json.dumps(args)], cwd=ROOT,
                       env=minisgl_env(), capture_output=True, text=True, timeout=120)
    *err, report = r.stderr.rstrip("\n").split("\n")
    return json.loads(report), r.stdout, "\n".join(err)


def registries() -> dict[str, list[str]]:
    """flag -> the names its registry holds (--moe from the chapter that adds MoE on)."""
    from minisgl.attention import ATTENTION_BACKENDS
    from minisgl.kvcache import PREFIX_CACHES

    names = {"--attention-backend": ATTENTION_BACKENDS.names(),
             "--cache-type": PREFIX_CACHES.names()}
    try:
        from minisgl.moe import MOE_BACKENDS
    except ImportError:  # before chapter 20
        return names
    return {**names, "--moe": MOE_BACKENDS.names()}


def test_help_lists_every_registered_name_without_importing_torch():
    report, out, _ = run_minisgl("--help")
    assert report == {"code": 0, "heavy": []}
    for flag, names in registries().items():
        assert f"{flag} {{auto,{','.join(names)}}}" in out or f"{flag} {{{','.join(names)}}}" in out
    assert "--dtype {auto,float32,bfloat16,float16}" in out
    assert "--version" in out


def test_version_is_the_package_version_without_importing_torch():
    from importlib.metadata import version

    report, out, _ = run_minisgl("--version")
    assert report == {"code": 0, "heavy": []}
    assert out.strip() == f"python -m minisgl {version('minisgl')}"


@pytest.mark.parametrize("args, message", [
    (["--attn", "nope"], "invalid choice: 'nope'"),
    (["--dtype", "float64"], "invalid choice: 'float64'"),
    (["--port", "lots"], "invalid int value: 'lots'"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--port", "70000"], "--port must be between 0 and 65535, got 70000"),
])
def test_a_mistake_is_answered_without_importing_torch(args, message):
    report, _, err = run_minisgl("--model", f"models/{TINY_QWEN3}", *args)
    assert report == {"code": 2, "heavy": []}
    assert message in err


def test_a_model_directory_without_config_json_is_answered_without_importing_torch(tmp_path):
    report, _, err = run_minisgl("--model", str(tmp_path))
    assert report == {"code": 2, "heavy": []} and "no config.json there" in err


def test_the_written_out_names_are_the_registries_names():
    from minisgl.server import args

    assert list(args.ATTENTION_BACKEND_NAMES) == registries()["--attention-backend"]
    assert list(args.PREFIX_CACHE_NAMES) == registries()["--cache-type"]
    if "--moe" in registries():
        assert list(args.MOE_BACKEND_NAMES) == registries()["--moe"]
    assert all(isinstance(getattr(torch, name), torch.dtype) for name in args.DTYPES)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_dtype_names_become_torch_dtypes(name):
    from minisgl.server.args import parse_args

    parsed = parse_args(["--model", f"models/{TINY_QWEN3}", "--port", "0", "--dtype", name])
    assert parsed.scheduler.dtype == getattr(torch, name)
    auto = parse_args(["--model", f"models/{TINY_QWEN3}", "--port", "0"])
    assert auto.scheduler.dtype == torch.float32  # auto on the CPU
