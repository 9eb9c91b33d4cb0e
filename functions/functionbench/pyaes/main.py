"""pyaes (FunctionBench): AES-128 in CTR mode with the pyaes library (pure Python) over a
generated message of args["n"] bytes (default 16384, at most 1 MiB), args["k"] times (default 1,
at most 100), then decrypts and checks the round trip. Key and initial counter are NIST SP 800-38A
F.5.1's, so `keystream0` (the first 16 bytes of ciphertext XOR plaintext) is a known answer."""

import hashlib
import time

import pyaes

KEY = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
COUNTER0 = int("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff", 16)


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def message(n: int) -> bytes:
    """n deterministic bytes: a SHA-256 chain."""
    out, block = bytearray(), b"hearth-functionbench-pyaes"
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


def main(args: dict) -> dict:
    n = _int(args, "n", 16384, 1, 1 << 20)
    k = _int(args, "k", 1, 1, 100)
    t0 = time.perf_counter()
    plain = message(n)
    cipher = b""
    for _ in range(k):
        enc = pyaes.AESModeOfOperationCTR(KEY, pyaes.Counter(initial_value=COUNTER0))
        cipher = enc.encrypt(plain)
    dec = pyaes.AESModeOfOperationCTR(KEY, pyaes.Counter(initial_value=COUNTER0))
    if dec.decrypt(cipher) != plain:
        raise RuntimeError("AES-CTR round trip changed the message")
    ks = bytes(a ^ b for a, b in zip(cipher[:16], plain[:16]))
    return {
        "n": n,
        "k": k,
        "keystream0": ks.hex(),
        "sha256": hashlib.sha256(cipher).hexdigest(),
        "latency_s": time.perf_counter() - t0,
    }
