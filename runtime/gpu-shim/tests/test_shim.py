"""Tests for the CUDA interposition shim, against a mock driver (no GPU needed).

Each scenario runs in a subprocess with LD_PRELOAD=shim: a Python script that loads the mock
driver into the global scope (as a program linked against libcuda would have it) and calls the
driver API through the global symbols, so the shim's definitions are the ones reached. The
scenarios of the CUDA runtime's path instead open the driver without RTLD_GLOBAL (ctypes does
dlopen, then dlsym on that handle, as libcudart does) and reach it through cuGetProcAddress.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shimbuild  # noqa: E402

MAX_REGIONS = 65536
CTX = 0x1000

PRELUDE = r'''
import ctypes, json, os, sys, threading
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_ulonglong, c_void_p
if os.environ.get("MOCK"):
    mode = ctypes.RTLD_LOCAL if os.environ.get("MOCK_LOCAL") else ctypes.RTLD_GLOBAL
    drv = ctypes.CDLL(os.environ["MOCK"], mode=mode)
    drv.mock_cuda_fail.argtypes = [ctypes.c_char_p, c_int]
    drv.mock_cuda_entry.argtypes = [ctypes.c_char_p]
    drv.mock_cuda_entry.restype = c_void_p
    drv.mock_cuda_dlsym_self.argtypes = [ctypes.c_char_p]
    drv.mock_cuda_dlsym_self.restype = c_void_p
g = ctypes.CDLL(None)
SHIM = hasattr(g, "hearth_shim_prefetch")
def fn(name, res, *args):
    f = getattr(g, name, None)  # absent: a driver kept out of the global scope, no shim
    if f is not None:
        f.restype = res; f.argtypes = list(args)
    return f
alloc = fn("cuMemAlloc_v2", c_int, POINTER(c_ulonglong), c_size_t)
alloc_v1 = fn("cuMemAlloc", c_int, POINTER(c_uint), c_uint)
managed = fn("cuMemAllocManaged", c_int, POINTER(c_ulonglong), c_size_t, c_uint)
free = fn("cuMemFree_v2", c_int, c_ulonglong)
def A(n):
    p = c_ulonglong(0); rc = alloc(byref(p), n); return rc, p.value
def M(n, flags):
    p = c_ulonglong(0); rc = managed(byref(p), n, flags); return rc, p.value
if hasattr(g, "hearth_shim_prefetch"):
    prefetch = fn("hearth_shim_prefetch", c_int, c_int)
    swap_out = fn("hearth_shim_swap_out", c_int)
    resident = fn("hearth_shim_resident_bytes", c_ulonglong)
    regions = fn("hearth_shim_regions", c_int)
    unmanaged = fn("hearth_shim_unmanaged_allocs", c_ulonglong)
    def state():
        return {"resident": resident(), "regions": regions(), "unmanaged": unmanaged()}
else:
    def state():
        return None
# The CUDA runtime's path: entry points as the driver's cuGetProcAddress(_v2) hands them out.
GET_PROC_V2 = ctypes.CFUNCTYPE(c_int, ctypes.c_char_p, POINTER(c_void_p), c_int, c_ulonglong,
                               POINTER(c_int))
GET_PROC = ctypes.CFUNCTYPE(c_int, ctypes.c_char_p, POINTER(c_void_p), c_int, c_ulonglong)
ALLOC = ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_size_t)
ALLOC_V1 = ctypes.CFUNCTYPE(c_int, POINTER(c_uint), c_uint)
MANAGED = ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_size_t, c_uint)
FREE = ctypes.CFUNCTYPE(c_int, c_ulonglong)
def addr(lib, name):
    """What dlsym(lib's handle, name) answers (through the shim's dlsym when preloaded)."""
    return ctypes.cast(getattr(lib, name), c_void_p).value
def mock(name):
    """The mock driver's own function exported as `name`."""
    return drv.mock_cuda_entry(name.encode())
