"""Tests for the sample functions under functions/<name>/main.py (imported by path)."""

import importlib.util
import json
import os
import sys
import time

import pytest

sys.dont_write_bytecode = True  # keep functions/ free of __pycache__ (they are sandbox code dirs)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FUNCTIONS = os.path.join(ROOT, "functions")
NAMES = [
    "hello",
    "noop",
    "busy",
    "sleep",
    "alloc",
    "json_dumps_loads",
    "float_operation",
    "zlib_compression",
    "pyaes",
    "matmul",
]


def load(name):
    path = os.path.join(FUNCTIONS, name, "main.py")
    spec = importlib.util.spec_from_file_location("hearth_fn_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", NAMES)
def test_function_has_docstring_and_main(name):
    module = load(name)
    assert module.__doc__ and module.__doc__.strip()
    assert 1 <= len(module.__doc__.strip().splitlines()) <= 3
    assert callable(module.main)


@pytest.mark.parametrize("name", NAMES)
def test_defaults_run_and_serialize(name):
    if name == "sleep":
        args = {"ms": 5}
    elif name == "alloc":
        args = {"mb": 4}
    else:
        args = {}
    result = load(name).main(args)
    assert isinstance(result, dict)
    json.dumps(result, allow_nan=False)  # what the agent sends back


def test_hello():
    main = load("hello").main
    assert main({}) == {"greeting": "Hello, world!"}
    assert main({"name": "Hearth"}) == {"greeting": "Hello, Hearth!"}


def test_noop():
    assert load("noop").main({}) == {}


def test_busy_spins_and_holds_memory():
    main = load("busy").main
    t0 = time.perf_counter()
    r = main({"ms": 15, "mb": 2})
    assert time.perf_counter() - t0 >= 0.015
    assert r["ms"] == 15 and r["mb"] == 2 and r["iterations"] > 0
    r = main({})
    assert r["ms"] == 10 and r["mb"] == 0


def test_busy_cpu_mode_counts_cpu_time_not_wall_time():
    main = load("busy").main
    c0 = time.process_time()
    r = main({"ms": 20, "cpu": True})
    assert time.process_time() - c0 >= 0.02
    assert r["iterations"] > 0
    # The spin reads the CPU clock, never the wall clock: a CPU clock that advances 1 ms per
    # read ends a 5 ms spin after about five reads, whatever the wall clock does.
    module = load("busy")
    ticks = iter(range(1000))
    module.process_time = lambda: next(ticks) / 1000.0

    def no_wall_clock():
        raise AssertionError("cpu mode must not read the wall clock")

    module.perf_counter = no_wall_clock
    assert module.main({"ms": 5, "cpu": True})["iterations"] in (4 * 256, 5 * 256, 6 * 256)


def test_sleep():
    t0 = time.perf_counter()
    assert load("sleep").main({"ms": 10}) == {"slept_ms": 10}
    assert time.perf_counter() - t0 >= 0.01


def test_alloc():
    assert load("alloc").main({"mb": 3}) == {"mb": 3}


def test_json_dumps_loads():
    r = load("json_dumps_loads").main({"n": 10, "k": 3})
    assert r["n"] == 10 and r["k"] == 3 and r["bytes"] > 0


def test_float_operation():
    r = load("float_operation").main({"n": 1000})
    assert r["n"] == 1000 and isinstance(r["result"], float)


def test_zlib_compression():
    r = load("zlib_compression").main({"size": 10000})
    assert r["size"] == 10000 and 0 < r["compressed"] < 10000


def test_matmul_identity_like_trace():
    r = load("matmul").main({"n": 8})
    assert r["n"] == 8 and r["trace"] > 0


def test_aes_fips197_known_answer():
    aes = load("pyaes")
    # FIPS-197 Appendix C.1 (AES-128)
    round_keys = aes.expand_key(bytes.fromhex("000102030405060708090a0b0c0d0e0f"))
    ct = aes.encrypt_block(round_keys, bytes.fromhex("00112233445566778899aabbccddeeff"))
    assert ct.hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"
    # FIPS-197 Appendix A.1: last round key of the key expansion
    round_keys = aes.expand_key(bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c"))
    assert bytes(round_keys[10]).hex() == "d014f9a8c9ee2589e13f0cc8b6630ca6"


def test_aes_ctr_round_trip_and_digest():
    aes = load("pyaes")
    key = bytes(range(16))
    msg = b"hello hearth, this is more than one block long!"
    ct = aes.ctr_encrypt(key, b"nonce123", msg)
    assert len(ct) == len(msg) and ct != msg
    assert aes.ctr_encrypt(key, b"nonce123", ct) == msg  # CTR is its own inverse
    r = aes.main({"n": 100})
    assert r["n"] == 100 and len(r["sha256"]) == 64
    assert aes.main({"n": 100}) == r  # deterministic
