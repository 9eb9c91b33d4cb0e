"""pyaes (FunctionBench-like): compact pure-Python AES-128 in CTR mode over an args["n"]-byte message
(default 8192); returns the SHA-256 hex digest of the ciphertext."""

import hashlib


def _rotl8(x, s):
    return ((x << s) | (x >> (8 - s))) & 0xFF


def _build_sbox():
    # Walk the multiplicative group with generator 3 (p) and its inverse (q); S(p) = affine(1/p).
    sbox = [0] * 256
    p = q = 1
    while True:
        p = p ^ ((p << 1) & 0xFF) ^ (0x1B if p & 0x80 else 0)
        q ^= q << 1
        q ^= q << 2
        q ^= q << 4
        q &= 0xFF
        if q & 0x80:
            q ^= 0x09
        sbox[p] = q ^ _rotl8(q, 1) ^ _rotl8(q, 2) ^ _rotl8(q, 3) ^ _rotl8(q, 4) ^ 0x63
        if p == 1:
            break
    sbox[0] = 0x63
    return sbox


SBOX = _build_sbox()
MUL2 = [((a << 1) ^ 0x1B) & 0xFF if a & 0x80 else a << 1 for a in range(256)]
# State byte i is row i % 4, column i // 4; ShiftRows takes row r of column c from column c + r.
SHIFT = [(i % 4) + 4 * (((i // 4) + (i % 4)) % 4) for i in range(16)]
RCON = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1B, 0x36]


def expand_key(key: bytes) -> list:
    """AES-128 key expansion: 16-byte key -> 11 round keys of 16 ints each."""
    if len(key) != 16:
        raise ValueError("AES-128 needs a 16-byte key")
    w = list(key)
    for i in range(4, 44):
        t = w[4 * i - 4 : 4 * i]
        if i % 4 == 0:
            t = [SBOX[t[1]] ^ RCON[i // 4 - 1], SBOX[t[2]], SBOX[t[3]], SBOX[t[0]]]
        w.extend(w[4 * i - 16 + j] ^ t[j] for j in range(4))
    return [w[16 * r : 16 * r + 16] for r in range(11)]


def encrypt_block(round_keys: list, block: bytes) -> bytes:
    s = [b ^ k for b, k in zip(block, round_keys[0])]
    sbox, mul2, shift = SBOX, MUL2, SHIFT
    for rnd in range(1, 11):
        t = [sbox[s[shift[i]]] for i in range(16)]
        if rnd < 10:
            m = []
            for c in range(0, 16, 4):
                a0, a1, a2, a3 = t[c], t[c + 1], t[c + 2], t[c + 3]
                x = a0 ^ a1 ^ a2 ^ a3
                m.append(a0 ^ x ^ mul2[a0 ^ a1])
                m.append(a1 ^ x ^ mul2[a1 ^ a2])
                m.append(a2 ^ x ^ mul2[a2 ^ a3])
                m.append(a3 ^ x ^ mul2[a3 ^ a0])
            t = m
        rk = round_keys[rnd]
        s = [t[i] ^ rk[i] for i in range(16)]
    return bytes(s)


def ctr_encrypt(key: bytes, nonce: bytes, data: bytes) -> bytes:
    """CTR mode: counter block = 8-byte nonce || 8-byte big-endian block counter."""
    round_keys = expand_key(key)
    out = bytearray()
    for counter, off in enumerate(range(0, len(data), 16)):
        ks = encrypt_block(round_keys, nonce + counter.to_bytes(8, "big"))
        chunk = data[off : off + 16]
        out += bytes(a ^ b for a, b in zip(chunk, ks))
    return bytes(out)


def main(args: dict) -> dict:
    n = int(args.get("n", 8192))
    key = bytes.fromhex(args.get("key", "000102030405060708090a0b0c0d0e0f"))
    message = (b"The quick brown fox jumps over the lazy dog. " * (n // 45 + 1))[:n]
    ciphertext = ctr_encrypt(key, b"hearth00", message)
    return {"n": n, "sha256": hashlib.sha256(ciphertext).hexdigest()}
