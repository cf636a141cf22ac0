"""Chapter 12: every message round-trips through msgpack and through real ZMQ sockets."""

import os
import subprocess
import sys

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, BatchMsg, DetokenizeMsg, ExitMsg, TokenizeMsg, UserMsg,
                             UserReply, decode, encode)
from minisgl.message.codec import TYPE_KEY
from minisgl.utils.zmq_queue import (PubQueue, PullQueue, PushQueue, SubQueue, ipc_address,
                                     new_run_id)

CHAPTER = 12  # tools/steps.py check runs this module on chapter 12's own tree

PARAMS = SamplingParams(temperature=0.5, top_k=3, top_p=0.8, max_tokens=9, ignore_eos=True)
EXAMPLES = [
    TokenizeMsg(1, "多字节 ✓ text", PARAMS),
    TokenizeMsg(2, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                SamplingParams()),
    UserMsg(3, torch.tensor([1, 2, 3], dtype=torch.int32), PARAMS),
    DetokenizeMsg(4, 123, True),
    UserReply(5, "é", False),
    AbortMsg(6),
    ExitMsg(),
    BatchMsg([AbortMsg(7), BatchMsg([DetokenizeMsg(8, 1, False)])]),
]


def same(a, b) -> bool:
    return type(a) is type(b) and encode(a) == encode(b)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_decodes_to_the_same_type_and_content(message):
    assert same(decode(encode(message)), message)


def test_a_tensor_keeps_dtype_shape_and_values():
    for tensor in [torch.arange(5, dtype=torch.int32), torch.arange(6.0).reshape(2, 3),
                   torch.tensor([], dtype=torch.int64)]:
        back = decode(encode(UserMsg(0, tensor, PARAMS))).input_ids
        assert back.dtype == tensor.dtype and torch.equal(back, tensor)


def test_decoded_tensors_are_writable_copies():
    back = decode(encode(UserMsg(0, torch.arange(3, dtype=torch.int32), PARAMS))).input_ids
    back[0] = 42  # would raise if it aliased the immutable receive buffer
    assert back.tolist() == [42, 1, 2]


def test_sampling_params_are_validated_again_on_decode():
    raw = encode(TokenizeMsg(1, "x", PARAMS)).replace(b"\xcb?\xe0\x00\x00\x00\x00\x00\x00",
                                                      b"\xcb\xbf\xf0\x00\x00\x00\x00\x00\x00")
    with pytest.raises(ValueError, match="temperature"):  # 0.5 became -1.0 on the wire
        decode(raw)


def test_unknown_wire_type_is_rejected():
    import msgpack
    with pytest.raises(TypeError, match="unknown message type 'Evil'"):
        decode(msgpack.packb({TYPE_KEY: "Evil", "x": 1}))


def test_encoding_a_non_message_dataclass_fails():
    from dataclasses import dataclass

    @dataclass
    class NotAMessage:
        x: int

    with pytest.raises(TypeError, match="NotAMessage"):
        encode(NotAMessage(1))


def test_run_ids_and_addresses_are_unique():
    a, b = new_run_id(), new_run_id()
    assert a != b and ipc_address(a, "x") != ipc_address(b, "x")


def test_push_pull_round_trip_through_another_process():
    run_id = new_run_id()
    there, back = ipc_address(run_id, "there"), ipc_address(run_id, "back")
    out = PushQueue(there, bind=True, encode=encode)
    inbox = PullQueue(back, bind=True, decode=decode)
    echo = subprocess.Popen([sys.executable, "-c", (
        "import sys\n"
        "from minisgl.message import ExitMsg, decode, encode\n"
        "from minisgl.utils.zmq_queue import PullQueue, PushQueue\n"
        "i = PullQueue(sys.argv[1], bind=False, decode=decode)\n"
        "o = PushQueue(sys.argv[2], bind=False, encode=encode)\n"
        "while not isinstance(m := i.get(), ExitMsg):\n    o.put(m)\n"), there, back])
    try:
        for message in EXAMPLES[:-2]:
            out.put(message)
        received = [inbox.get(timeout_ms=30_000) for _ in EXAMPLES[:-2]]
        out.put(ExitMsg())
        assert echo.wait(timeout=30) == 0
        assert all(same(a, b) for a, b in zip(received, EXAMPLES[:-2]))
    finally:
        echo.kill()
        out.close()
        inbox.close()


def test_get_returns_none_after_the_timeout():
    inbox = PullQueue(ipc_address(new_run_id(), "quiet"), bind=True, decode=decode)
    try:
        assert inbox.get(timeout_ms=50) is None
    finally:
        inbox.close()


def test_close_removes_the_socket_file_only_on_the_binding_side():
    address = ipc_address(new_run_id(), "file")
    path = address.removeprefix("ipc://")
    inbox = PullQueue(address, bind=True, decode=decode)
    out = PushQueue(address, bind=False, encode=encode)
    assert os.path.exists(path)
    out.close()
    assert os.path.exists(path)  # the connecting side has no file of its own
    inbox.close()
    assert not os.path.exists(path)


def test_put_raw_forwards_bytes_unchanged_to_every_subscriber():
    address = ipc_address(new_run_id(), "bcast")
    pub = PubQueue(address, bind=True, encode=encode)
    subs = [SubQueue(address, bind=False, decode=decode) for _ in range(2)]
    try:
        probe = encode(AbortMsg(-1))
        for sub in subs:  # wait until each subscription has reached the publisher
            while True:
                pub.put_raw(probe)
                if sub.get_raw(timeout_ms=50) is not None:
                    break
        for sub in subs:  # drop probes still in flight
            while sub.get_raw(timeout_ms=50) is not None:
                pass
        raw = encode(EXAMPLES[2])
        pub.put_raw(raw)
        assert [sub.get_raw(timeout_ms=5_000) for sub in subs] == [raw, raw]
    finally:
        for q in (pub, *subs):
            q.close()


# --- the chapter's example ---

import ast  # noqa: E402
import re  # noqa: E402
import struct  # noqa: E402

import msgpack  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_shows_the_wire_format_and_a_push_pull_round_trip():
    out = run_example("ch12_message.py")
    lines = out.splitlines()
    size = int(re.match(r"(\d+) 字节；msgpack 解开后是：", lines[0]).group(1))
    wire = ast.literal_eval(lines[1])
    # A tagged map: the class name, the fields, the tensor as dtype + shape + raw little-endian
    # bytes, the nested dataclass tagged too.
    assert wire["__type__"] == "UserMsg" and wire["uid"] == 3
    assert wire["input_ids"] == {"__tensor__": "int32", "shape": [3],
                                 "data": struct.pack("<3i", 504, 3575, 282)}
    assert wire["sampling_params"]["__type__"] == "SamplingParams"
    assert wire["sampling_params"]["max_tokens"] == 8
    assert len(msgpack.packb(wire)) == size  # what it printed is all there is on the wire
    assert re.search(r"^decode 回来： UserMsg\(uid=3, input_ids=tensor\(\[ *504, +3575, +282\], "
                     r"dtype=torch\.int32\), sampling_params=SamplingParams\(.*max_tokens=8",
                     out, re.M)
    received = re.search(r"^经 ipc://\S+ 收到： (.*)$", out, re.M).group(1)
    assert received.startswith("BatchMsg(")
    assert re.findall(r"DetokenizeMsg\(uid=(\d+), next_token=(\d+), finished=(\w+)",
                      received) == [("3", "7042", "False"), ("3", "30", "True")]
    assert "再等 100 毫秒没有新消息： None" in out
