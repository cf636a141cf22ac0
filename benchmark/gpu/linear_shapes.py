"""Host time of one eager matrix multiply on the GPU, for a row count seen before and for a new
one each call. A prefill step's token count differs from step to step in a server (requests
arrive one by one), and cuBLAS picks its kernel per shape on the host: does a new shape cost
the host more than a launch? Qwen3-0.6B's four projections, bfloat16; the queue is drained
before each call, so a call never waits for room in it."""

import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024)}


def host_us(rows: list[int], weight: torch.Tensor) -> float:
    inputs = {m: torch.randn(m, weight.shape[1], device="cuda", dtype=weight.dtype) for m in rows}
    spent = 0.0
    for m in rows:
        torch.cuda.synchronize()
        start = time.perf_counter()
        F.linear(inputs[m], weight)
        spent += time.perf_counter() - start
    torch.cuda.synchronize()
    return spent / len(rows) * 1e6


def main() -> None:
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__}")
    print("host µs per F.linear call (bfloat16), 200 calls each")
    print(f"{'projection':10} {'same rows (2900)':>18} {'new rows each call':>20} {'those rows again':>18}")
    for name, (k, n) in SHAPES.items():
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        host_us([2900] * 20, weight)  # warm: the one shape picked once
        same = host_us([2900] * 200, weight)
        fresh = list(range(1000 + n % 7, 1000 + 200 * 7, 7))  # 200 row counts never seen
        new, again = host_us(fresh, weight), host_us(fresh, weight)
        print(f"{name:10} {same:18.1f} {new:20.1f} {again:18.1f}")


if __name__ == "__main__":
    main()
