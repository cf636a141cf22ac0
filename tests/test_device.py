"""utils.device: device choice, the CPU no-op stream/event/pinning, and CPU thread sizing."""

from __future__ import annotations

import io
import os

import pytest
import torch

from conftest import reference_cpu_threads, sysfs_physical_cores
from minisgl.utils import device as device_module
from minisgl.utils import (NullEvent, NullStream, configure_threads, create_event,
                           create_stream, current_stream, physical_core_count, pick_device,
                           pin, synchronize, usable_cpu_count, use_stream)

CHAPTER = 6  # tools/steps.py check runs this module on chapter 6's own tree

CPU = torch.device("cpu")


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def fake_files(monkeypatch, files: dict[str, str]) -> None:
    """Make `open` inside utils.device read `files` instead of the real ones (OSError for any
    other path), without touching the library: the module's global name shadows the builtin."""

    def fake_open(path, *args, **kwargs):
        if str(path) not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[str(path)])

    monkeypatch.setattr(device_module, "open", fake_open, raising=False)


# --- pick_device ---------------------------------------------------------------------------------

def test_pick_device_defaults_to_cpu_without_cuda(no_cuda):
    assert pick_device() == CPU


def test_pick_device_accepts_cpu():
    assert pick_device("cpu") == CPU


def test_pick_device_rejects_mps():
    with pytest.raises(ValueError, match="'mps'"):
        pick_device("mps")


def test_pick_device_rejects_cuda_when_unavailable(no_cuda):
    with pytest.raises(ValueError, match="'cuda'.*not available"):
        pick_device("cuda")


# --- no-op stand-ins on the CPU ----------------------------------------------------------------

def test_create_stream_and_event_on_cpu_are_null_objects():
    assert isinstance(create_stream(CPU), NullStream)
    assert isinstance(create_event(CPU), NullEvent)


def test_null_event_is_always_complete():
    event = NullEvent()
    assert event.record(NullStream()) is None and event.record() is None
    assert event.synchronize() is None
    assert event.query() is True


def test_null_stream_waits_for_nothing():
    assert NullStream().wait_stream(NullStream()) is None


def test_current_stream_and_synchronize_on_cpu_have_nothing_to_wait_for():
    assert isinstance(current_stream(CPU), NullStream)
    assert synchronize(CPU) is None


def test_use_stream_is_a_no_op_context_on_cpu():
    x = torch.ones(3)
    with use_stream(NullStream()) as entered:
        y = x * 2
    assert entered is None and y.tolist() == [2.0, 2.0, 2.0]


def test_pin_returns_the_same_tensor_on_cpu():
    x = torch.arange(4)
    assert pin(x, CPU) is x


# --- CPU threads ---------------------------------------------------------------------------------

def test_configure_threads_respects_omp_num_threads(monkeypatch, restore_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(device_module, "physical_core_count", lambda: 64)
    monkeypatch.setattr(device_module, "usable_cpu_count", lambda: 64)
    torch.set_num_threads(1)
    assert configure_threads(CPU) == 1 and torch.get_num_threads() == 1


def test_configure_threads_uses_physical_cores_capped_by_usable(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(device_module, "physical_core_count", lambda: 8)
    monkeypatch.setattr(device_module, "usable_cpu_count", lambda: 3)
    assert configure_threads(CPU) == 3 and torch.get_num_threads() == 3
    monkeypatch.setattr(device_module, "usable_cpu_count", lambda: 16)
    assert configure_threads(CPU) == 8


def test_a_gpu_process_keeps_one_host_thread_unless_told(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert configure_threads(torch.device("cuda")) == 1 and torch.get_num_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert configure_threads(torch.device("cuda")) == 2


def test_configure_threads_splits_cores_among_tp_ranks(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(device_module, "physical_core_count", lambda: 6)
    monkeypatch.setattr(device_module, "usable_cpu_count", lambda: 6)
    assert configure_threads(CPU, tp_size=2) == 3
    assert configure_threads(CPU, tp_size=8) == 1  # never zero


def test_configure_threads_on_this_machine(monkeypatch, restore_threads):
    expected = reference_cpu_threads()  # sysfs, affinity and quota: not the helpers under test
    if expected is None:
        pytest.skip("no CPU topology in /sys to compare with")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert configure_threads(CPU) == expected == torch.get_num_threads()


FAKE_CPUINFO = "\n\n".join(
    f"processor\t: {cpu}\nphysical id\t: {socket}\ncore id\t\t: {core}\nflags\t\t: fpu"
    for cpu, (socket, core) in enumerate(
        # 2 sockets x 3 cores x 2 hyper-threads = 12 logical CPUs, 6 physical cores.
        [(s, c) for s in (0, 1) for c in (0, 1, 2)] * 2))


def test_physical_core_count_counts_socket_core_pairs(monkeypatch):
    fake_files(monkeypatch, {"/proc/cpuinfo": FAKE_CPUINFO})
    assert physical_core_count() == 6


def test_physical_core_count_falls_back_to_logical_cpus_without_core_ids(monkeypatch):
    fake_files(monkeypatch, {"/proc/cpuinfo": "processor\t: 0\nprocessor\t: 1\n"})
    assert physical_core_count() == (os.cpu_count() or 1)


def test_physical_core_count_falls_back_when_cpuinfo_is_unreadable(monkeypatch):
    fake_files(monkeypatch, {})
    assert physical_core_count() == (os.cpu_count() or 1)


def test_physical_core_count_on_this_machine_is_within_bounds():
    assert 1 <= physical_core_count() <= (os.cpu_count() or 1)


def test_physical_core_count_on_this_machine_equals_the_sysfs_topology():
    with open("/proc/cpuinfo") as f:
        if "core id" not in f.read():
            pytest.skip("/proc/cpuinfo names no cores here: the library counts logical CPUs")
    cores = sysfs_physical_cores()
    if cores is None:
        pytest.skip("no CPU topology in /sys to compare with")
    assert physical_core_count() == cores


def test_usable_cpu_count_is_capped_by_cgroup_quota(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    fake_files(monkeypatch, {"/sys/fs/cgroup/cpu.max": "250000 100000\n"})
    assert usable_cpu_count() == 2


def test_usable_cpu_count_without_quota_is_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    fake_files(monkeypatch, {"/sys/fs/cgroup/cpu.max": "max 100000\n"})
    assert usable_cpu_count() == 3
