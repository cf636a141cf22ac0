"""Our CUDA sources (csrc/*.cu) built at first use and cached on disk: by nvcc for this GPU
("cuda"), or by a C++ compiler for the CPU ("emulator", csrc/cuda_model.h). Each library exports
C functions of raw pointers that Python calls through ctypes: no torch headers, so a build takes
seconds."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

SOURCES = Path(__file__).parent / "csrc"
KERNELS = ("store", "index", "qk_norm_rope", "sample", "gemv", "decode_attention")
CACHE_DIR = Path(os.environ.get("MINISGL_KERNEL_CACHE",
                                Path.home() / ".cache" / "minisgl" / "kernels"))


class KernelBuildError(RuntimeError):
    """A kernel library could not be built here: the message says why and what to do."""


# The environment's own nvcc (CUDA 13.4), which `make setup` installs (tools/cuda_toolchains.py):
# the compiler of last resort, for a machine without a CUDA toolkit.
OWN_NVCC = Path(sys.prefix) / "cuda" / "13.4" / "nvidia" / "cu13" / "bin" / "nvcc"
USUAL_NVCC = Path("/usr/local/cuda/bin/nvcc")  # where a CUDA toolkit installs by default


def nvcc_candidates() -> list[str]:
    """Where nvcc is looked for, in order: the toolkit of $CUDA_HOME, the nvcc on PATH, the
    usual install (/usr/local/cuda), then the environment's own."""
    home = os.environ.get("CUDA_HOME")
    return [f"{home}/bin/nvcc" if home else "$CUDA_HOME/bin/nvcc ($CUDA_HOME unset)",
            shutil.which("nvcc") or "nvcc on PATH (none)", str(USUAL_NVCC), str(OWN_NVCC)]


def nvcc_path() -> str | None:
    """The nvcc a build uses: the first of nvcc_candidates() that exists."""
    return next((path for path in nvcc_candidates() if Path(path).is_file()), None)


def compile_command(name: str, target: str, output: Path, arch: str | None = None) -> list[str]:
    """The compiler call that builds csrc/<name>.cu into `output`: a shared library for the
    "cuda" target (for `arch`, e.g. "sm_90") or for the "emulator"; for the target
    "cuda-object" just an object file, which is all a compile check needs."""
    source = str(SOURCES / f"{name}.cu")
    if target in ("cuda", "cuda-object"):
        nvcc = nvcc_path()
        if nvcc is None:
            raise KernelBuildError(
                "our CUDA kernels are compiled at first use and nvcc was not found; looked for "
                f"{', '.join(nvcc_candidates())} (set CUDA_HOME, put the CUDA toolkit's bin/ on "
                "PATH, or run `make setup`); --disable-custom-kernels runs the reference ops "
                "instead")
        kind = ["-c"] if target == "cuda-object" else ["-shared", "-Xcompiler", "-fPIC"]
        return [nvcc, "-std=c++17", "-O3", f"-arch={arch}", *kind, source, "-o", str(output)]
    if target == "emulator":
        compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        if compiler is None:
            raise KernelBuildError("the CPU emulator needs a C++17 compiler (c++ or g++; or $CXX)")
        return [compiler, "-std=c++17", "-O1", "-fPIC", "-shared", "-x", "c++", source,
                "-o", str(output)]
    raise ValueError(f"unknown target {target!r}: cuda, cuda-object or emulator")


@cache
def compiler_version(compiler: str) -> str:
    """What `compiler --version` prints: a new compiler must not reuse an old build."""
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else ""


def run_compiler(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise KernelBuildError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")


def build(name: str, target: str, arch: str | None = None) -> Path:
    """The shared library of csrc/<name>.cu for `target`, compiled unless the cache holds one
    built from the same sources, by the same compiler (its version) with the same flags."""
    source, output = str(SOURCES / f"{name}.cu"), "<output>"
    command = compile_command(name, target, Path(output), arch)
    digest = hashlib.sha256()
    for path in (SOURCES / f"{name}.cu", SOURCES / "cuda_model.h"):
        digest.update(path.read_bytes())
    # The command without its two paths: the same sources in another checkout share the build.
    flags = [arg for arg in command if arg not in (source, output)]
    digest.update("\0".join([*flags, compiler_version(command[0])]).encode())
    library = CACHE_DIR / f"{name}-{target}-{digest.hexdigest()[:16]}.so"
    if not library.is_file():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE_DIR) as tmp:  # same file system: atomic
            partial = Path(tmp) / library.name
            run_compiler([str(partial) if arg == output else arg for arg in command])
            partial.replace(library)  # a process building the same library meanwhile is fine
    return library
