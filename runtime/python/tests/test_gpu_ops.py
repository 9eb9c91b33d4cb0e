"""The agent's GPU memory ops (P prefetch, S swap out) and the device-memory field of invoke
answers, with the CUDA shim LD_PRELOADed over a mock driver, and without it."""

import json
import os
import random
import struct
import sys

import pytest

from test_agent import REQ_HDR, RESP_HDR, Client, frame, start_agent, workdir  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "gpu-shim", "tests"))
import shimbuild  # noqa: E402

CTX = 0x1000

# A handler that uses the "driver" the way CUDA code does: through the global symbols.
GPU_HANDLERS = '''
import ctypes, os
from ctypes import byref, c_int, c_size_t, c_ulonglong, c_void_p
drv = ctypes.CDLL(os.environ["MOCK"], mode=ctypes.RTLD_GLOBAL)
drv.mock_cuda_fail.argtypes = [ctypes.c_char_p, c_int]
g = ctypes.CDLL(None)
g.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_ulonglong), c_size_t]
g.cuMemFree_v2.argtypes = [c_ulonglong]
g.cuCtxSetCurrent(c_void_p(%d))
held = []

def main(args):
    for n in args.get("alloc", []):
        p = c_ulonglong(0)
        assert g.cuMemAlloc_v2(byref(p), n) == 0
        held.append(p.value)
    for _ in range(args.get("free", 0)):
        assert g.cuMemFree_v2(held.pop()) == 0
    if "fail" in args:
        drv.mock_cuda_fail(args["fail"][0].encode(), args["fail"][1])
    return {"held": len(held), "pad": "x" * args.get("pad", 0)}

def boom(args):
    main(args)
    raise ValueError("after allocating")
''' % CTX

MEM = struct.Struct(">Q")


class GpuClient(Client):
    def read_full(self):
        """(status, flags, exec_us, device_mem or None, body) of the next response frame."""
        while len(self.buf) < 24:
            self._fill()
        n, status, flags, exec_us, self.last_id = RESP_HDR.unpack(self.buf[:24])
        assert flags & ~3 == 0
        self.buf = self.buf[24:]
        mem = None
        if flags & 2:
            while len(self.buf) < 8:
                self._fill()
            (mem,) = MEM.unpack(self.buf[:8])
            self.buf = self.buf[8:]
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, flags, exec_us, mem, body

    def call(self, op, payload=b""):
        rid = random.getrandbits(64)
        self.send_raw(frame(op, payload, rid))
        answer = self.read_full()
        assert self.last_id == rid  # P, S and invoke answers echo the request id too
        return answer


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    b, why = shimbuild.build(str(tmp_path_factory.mktemp("shim")))
    if b is None:
        pytest.skip(why)
    return b


@pytest.fixture
def gpu_agent(start_agent, built, workdir):
    """Starts an agent with the shim preloaded (or only the mock, preload=False)."""
    log_path = os.path.join(workdir, "cuda.log")

    def start(handler="main.main", preload=True):
        env = {"MOCK": built.mock, "HEARTH_MOCK_CUDA_LOG": log_path,
               "LD_PRELOAD": built.shim if preload else built.mock}
        agent = start_agent(handler=handler, code=GPU_HANDLERS, env=env)
        c = GpuClient(agent.sock_path)
        return agent, c

    def log():
        if not os.path.exists(log_path):
            return []
        with open(log_path) as f:
            return [line.split() for line in f]

    start.log = log
    return start


def prefetches(log):
    return [dict(f.split("=", 1) for f in rec[1:]) for rec in log if rec[0] == "cuMemPrefetchAsync"]


# ---------------------------------------------------------------------------------------------
# without the shim


@pytest.mark.parametrize("env", [None, {"LD_PRELOAD": ""}])
def test_without_shim_prefetch_and_swap_answer_409_noshim(start_agent, env):
    c = start_agent(env=env).client()
    for op, payload in (("P", b'{"device":0}'), ("S", b"")):
        status, exec_us, body = c.request(op, payload)
        assert status == 409 and exec_us is None
        doc = json.loads(body)
        assert doc["type"] == "NoShim" and doc["phase"] == "request"
    assert c.invoke({"a": 1})[0] == 200  # the connection stays usable


