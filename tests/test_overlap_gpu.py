"""Overlap scheduling on a real GPU: the host runs one step ahead of the device, so every read
of device state must be ordered after the write it depends on. A slow forward (an artificial
delay on the engine's stream) must not change a single token. Skipped without CUDA."""

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.engine import Engine
from minisgl.scheduler import Scheduler, SchedulerConfig

CHAPTER = 11  # tools/steps.py check runs this module on chapter 11's own tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = [[1000 + 7 * i + j for j in range(5 + 3 * i)] for i in range(6)]


def run(path, overlap: bool, delay_cycles: int, monkeypatch) -> dict[int, list[int]]:
    scheduler = Scheduler(SchedulerConfig(str(path), max_running_req=4, page_size=4,
                                          num_page_override=256, max_seq_len_override=128,
                                          device="cuda", overlap=overlap))
    real_forward = Engine.forward_batch

    def slow_forward(engine, batch, args):
        output = real_forward(engine, batch, args)
        with torch.cuda.stream(engine.stream):
            torch.cuda._sleep(delay_cycles)  # the device is still busy when the host moves on
        return output

    monkeypatch.setattr(Engine, "forward_batch", slow_forward)
    outputs: dict[int, list[int]] = {uid: [] for uid in range(len(PROMPTS))}
    for uid, ids in enumerate(PROMPTS):
        scheduler.add_request(uid, ids, SamplingParams(max_tokens=6 + uid, ignore_eos=True))
    while scheduler.has_work:
        for result in scheduler.step():
            outputs[result.uid].append(result.token)
    monkeypatch.undo()
    return outputs


@pytest.mark.parametrize("delay_cycles", [2_000_000, 50_000_000])
def test_a_slow_device_does_not_change_overlapped_outputs(tiny_llama_path, delay_cycles,
                                                          monkeypatch):
    expected = run(tiny_llama_path, overlap=False, delay_cycles=0, monkeypatch=monkeypatch)
    assert run(tiny_llama_path, overlap=True, delay_cycles=delay_cycles,
               monkeypatch=monkeypatch) == expected
    assert run(tiny_llama_path, overlap=False, delay_cycles=delay_cycles,
               monkeypatch=monkeypatch) == expected
