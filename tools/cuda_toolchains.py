"""The two CUDA toolchains that compile chapter 19's kernels in the tests, installed into the
project's environment by `make setup` (this script), and the CUDA 12.9 route through them.

- CUDA 13.4: the wheel nvidia-cuda-nvcc carries the whole nvcc driver (cicc comes from
  nvidia-nvvm, the headers from nvidia-cuda-crt and nvidia-cuda-runtime). jit.py finds it as the
  environment's own nvcc when the machine has none.
- CUDA 12.9: PyPI has no nvcc driver of 12.x. NVRTC 12.9 (nvidia-cuda-nvrtc-cu12) compiles the
  device code of a .cu file to PTX at run time, and ptxas 12.9 (nvidia-cuda-nvcc-cu12 carries
  ptxas and libnvvm, no driver) turns the PTX into an sm_80 or sm_90 binary; the runtime headers
  (nvidia-cuda-runtime-cu12) declare the API that the launch functions call.

Each toolchain goes into its own folder, <env>/cuda/<version>, with `pip --target --no-deps`, not
into site-packages: a CUDA build of torch pins its own nvidia-cuda-runtime and nvrtc wheels, which
these must not replace. The file `installed.txt` there, written last, tells the tests that the
set-up ran here: from then on a missing or broken compiler fails them instead of skipping.

    python tools/cuda_toolchains.py     # install (what `make setup` runs; idempotent)
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

PACKAGES = {
    "13.4": ["nvidia-cuda-nvcc==13.4.92", "nvidia-nvvm==13.4.92", "nvidia-cuda-crt==13.4.92",
             "nvidia-cuda-runtime==13.4.92"],
    "12.9": ["nvidia-cuda-nvrtc-cu12==12.9.86", "nvidia-cuda-nvcc-cu12==12.9.86",
             "nvidia-cuda-runtime-cu12==12.9.79"],
}
HOME = Path(sys.prefix) / "cuda"
MARKER = HOME / "installed.txt"
NVCC_13 = HOME / "13.4" / "nvidia" / "cu13" / "bin" / "nvcc"  # jit.py names the same path
NVRTC_12 = HOME / "12.9" / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
PTXAS_12 = HOME / "12.9" / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
RUNTIME_INCLUDE_12 = HOME / "12.9" / "nvidia" / "cuda_runtime" / "include"


def installed() -> bool:
    """Whether the set-up installed the toolchains into this environment."""
    return MARKER.is_file()


def install() -> None:
    wanted = "".join(f"{version}: {' '.join(pkgs)}\n" for version, pkgs in PACKAGES.items())
    if installed() and MARKER.read_text() == wanted:
        return
    for version, pkgs in PACKAGES.items():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                        "--target", str(HOME / version), *pkgs], check=True)
    MARKER.write_text(wanted)


# --- CUDA 12.9: NVRTC to PTX, then ptxas ---

# NVRTC compiles device code only and ships no C++ standard headers. The kernels' launch
# functions (host code) are compiled as device code (-default-device) against these
# declarations; nothing calls them there, so they leave no trace in the PTX, but the kernel
# templates they launch are instantiated and every call is checked against 12.9's runtime
# headers. The standard headers: what the sources take from them.
NVRTC_HEADERS = {
    "cstdint": "#pragma once\n"
               "typedef signed char int8_t; typedef short int16_t; typedef int int32_t;\n"
               "typedef long long int64_t; typedef unsigned char uint8_t;\n"
               "typedef unsigned short uint16_t; typedef unsigned int uint32_t;\n"
               "typedef unsigned long long uint64_t;\n",
    "cmath": "#pragma once\n#define INFINITY __int_as_float(0x7f800000)\n",
    "climits": "#pragma once\n#define INT_MAX 2147483647\n",
    "cstdlib": "#pragma once\nnamespace std { __device__ char* getenv(const char*); }\n",
    "minisgl_nvrtc_launch.h": """#pragma once
#include <cuda_runtime.h>
template <typename... Params, typename... Args>
__device__ cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t*, void (*)(Params...), Args...);
__device__ cudaError_t cudaGetDevice(int*);
__device__ cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int);
__device__ cudaError_t cudaGetLastError();
template <typename Kernel>
__device__ cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int*, Kernel, int, size_t);
""",
}
# cuda_model.h caches pdl_enabled() in a function-local static, which device code cannot
# initialize at run time: on this route it is a plain local.
PDL_CACHE = "static const bool enabled = [] {"


class CompileError(RuntimeError):
    pass


def _nvrtc() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(NVRTC_12))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def nvrtc_version() -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def ptx_12(sources: Path, name: str, arch: str) -> str:
    """NVRTC 12.9 compiles csrc/<name>.cu (under `sources`) for `arch` ("sm_80") to PTX."""
    lib = _nvrtc()
    model = (sources / "cuda_model.h").read_text()
    if PDL_CACHE not in model:
        raise CompileError(f"cuda_model.h no longer has {PDL_CACHE!r}: update tools/{Path(__file__).name}")
    headers = {**NVRTC_HEADERS, "cuda_model.h": model.replace(PDL_CACHE, PDL_CACHE[len("static "):])}
    names = (ctypes.c_char_p * len(headers))(*[n.encode() for n in headers])
    texts = (ctypes.c_char_p * len(headers))(*[t.encode() for t in headers.values()])
    program = ctypes.c_void_p()
    source = (sources / f"{name}.cu").read_bytes()
    lib.nvrtcCreateProgram(ctypes.byref(program), source, f"{name}.cu".encode(), len(headers),
                           texts, names)
    options = [f"--gpu-architecture={arch.replace('sm_', 'compute_')}", "-std=c++17",
               "-default-device", f"-I{RUNTIME_INCLUDE_12}", "--pre-include=minisgl_nvrtc_launch.h"]
    try:
        result = lib.nvrtcCompileProgram(program, len(options),
                                         (ctypes.c_char_p * len(options))(*[o.encode() for o in options]))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        if result != 0:
            raise CompileError(f"NVRTC {nvrtc_version()} ({lib.nvrtcGetErrorString(result).decode()}) "
                               f"on {name}.cu for {arch}:\n{log.value.decode()[-3000:]}")
        lib.nvrtcGetPTXSize(program, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(program, ptx)
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def entries(ptx: str) -> list[str]:
    """The kernels (.entry) a PTX module defines, by their mangled names."""
    return re.findall(r"^\.(?:visible|weak) \.entry (\w+)\(", ptx, re.M)


def cubin_12(ptx: str, arch: str, output: Path) -> None:
    """ptxas 12.9 turns the PTX into a binary for `arch`."""
    ptx_file = output.with_suffix(".ptx")
    ptx_file.write_text(ptx)
    result = subprocess.run([str(PTXAS_12), f"-arch={arch}", str(ptx_file), "-o", str(output)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"ptxas for {arch} failed:\n{result.stderr[-3000:]}")


if __name__ == "__main__":
    install()