def test_without_shim_invoke_answers_have_no_extension(start_agent):
    c = start_agent().client()
    c.send_raw(frame("I", b'{"a":1}'))
    data = b""
    body = b'{"echo":{"a":1}}'
    while len(data) < 24 + len(body):
        data += c.replies.recv(4096)
    n, status, flags, exec_us, rid = RESP_HDR.unpack(data[:24])
    assert (n, status, flags, rid) == (len(body), 200, 1, 0)  # bit 1 never set without the shim
    assert data[24:] == body


def test_another_preloaded_library_is_not_mistaken_for_the_shim(gpu_agent):
    agent, c = gpu_agent(preload=False)
    status, flags, _, mem, body = c.call("I", b'{"alloc":[4096]}')
    assert status == 200 and flags == 1 and mem is None
    assert json.loads(body)["held"] == 1
    assert c.call("S")[0] == 409


# ---------------------------------------------------------------------------------------------
# with the shim


def test_invoke_reports_device_memory_in_the_header_and_leaves_the_body_alone(gpu_agent):
    _, c = gpu_agent()
    status, flags, exec_us, mem, body = c.call("I", b'{"alloc":[4096,8192]}')
    assert status == 200 and flags == 3
    assert mem == 4096 + 8192
    assert body == b'{"held":2,"pad":""}'  # the handler's result, nothing added
    status, flags, _, mem, body = c.call("I", b'{"free":1}')
    assert (status, mem) == (200, 4096)


def test_every_invoke_answer_carries_device_memory_including_errors(gpu_agent):
    _, c = gpu_agent(handler="main.boom")
    status, flags, exec_us, mem, body = c.call("I", b'{"alloc":[100]}')
    assert status == 500 and flags == 3 and mem == 100
    assert json.loads(body)["type"] == "ValueError"
    status, flags, _, mem, _ = c.call("I", b"not json")
    assert status == 400 and flags == 2 and mem == 100


def test_large_result_with_device_memory_is_framed_right(gpu_agent):
    # Above 16 KiB the header and body go out with sendmsg: the longer header must survive it.
    _, c = gpu_agent()
    status, _, _, mem, body = c.call("I", b'{"alloc":[64],"pad":50000}')
    assert status == 200 and mem == 64 and len(json.loads(body)["pad"]) == 50000
    status, _, _, mem, body = c.call("I", b"{}")  # the next frame starts where it should
    assert status == 200 and mem == 64 and body == b'{"held":1,"pad":""}'


def test_prefetch_and_swap_out_move_every_region(gpu_agent):
    _, c = gpu_agent()
    c.call("I", b'{"alloc":[4096,8192,100],"free":1}')
    status, flags, _, mem, body = c.call("P", b'{"device":0}')
    assert status == 200 and flags == 0 and mem is None
    assert json.loads(body) == {"resident_bytes": 4096 + 8192, "regions": 2}
    moved = prefetches(gpu_agent.log())
    assert sorted(int(m["size"]) for m in moved) == [4096, 8192]
    assert {m["device"] for m in moved} == {"0"}
    status, _, _, _, body = c.call("S")
    assert status == 200 and json.loads(body) == {"resident_bytes": 4096 + 8192, "regions": 2}
    assert [m["device"] for m in prefetches(gpu_agent.log())[2:]] == ["-1", "-1"]
    status, _, _, _, _ = c.call("P", b'{"device":3}')
    assert status == 200 and [m["device"] for m in prefetches(gpu_agent.log())[4:]] == ["3", "3"]


@pytest.mark.parametrize(
    "payload",
    [b"", b"not json", b"[0]", b"{}", b'{"device":-1}', b'{"device":true}', b'{"device":1.0}',
     b'{"device":"0"}', b'{"device":2147483648}'],
)
def test_prefetch_rejects_a_bad_device(gpu_agent, payload):
    _, c = gpu_agent()
    c.call("I", b'{"alloc":[64]}')
    status, _, _, _, body = c.call("P", payload)
    assert status == 400 and json.loads(body)["type"] == "BadRequest"
    assert prefetches(gpu_agent.log()) == []
    assert c.call("P", b'{"device":0}')[0] == 200  # the connection stays usable


def test_driver_error_during_prefetch_is_answered_500_cudaerror(gpu_agent):
    _, c = gpu_agent()
    c.call("I", b'{"alloc":[64],"fail":["cuMemPrefetchAsync",700]}')
    status, _, _, _, body = c.call("P", b'{"device":0}')
    doc = json.loads(body)
    assert status == 500 and doc["type"] == "CudaError" and "CUresult 700" in doc["message"]
    status, _, _, _, body = c.call("S")
    assert status == 500 and "swap out" in json.loads(body)["message"]