def shim(name):
    """The shim's definition of `name` (it is first in the global scope), None without it."""
    return addr(g, name) if SHIM else None
def proc(get_proc, symbol, version, v2=True):
    """(rc, pointer, status) of a cuGetProcAddress(_v2) lookup."""
    p = c_void_p(0); st = c_int(-1)
    args = (symbol.encode(), byref(p), version, 0) + ((byref(st),) if v2 else ())
    return get_proc(*args), p.value, st.value
out = {}
'''


@pytest.fixture(scope="module")
def built():
    tmp = tempfile.mkdtemp(prefix="hshim-")
    b, why = shimbuild.build(tmp)
    if b is None:
        pytest.skip(why)
    yield b
    subprocess.run(["rm", "-rf", tmp])


@pytest.fixture
def run(built, tmp_path):
    """run(script, shim=True, mock=True, log=True) -> (out dict, log records)."""

    def go(script, shim=True, mock=True, log=True, local=False):
        log_path = tmp_path / "cuda.log"
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HEARTH_MOCK_CUDA_LOG")}
        if shim:
            env["LD_PRELOAD"] = built.shim
        if mock:
            env["MOCK"] = built.mock
        if local:
            env["MOCK_LOCAL"] = "1"
        env["OTHER"] = built.other
        if log:
            env["HEARTH_MOCK_CUDA_LOG"] = str(log_path)
        code = PRELUDE + script + "\nprint(json.dumps(out))\n"
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1]), read_log(log_path)

    return go


def read_log(path):
    """The mock's log as dicts: {"call": name, key: value, ...} (numbers parsed)."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for line in f:
            name, *fields = line.split()
            rec = {"call": name}
            for field in fields:
                k, _, v = field.partition("=")
                rec[k] = v if k in ("ctx", "stream", "symbol") else int(v, 0)
            records.append(rec)
    return records


def calls(log, name):
    return [r for r in log if r["call"] == name]


# ---------------------------------------------------------------------------------------------
# allocation


def test_without_shim_cumemalloc_reaches_the_driver_unchanged(run):
    # The control for the next test: the harness really does reach the mock's cuMemAlloc_v2.
    out, log = run("g.cuCtxSetCurrent(c_void_p(%d))\nout['a'] = A(4096)" % CTX, shim=False)
    assert out["a"][0] == 0
    assert [r["call"] for r in log if r["call"] != "cuCtxSetCurrent"] == ["cuMemAlloc_v2"]


def test_cumemalloc_becomes_managed_allocation_of_the_same_size(run):
    out, log = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\nout['a'] = A(4096)\nout['b'] = A(12345)\nout['s'] = state()" % CTX
    )
    assert out["a"][0] == 0 and out["b"][0] == 0
    assert calls(log, "cuMemAlloc_v2") == []
    got = calls(log, "cuMemAllocManaged")
    assert [(r["size"], r["flags"]) for r in got] == [(4096, 1), (12345, 1)]  # CU_MEM_ATTACH_GLOBAL
    # The program holds exactly the pointers the driver handed out.
    assert [r["ptr"] for r in got] == [out["a"][1], out["b"][1]]
    assert out["s"] == {"resident": 4096 + 12345, "regions": 2, "unmanaged": 0}


def test_program_managed_allocations_are_forwarded_and_recorded(run):
    out, log = run("g.cuCtxSetCurrent(c_void_p(%d))\nout['m'] = M(777, 2)\nout['s'] = state()" % CTX)
    assert out["m"][0] == 0
    assert [(r["size"], r["flags"]) for r in calls(log, "cuMemAllocManaged")] == [(777, 2)]
    assert out["s"]["regions"] == 1 and out["s"]["resident"] == 777


def test_free_forwards_and_removes_the_record(run):
    out, log = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "ps = [A(n)[1] for n in (100, 200, 300)]\n"
        "out['ps'] = ps\n"
        "out['rc'] = free(ps[1])\n"
        "out['s'] = state()\n"
        "out['rc2'] = free(ps[0]); out['rc3'] = free(ps[2])\n"
        "out['s2'] = state()\n" % CTX
    )
    assert out["rc"] == 0
    assert [r["ptr"] for r in calls(log, "cuMemFree_v2")] == [out["ps"][1], out["ps"][0], out["ps"][2]]
    assert out["s"]["regions"] == 2 and out["s"]["resident"] == 400
    assert out["s2"]["regions"] == 0 and out["s2"]["resident"] == 0


def test_free_refused_by_the_driver_keeps_the_record(run):
    out, _ = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "p = A(64)[1]\n"
        "drv.mock_cuda_fail(b'cuMemFree_v2', 1)\n"
        "out['rc'] = free(p)\n"
        "out['s'] = state()\n" % CTX
    )
    assert out["rc"] == 1
    assert out["s"]["regions"] == 1 and out["s"]["resident"] == 64


def test_legacy_cumemalloc_is_forwarded_unmanaged(run):
    # Its ABI returns a 32-bit pointer, which a unified-memory pointer does not fit in.
    out, log = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "p = c_uint(0)\nout['rc'] = alloc_v1(byref(p), 512)\nout['p'] = p.value\nout['s'] = state()\n" % CTX
    )
    assert out["rc"] == 0 and out["p"] == calls(log, "cuMemAlloc")[0]["ptr"]
    assert calls(log, "cuMemAllocManaged") == []
    assert out["s"] == {"resident": 0, "regions": 0, "unmanaged": 1}


# ---------------------------------------------------------------------------------------------
# the CUDA runtime's path: dlopen without RTLD_GLOBAL, dlsym(cuGetProcAddress_v2), lookups by name

V12 = 12000  # a CUDA 12 runtime's version
RUNTIME_ALLOC = (
    "g2 = GET_PROC_V2(addr(drv, 'cuGetProcAddress_v2'))\n"
    "out['gpa_is_shim'] = addr(drv, 'cuGetProcAddress_v2') == shim('cuGetProcAddress_v2')\n"
    "drv.cuCtxSetCurrent(c_void_p(%d))\n"
    "rc, p, st = proc(g2, 'cuMemAlloc', %d)\n"
    "out['lookup'] = [rc, st]\n"
    "out['alloc_is_shim'] = p == shim('cuMemAlloc_v2')\n"
    "d = c_ulonglong(0)\n"
    "out['a'] = [ALLOC(p)(byref(d), 4096), d.value]\n"
    "out['s'] = state()\n" % (CTX, V12)
)


def test_runtime_style_cumemalloc_lookup_reaches_the_driver_without_shim(run):
    # The control: through cuGetProcAddress_v2 the program gets the driver's cuMemAlloc_v2.
    out, log = run(RUNTIME_ALLOC, shim=False, local=True)
    assert out["lookup"] == [0, 0] and out["a"][0] == 0
    assert [r["size"] for r in calls(log, "cuMemAlloc_v2")] == [4096]
    assert calls(log, "cuMemAllocManaged") == []


def test_runtime_style_cumemalloc_lookup_is_managed_and_recorded(run):
    out, log = run(RUNTIME_ALLOC, local=True)
    # dlsym on the driver's own handle gave the shim's cuGetProcAddress_v2, which forwarded.
    assert out["gpa_is_shim"] is True
    assert [(r["symbol"], r["version"]) for r in calls(log, "cuGetProcAddress_v2")] == [("cuMemAlloc", V12)]
    assert out["lookup"] == [0, 0] and out["alloc_is_shim"] is True
    assert calls(log, "cuMemAlloc_v2") == []
    got = calls(log, "cuMemAllocManaged")
    assert [(r["size"], r["flags"], r["ptr"]) for r in got] == [(4096, 1, out["a"][1])]
    assert out["a"][0] == 0
    assert out["s"] == {"resident": 4096, "regions": 1, "unmanaged": 0}


def test_runtime_style_cumemfree_lookup_forgets_the_region(run):
    out, log = run(
        RUNTIME_ALLOC
        + "rc, f, st = proc(g2, 'cuMemFree', %d)\n"
        "out['free_is_shim'] = f == shim('cuMemFree_v2')\n"
        "out['f'] = FREE(f)(d.value)\n"
        "out['s2'] = state()\n" % V12,
        local=True,
    )
    assert out["free_is_shim"] is True and out["f"] == 0
    assert [r["ptr"] for r in calls(log, "cuMemFree_v2")] == [out["a"][1]]
    assert out["s"]["regions"] == 1 and out["s2"] == {"resident": 0, "regions": 0, "unmanaged": 0}


def test_runtime_style_managed_lookup_keeps_the_program_flags(run):
    out, log = run(
        "g2 = GET_PROC_V2(addr(drv, 'cuGetProcAddress_v2'))\n"
        "drv.cuCtxSetCurrent(c_void_p(%d))\n"
        "rc, p, st = proc(g2, 'cuMemAllocManaged', %d)\n"
        "out['is_shim'] = p == shim('cuMemAllocManaged')\n"
        "d = c_ulonglong(0)\n"
        "out['m'] = MANAGED(p)(byref(d), 777, 2)\n"
        "out['s'] = state()\n" % (CTX, V12),
        local=True,
    )
    assert out["is_shim"] is True and out["m"] == 0
    assert [(r["size"], r["flags"]) for r in calls(log, "cuMemAllocManaged")] == [(777, 2)]
    assert out["s"]["regions"] == 1 and out["s"]["resident"] == 777


def test_a_program_like_the_cuda_runtime_is_interposed(built, tmp_path):
    # A C program that dlopen()s libcuda.so.1 with RTLD_LOCAL and resolves everything through
    # the cuGetProcAddress_v2 it dlsym()ed from that handle.
    log_path = tmp_path / "cuda.log"
    env = {**os.environ, "HEARTH_MOCK_CUDA_LOG": str(log_path)}
    env.pop("LD_PRELOAD", None)
    plain = subprocess.run([built.runtime_prog, str(V12)], env=env, capture_output=True, text=True,
                           check=True)
    assert "shim=absent" in plain.stdout
    assert [r["size"] for r in calls(read_log(log_path), "cuMemAlloc_v2")] == [1 << 20, 3000]
    log_path.unlink()
    env["LD_PRELOAD"] = built.shim
    proc = subprocess.run([built.runtime_prog, str(V12)], env=env, capture_output=True, text=True,
                          check=True)
    assert "alloc_a=0" in proc.stdout and "free_a=0" in proc.stdout
    assert "shim=present regions=1 resident=3000" in proc.stdout
    log = read_log(log_path)
    assert calls(log, "cuMemAlloc_v2") == []
    assert [r["size"] for r in calls(log, "cuMemAllocManaged")] == [1 << 20, 3000]
    assert len(calls(log, "cuMemFree_v2")) == 1


def test_legacy_version_lookups_get_the_drivers_32_bit_calls(run):
    # Below CUDA 3.2, "cuMemAlloc"/"cuMemFree" name the 32-bit ABI: a UVM pointer does not fit.
    out, log = run(
        "g2 = GET_PROC_V2(addr(drv, 'cuGetProcAddress_v2'))\n"
        "drv.cuCtxSetCurrent(c_void_p(%d))\n"
        "rc, p, st = proc(g2, 'cuMemAlloc', 3000)\n"
        "out['alloc'] = [rc, p == mock('cuMemAlloc')]\n"
        "rc, f, st = proc(g2, 'cuMemFree', 3000)\n"
        "out['free'] = [rc, f == mock('cuMemFree')]\n"
        "v = c_uint(0)\n"
        "out['a'] = ALLOC_V1(p)(byref(v), 512)\n"
        "out['s'] = state()\n"
        "out['v2_is_shim'] = proc(g2, 'cuMemAlloc', 3020)[1] == shim('cuMemAlloc_v2')\n" % CTX,
        local=True,
    )
    assert out["alloc"] == [0, True] and out["free"] == [0, True]
    assert out["a"] == 0 and [r["size"] for r in calls(log, "cuMemAlloc")] == [512]
    assert calls(log, "cuMemAllocManaged") == []
    assert out["s"]["regions"] == 0
    assert out["v2_is_shim"] is True  # from 3.2 on it is the _v2 call, and wrapped


def test_other_and_unknown_symbols_pass_through_untouched(run):
    out, log = run(
        "g2 = GET_PROC_V2(addr(drv, 'cuGetProcAddress_v2'))\n"
        "out['gpa_is_shim'] = addr(drv, 'cuGetProcAddress_v2') == shim('cuGetProcAddress_v2')\n"
        "rc, p, st = proc(g2, 'cuCtxSynchronize', %d)\n"
        "out['sync'] = [rc, st, p == mock('cuCtxSynchronize')]\n"
        "out['unknown'] = list(proc(g2, 'cuNoSuchCall', %d))\n"
        "out['too_old'] = list(proc(g2, 'cuMemAllocManaged', 5000))\n"
        # other names looked up on the driver's handle are not redirected by the shim's dlsym
        "out['direct'] = addr(drv, 'cuMemAlloc_v2') == mock('cuMemAlloc_v2')\n" % (V12, V12),
        local=True,
    )
    assert out["gpa_is_shim"] is True
    assert out["sync"] == [0, 0, True]
    # CUDA 12: a symbol the driver lacks is a success with a NULL pointer and a status.
    assert out["unknown"] == [0, None, 1]  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    assert out["too_old"] == [0, None, 2]  # CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
    assert out["direct"] is True
    assert [r["symbol"] for r in calls(log, "cuGetProcAddress_v2")] == [
        "cuCtxSynchronize", "cuNoSuchCall", "cuMemAllocManaged"]


def test_driver_errors_from_get_proc_address_pass_through(run):
    out, log = run(
        "g2 = GET_PROC_V2(addr(drv, 'cuGetProcAddress_v2'))\n"
        "g1 = GET_PROC(addr(drv, 'cuGetProcAddress'))\n"
        "out['newer'] = proc(g2, 'cuMemAlloc', 13000)[0]\n"  # beyond the driver's version
        "out['v1_unknown'] = list(proc(g1, 'cuNoSuchCall', 11040, v2=False))[:2]\n"
        "drv.mock_cuda_fail(b'cuGetProcAddress_v2', 999)\n"
        "rc, p, st = proc(g2, 'cuMemAlloc', %d)\n"
        # the mock still wrote its pointer: the shim must not have replaced it after an error
        "out['forced'] = [rc, p == mock('cuMemAlloc_v2')]\n" % V12,
        local=True,
    )
    assert out["newer"] == 1  # CUDA_ERROR_INVALID_VALUE
    assert out["v1_unknown"] == [500, None]  # CUDA_ERROR_NOT_FOUND, the 11.x answer
    assert out["forced"] == [999, True]
    assert len(calls(log, "cuGetProcAddress_v2")) == 2 and len(calls(log, "cuGetProcAddress")) == 1


def test_cuda_11_get_proc_address_is_interposed_too(run):
    out, log = run(
        "g1 = GET_PROC(addr(drv, 'cuGetProcAddress'))\n"
        "out['gpa_is_shim'] = addr(drv, 'cuGetProcAddress') == shim('cuGetProcAddress')\n"
        "drv.cuCtxSetCurrent(c_void_p(%d))\n"
        "rc, p, st = proc(g1, 'cuMemAlloc', 11040, v2=False)\n"
        "d = c_ulonglong(0)\n"
        "out['a'] = [rc, ALLOC(p)(byref(d), 8192)]\n"
        "out['s'] = state()\n" % CTX,
        local=True,
    )
    assert out["gpa_is_shim"] is True and out["a"] == [0, 0]
    assert [r["symbol"] for r in calls(log, "cuGetProcAddress")] == ["cuMemAlloc"]
    assert [r["size"] for r in calls(log, "cuMemAllocManaged")] == [8192]
    assert out["s"]["regions"] == 1


def test_get_proc_address_looked_up_through_itself_stays_interposed(run):
    # "cuGetProcAddress" is the _v2 ABI from CUDA 12.0 on, the 11.3 one before.
    out, log = run(
        "g2 = GET_PROC_V2(addr(drv, 'cuGetProcAddress_v2'))\n"
        "drv.cuCtxSetCurrent(c_void_p(%d))\n"
        "rc2, p2, st = proc(g2, 'cuGetProcAddress', %d)\n"
        "rc1, p1, st = proc(g2, 'cuGetProcAddress', 11030)\n"
        "out['v2'] = [rc2, p2 == shim('cuGetProcAddress_v2')]\n"
        "out['v1'] = [rc1, p1 == shim('cuGetProcAddress')]\n"
        "rc, p, st = proc(GET_PROC(p1), 'cuMemAlloc', 11030, v2=False)\n"
        "d = c_ulonglong(0)\n"
        "out['a'] = [rc, ALLOC(p)(byref(d), 64)]\n"
        "out['s'] = state()\n" % (CTX, V12),
        local=True,
    )
    assert out["v2"] == [0, True] and out["v1"] == [0, True]
    assert [r["symbol"] for r in calls(log, "cuGetProcAddress")] == ["cuMemAlloc"]
    assert [r["size"] for r in calls(log, "cuMemAllocManaged")] == [64]
    assert out["s"]["regions"] == 1


def test_dlsym_is_redirected_only_for_the_driver_looked_up_from_outside_it(run):
    out, _ = run(
        "other = ctypes.CDLL(os.environ['OTHER'], mode=ctypes.RTLD_LOCAL)\n"
        "other.mock_cuda_entry.argtypes = [ctypes.c_char_p]\n"
        "other.mock_cuda_entry.restype = c_void_p\n"
        # the same functions in a library that is not libcuda are not the driver's
        "out['other'] = addr(other, 'cuGetProcAddress_v2') == other.mock_cuda_entry(b'cuGetProcAddress_v2')\n"
        # a lookup made by the driver itself (wiring itself up) gets its own function
        "out['self'] = drv.mock_cuda_dlsym_self(b'cuGetProcAddress_v2') == mock('cuGetProcAddress_v2')\n"
        "out['outside'] = addr(drv, 'cuGetProcAddress_v2') == shim('cuGetProcAddress_v2')\n",
        local=True,
    )
    assert out == {"other": True, "self": True, "outside": True}


def test_rtld_next_lookups_keep_their_callers_place(built):
    # The shim's dlsym must not become the caller: a library preloaded after it asking for
    # RTLD_NEXT gets the definition after itself, not the one after the shim (its own).
    script = ("import ctypes; f = ctypes.CDLL(None).probe_next_value; "
              "print(f())")
    probes = ":".join(built.probes)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    results = []
    for preload in (probes, built.shim + ":" + probes):
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", script],
                              env={**env, "LD_PRELOAD": preload}, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        results.append(int(proc.stdout.strip()))
    assert results == [2, 2]


# ---------------------------------------------------------------------------------------------
# prefetch and swap out


def test_prefetch_moves_every_live_region_to_the_device_then_synchronizes(run):
    out, log = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "ps = [A(n)[1] for n in (4096, 8192, 100)]\n"
        "free(ps[1])\n"
        "out['live'] = [ps[0], ps[2]]\n"
        "out['rc'] = prefetch(0)\n" % CTX
    )
    assert out["rc"] == 0
    moved = calls(log, "cuMemPrefetchAsync")
    assert sorted((r["ptr"], r["size"]) for r in moved) == sorted(zip(out["live"], [4096, 100]))
    assert {r["device"] for r in moved} == {0}
    assert log[-1]["call"] == "cuCtxSynchronize"  # the moves are done when it answers


def test_prefetch_to_another_device_and_swap_out_to_the_host(run):
    out, log = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "A(4096); A(4096)\n"
        "out['p1'] = prefetch(1)\n"
        "out['so'] = swap_out()\n"
        "out['s'] = state()\n" % CTX
    )
    assert out["p1"] == 0 and out["so"] == 0
    devices = [r["device"] for r in calls(log, "cuMemPrefetchAsync")]
    assert devices == [1, 1, -1, -1]  # CU_DEVICE_CPU for the swap
    assert len(calls(log, "cuCtxSynchronize")) == 2
    assert out["s"]["regions"] == 2  # moving memory does not forget it


def test_prefetch_with_nothing_recorded_does_not_touch_the_driver(run):
    out, log = run("out['rc'] = prefetch(0); out['so'] = swap_out()")
    assert out == {"rc": 0, "so": 0}
    assert log == []


def test_prefetch_rejects_a_device_below_cpu(run):
    out, log = run("g.cuCtxSetCurrent(c_void_p(%d))\nA(64)\nout['rc'] = prefetch(-2)" % CTX)
    assert out["rc"] == 1  # CUDA_ERROR_INVALID_VALUE
    assert calls(log, "cuMemPrefetchAsync") == []


def test_prefetch_from_a_thread_without_context_borrows_the_owner_context(run):
    out, log = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "A(4096)\n"
        "res = {}\n"
        "t = threading.Thread(target=lambda: res.update(rc=prefetch(0)))\n"
        "t.start(); t.join()\n"
        "out['rc'] = res['rc']\n" % CTX
    )
    assert out["rc"] == 0
    tail = [r for r in log if r["call"] != "cuMemAllocManaged"][1:]  # after the main thread's set
    assert [r["call"] for r in tail] == ["cuCtxSetCurrent", "cuMemPrefetchAsync", "cuCtxSynchronize",
                                        "cuCtxSetCurrent"]
    assert int(tail[0]["ctx"], 16) == CTX and int(tail[1]["ctx"], 16) == CTX
    assert tail[3]["ctx"] == "(nil)"  # the thread is left as it was found


# ---------------------------------------------------------------------------------------------
# errors and limits


def test_driver_errors_pass_through(run):
    out, log = run(
        "out['noctx'] = A(64)[0]\n"  # the real driver's answer without a context
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "drv.mock_cuda_fail(b'cuMemAllocManaged', 2)\n"
        "out['oom'] = A(64)[0]\n"
        "out['s0'] = state()\n"
        "drv.mock_cuda_fail(b'cuMemAllocManaged', 0)\n"
        "A(64); A(64)\n"
        "drv.mock_cuda_fail(b'cuMemPrefetchAsync', 700)\n"
        "out['pf'] = prefetch(0)\n"
        "drv.mock_cuda_fail(b'cuMemPrefetchAsync', 0)\n"
        "drv.mock_cuda_fail(b'cuCtxSynchronize', 999)\n"
        "out['sync'] = swap_out()\n" % CTX
    )
    assert out["noctx"] == 201  # CUDA_ERROR_INVALID_CONTEXT
    assert out["oom"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert out["s0"]["regions"] == 0  # a failed allocation is not recorded
    assert out["pf"] == 700
    # A failing move does not stop the others, and what was issued is waited for.
    assert len([r for r in calls(log, "cuMemPrefetchAsync") if r["device"] == 0]) == 2
    assert out["sync"] == 999


def test_no_driver_loaded_returns_an_error_instead_of_crashing(run):
    out, _ = run(
        "out['a'] = A(64)[0]\nout['f'] = free(0x1234)\nout['pf'] = prefetch(0)\nout['s'] = state()",
        mock=False,
    )
    assert out["a"] == 3 and out["f"] == 3  # CUDA_ERROR_NOT_INITIALIZED
    assert out["pf"] == 0  # nothing recorded, nothing to move
    assert out["s"]["regions"] == 0


def test_a_driver_opened_without_rtld_global_is_still_found(run):
    # Kept out of the global scope, the driver is invisible to RTLD_NEXT; the shim looks in it.
    out, log = run("drv.cuCtxSetCurrent(c_void_p(%d))\nout['a'] = A(4096)\nout['s'] = state()" % CTX,
                   local=True)
    assert out["a"][0] == 0
    assert [r["size"] for r in calls(log, "cuMemAllocManaged")] == [4096]
    assert out["s"]["regions"] == 1


def test_region_cap_holds_and_every_recorded_region_stays_findable(run):
    out, _ = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "drv.mock_cuda_scatter(1)\n"  # colliding hashes: probe chains to keep intact
        "ps = []\n"
        "for _ in range(%d + 5):\n"
        "    rc, p = A(1)\n"
        "    assert rc == 0\n"
        "    ps.append(p)\n"
        "out['full'] = state()\n"
        "import random\n"
        "random.seed(7)\n"
        "random.shuffle(ps)\n"  # frees in random order exercise the table's deletion
        "for p in ps: assert free(p) == 0\n"
        "out['empty'] = state()\n"
        "out['again'] = A(10)[0]\n"
        "out['after'] = state()\n" % (CTX, MAX_REGIONS),
        log=False,
    )
    assert out["full"] == {"resident": MAX_REGIONS, "regions": MAX_REGIONS, "unmanaged": 5}
    # Every recorded pointer was found again on free: nothing leaked or was lost in the table.
    assert out["empty"]["regions"] == 0 and out["empty"]["resident"] == 0
    assert out["again"] == 0 and out["after"]["regions"] == 1


def test_concurrent_allocations_and_frees_keep_the_books(run):
    out, _ = run(
        "g.cuCtxSetCurrent(c_void_p(%d))\n"
        "def work(n):\n"
        "    g.cuCtxSetCurrent(c_void_p(%d))\n"
        "    for i in range(2000):\n"
        "        rc, p = A(n)\n"
        "        if i %% 2: free(p)\n"
        "ts = [threading.Thread(target=work, args=(n,)) for n in (1, 10, 100, 1000)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "out['s'] = state()\n" % (CTX, CTX),
        log=False,
    )
    assert out["s"]["regions"] == 4 * 1000
    assert out["s"]["resident"] == 1000 * (1 + 10 + 100 + 1000)


def test_a_program_linked_against_the_driver_is_interposed(built, tmp_path):
    log_path = tmp_path / "cuda.log"
    env = {**os.environ, "HEARTH_MOCK_CUDA_LOG": str(log_path)}
    env.pop("LD_PRELOAD", None)
    plain = subprocess.run([built.prog], env=env, capture_output=True, text=True, check=True)
    assert "shim=absent" in plain.stdout
    assert calls(read_log(log_path), "cuMemAlloc_v2")  # control: the program reaches the mock
    log_path.unlink()
    env["LD_PRELOAD"] = built.shim
    proc = subprocess.run([built.prog], env=env, capture_output=True, text=True, check=True)
    assert "shim=present resident=3000 prefetch=0" in proc.stdout
    log = read_log(log_path)
    assert calls(log, "cuMemAlloc_v2") == []
    assert [r["size"] for r in calls(log, "cuMemAllocManaged")] == [1 << 20, 3000]
    assert [r["size"] for r in calls(log, "cuMemPrefetchAsync")] == [3000]
