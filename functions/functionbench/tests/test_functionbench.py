"""Tests for Hearth's FunctionBench functions (functions/functionbench/<name>/).

Each function runs as in a sandbox: its requirements are installed from the wheelhouse with
`pip install --no-index --find-links $HEARTH_WHEELHOUSE --target DIR` (what Hearth's dependency
layers do), and its handler runs in a subprocess of Debian's /usr/bin/python3 (the runtime's
interpreter, not the host's pyenv) with `-I -S -B` and only that directory and the function's
code on sys.path. Each answer is checked for the work it proves (a checksum, a known answer, a
shape, an accuracy), and the run's timings are printed (`pytest -s` shows them): import, first
call, warm calls' median, peak RSS.

The wheelhouse is made by scripts/wheelhouse.sh at setup (the only step that needs PyPI); when it
is missing the tests fail and say so.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FB = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(FB))
RUNTIME_PYTHON = "/usr/bin/python3"
WHEELHOUSE = os.environ.get("HEARTH_WHEELHOUSE", "/var/cache/hearth/wheelhouse")
ILUVATAR = os.path.join(
    os.path.dirname(ROOT), "shared", "traces", "iluvatar-paper-repro", "worker_function_benchmarks.json"
)

with open(os.path.join(FB, "functions.json")) as f:
    MANIFEST = json.load(f)
NAMES = list(MANIFEST)

# Runs inside the runtime's python: imports the handler, calls it once (the cold call), then
# `repeat` more times (warm), and prints one JSON line. Standard library only.
RUNNER = r"""
import json, resource, sys, time
layer, code, args, repeat = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
sys.path[:0] = [p for p in (code, layer) if p]
t0 = time.perf_counter()
try:
    import main
except Exception as e:
    print(json.dumps({"import_error": type(e).__name__ + ": " + str(e)}))
    raise SystemExit(0)
t1 = time.perf_counter()
try:
    first = main.main(args)
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
    raise SystemExit(0)
t2 = time.perf_counter()
warm, result = [], first
for _ in range(repeat):
    s = time.perf_counter()
    result = main.main(args)
    warm.append(time.perf_counter() - s)
print(json.dumps({
    "first": first, "result": result, "import_s": t1 - t0, "first_s": t2 - t1, "warm_s": warm,
    "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}, allow_nan=False))
"""


def wheelhouse() -> str:
    if not os.path.isdir(WHEELHOUSE) or not any(n.endswith(".whl") for n in os.listdir(WHEELHOUSE)):
        pytest.fail(
            f"no wheelhouse at {WHEELHOUSE} (HEARTH_WHEELHOUSE): run scripts/wheelhouse.sh "
            "(setup does) to fetch the FunctionBench functions' wheels"
        )
    return WHEELHOUSE


@pytest.fixture(scope="session")
def layers(tmp_path_factory):
    """name -> a directory with that function's requirements installed (None: stdlib only).
    Installed once per session; functions with the same requirements share one directory."""
    if not os.path.exists(RUNTIME_PYTHON):
        pytest.fail(f"{RUNTIME_PYTHON} (Debian's python3, the runtime's interpreter) is missing")
    done = {}

    def get(name):
        req = os.path.join(FB, name, "requirements.txt")
        if not os.path.exists(req):
            return None
        with open(req, "rb") as f:
            key = hashlib.sha256(f.read()).hexdigest()[:16]
        if key not in done:
            target = tmp_path_factory.mktemp("layer-" + key)
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "--no-index", "--find-links", wheelhouse(), "--target", str(target), "-r", req],
                capture_output=True, text=True, timeout=600,
            )
            assert proc.returncode == 0, f"{name}: pip install from the wheelhouse failed:\n{proc.stderr[-2000:]}"
            done[key] = str(target)
        return done[key]

    yield get
    for d in done.values():  # up to 600 MB; pytest would keep the last three sessions' copies
        shutil.rmtree(d, ignore_errors=True)


def run(layers, tmp_path, name, args=None, repeat=5):
    """Runs functions/functionbench/NAME's handler as the runtime would; returns the runner's JSON."""
    layer = layers(name)
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "HOME": str(tmp_path),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [RUNTIME_PYTHON, "-I", "-S", "-B", "-c", RUNNER, layer or "", os.path.join(FB, name),
         json.dumps(MANIFEST[name]["args"] if args is None else args), str(repeat)],
        capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, f"{name} crashed:\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "import_error" not in out, f"{name}: {out['import_error']}\n{proc.stderr[-2000:]}"
    if out.get("warm_s"):
        warm = sorted(out["warm_s"])
        print(
            f"\nfb-timing {name:<25} import {out['import_s'] * 1e3:8.1f} ms  first {out['first_s'] * 1e3:8.1f} ms  "
            f"warm p50 {warm[len(warm) // 2] * 1e3:8.1f} ms  max rss {out['maxrss_kb'] / 1024:6.1f} MiB"
        )
    # No function may leave files behind in /tmp but its own cached inputs.
    left = [n for n in os.listdir(tmp_path) if not n.startswith("hearth-fb-image-") and not n.startswith("hearth-fb-video-")]
    assert left == [], f"{name} left files in /tmp: {left}"
    return out


def ok(out):
    """The handler's answer, which must be the same on the cold and every warm call (but for its
    timings): a function that keeps state between calls must not change its answer."""
    assert "error" not in out, f"handler failed: {out}"
    strip = lambda d: {k: v for k, v in d.items() if not k.endswith("_s") and k != "gflops"}
    assert strip(out["first"]) == strip(out["result"]), (out["first"], out["result"])
    return out["result"]


# ---------------------------------------------------------------------------------------------
# The set of functions and their files


def test_every_iluvatar_function_is_here():
    expected = {
        "hello", "float_operation", "json_dumps_loads", "gzip_compression", "pyaes", "chameleon",
        "dd", "lin_pack", "image_processing", "video_processing", "model_training",
        "cnn_image_classification",
    }
    assert set(NAMES) == expected
    if os.path.exists(ILUVATAR):
        with open(ILUVATAR) as f:
            assert set(json.load(f)["data"]) == expected
    dirs = {d for d in os.listdir(FB) if os.path.isfile(os.path.join(FB, d, "main.py"))}
    assert dirs == expected


@pytest.mark.parametrize("name", NAMES)
def test_layout_and_pins(name):
    d = os.path.join(FB, name)
    with open(os.path.join(d, "main.py")) as f:
        src = f.read()
    assert src.startswith('"""'), "main.py starts with a docstring saying what it does"
    assert re.search(r"^def main\(args: dict\) -> dict:", src, re.M)
    spec = MANIFEST[name]
    assert 64 <= spec["memory_mb"] <= 1024 and isinstance(spec["args"], dict)
    req = os.path.join(d, "requirements.txt")
    if os.path.exists(req):
        with open(req) as f:
            lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        assert lines and all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][A-Za-z0-9.]*", l) for l in lines), lines
    for root, _, files in os.walk(d):
        for n in files:
            assert os.path.getsize(os.path.join(root, n)) < 300 * 1024, f"{n} is too big to ship"


# ---------------------------------------------------------------------------------------------
# Each function, run as the runtime runs it


def test_hello(layers, tmp_path):
    r = ok(run(layers, tmp_path, "hello"))
    assert r == {"greeting": "Hello, FunctionBench!"}
    bad = run(layers, tmp_path, "hello", {"name": "x" * 300}, repeat=0)
    assert bad["error"] == "ValueError"


def test_float_operation(layers, tmp_path):
    import math

    r = ok(run(layers, tmp_path, "float_operation", {"n": 1000}))
    want = sum(math.sin(float(i)) + math.cos(float(i)) + math.sqrt(float(i)) for i in range(1000))
    assert r["n"] == 1000 and r["result"] == pytest.approx(want, rel=1e-12)
    ok(run(layers, tmp_path, "float_operation"))
    for bad in ({"n": -1}, {"n": 10**9}, {"n": "5"}, {"n": True}):
        assert run(layers, tmp_path, "float_operation", bad, repeat=0)["error"] == "ValueError"


def test_json_dumps_loads(layers, tmp_path):
    a = ok(run(layers, tmp_path, "json_dumps_loads", {"n": 50, "k": 1}, repeat=0))
    b = ok(run(layers, tmp_path, "json_dumps_loads", {"n": 50, "k": 7}, repeat=0))
    assert a["sha256"] == b["sha256"] and a["bytes"] == b["bytes"] > 50 * 100  # lossless round trip
    r = ok(run(layers, tmp_path, "json_dumps_loads"))
    assert r["n"] == 2000 and r["bytes"] > 200_000 and re.fullmatch(r"[0-9a-f]{64}", r["sha256"])
    assert run(layers, tmp_path, "json_dumps_loads", {"n": 10**7}, repeat=0)["error"] == "ValueError"


def test_gzip_compression(layers, tmp_path):
    r = ok(run(layers, tmp_path, "gzip_compression"))
    assert r["bytes"] == 2048 * 1024
    assert 0.05 < r["ratio"] < 0.5  # text-like data compresses, but not to nothing
    small = ok(run(layers, tmp_path, "gzip_compression", {"kb": 4}, repeat=0))
    assert small["bytes"] == 4096 and small["sha256"] != r["sha256"]
    assert run(layers, tmp_path, "gzip_compression", {"kb": 10**6}, repeat=0)["error"] == "ValueError"


def test_pyaes_known_answer(layers, tmp_path):
    r = ok(run(layers, tmp_path, "pyaes"))
    # NIST SP 800-38A F.5.1 CTR-AES128.Encrypt, block #1: keystream = ciphertext XOR plaintext.
    pt = bytes.fromhex("6bc1bee22e409f96e93d7e117393172a")
    ct = bytes.fromhex("874d6191b620e3261bef6864990db6ce")
    assert r["keystream0"] == bytes(a ^ b for a, b in zip(pt, ct)).hex()
    assert r["n"] == 16384 and re.fullmatch(r"[0-9a-f]{64}", r["sha256"])
    assert run(layers, tmp_path, "pyaes", {"n": 0}, repeat=0)["error"] == "ValueError"


def test_chameleon(layers, tmp_path):
    r = ok(run(layers, tmp_path, "chameleon"))
    assert r["cells"] == 500 * 20 and r["bytes"] > 500 * 20 * 20
    small = ok(run(layers, tmp_path, "chameleon", {"rows": 3, "cols": 2}, repeat=1))
    assert small["cells"] == 6
    assert run(layers, tmp_path, "chameleon", {"rows": 10**6}, repeat=0)["error"] == "ValueError"


def test_dd(layers, tmp_path):
    r = ok(run(layers, tmp_path, "dd"))
    total = 4096 * 4096
    assert r["written"] == r["read"] == total
    block = (bytes(range(256)) * 16)[:4096]
    assert r["sha256"] == hashlib.sha256(block * 4096).hexdigest()
    assert run(layers, tmp_path, "dd", {"bs": 1 << 20, "count": 64}, repeat=0)["error"] == "ValueError"


def test_lin_pack(layers, tmp_path):
    r = ok(run(layers, tmp_path, "lin_pack"))
    assert r["n"] == 500
    assert r["normalized_residual"] < 16  # LINPACK's pass criterion
    assert r["max_error"] < 1e-8 and r["gflops"] > 0
    assert run(layers, tmp_path, "lin_pack", {"n": 100_000}, repeat=0)["error"] == "ValueError"


def test_image_processing(layers, tmp_path):
    r = ok(run(layers, tmp_path, "image_processing"))
    ops = r["ops"]
    assert set(ops) == {"flip_lr", "flip_tb", "rotate_90", "rotate_180", "rotate_270", "blur",
                        "contour", "sharpen", "gray", "resize_half"}
    assert ops["rotate_90"]["size"] == ops["rotate_270"]["size"] == [480, 640]
    assert ops["flip_lr"]["size"] == ops["rotate_180"]["size"] == [640, 480]
    assert ops["resize_half"]["size"] == [320, 240] and ops["gray"]["mode"] == "L"
    assert all(o["jpeg_bytes"] > 1000 for o in ops.values())
    assert r["flip_is_involution"] is True and 20 < r["gray_mean"] < 235
    other = ok(run(layers, tmp_path, "image_processing", {"width": 100, "height": 60}, repeat=0))
    assert other["ops"]["rotate_90"]["size"] == [60, 100] and other["gray_sha256"] != r["gray_sha256"]
    assert run(layers, tmp_path, "image_processing", {"width": 10**5}, repeat=0)["error"] == "ValueError"


def test_video_processing(layers, tmp_path):
    r = ok(run(layers, tmp_path, "video_processing"))
    assert r["frames_read"] == r["frames_written"] == 60
    assert r["size"] == [320, 240] and r["output_bytes"] > 10_000 and 10 < r["mean_gray"] < 245
    small = ok(run(layers, tmp_path, "video_processing", {"frames": 5, "width": 64, "height": 48}, repeat=0))
    assert small["frames_read"] == small["frames_written"] == 5
    assert run(layers, tmp_path, "video_processing", {"frames": 10**6}, repeat=0)["error"] == "ValueError"


def test_model_training(layers, tmp_path):
    r = ok(run(layers, tmp_path, "model_training", repeat=3))
    assert r["docs"] == 5000 and r["accuracy"] >= 0.9
    assert r["features"] > 100 and r["model_bytes"] > 10_000
    assert run(layers, tmp_path, "model_training", {"docs": 1}, repeat=0)["error"] == "ValueError"


def test_cnn_image_classification(layers, tmp_path):
    r = ok(run(layers, tmp_path, "cnn_image_classification"))
    assert r["images"] == 64 and r["accuracy"] >= 0.9
    assert sum(r["predicted"].values()) == 64 and min(r["predicted"].values()) >= 8
    other = ok(run(layers, tmp_path, "cnn_image_classification", {"images": 128, "seed": 99}, repeat=0))
    assert other["accuracy"] >= 0.9
    assert run(layers, tmp_path, "cnn_image_classification", {"images": 0}, repeat=0)["error"] == "ValueError"


def test_cnn_model_is_what_make_model_makes(layers, tmp_path):
    """model.npz is committed; make_model.py, run again, makes the same weights."""
    d = os.path.join(FB, "cnn_image_classification")
    out = tmp_path / "model.npz"
    make = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    proc = subprocess.run(
        [RUNTIME_PYTHON, "-I", "-S", "-B", "-c", make, layers("cnn_image_classification"),
         os.path.join(d, "make_model.py"), str(out)],
        capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    compare = (
        "import sys; sys.path.insert(0, sys.argv[1]); import numpy as np\n"
        "a, b = np.load(sys.argv[2]), np.load(sys.argv[3])\n"
        "assert sorted(a.files) == sorted(b.files), (a.files, b.files)\n"
        "for k in a.files:\n"
        "    assert a[k].shape == b[k].shape and np.allclose(a[k], b[k], rtol=1e-4, atol=1e-5), k\n"
        "print('same')\n"
    )
    proc = subprocess.run(
        [RUNTIME_PYTHON, "-I", "-S", "-B", "-c", compare, layers("cnn_image_classification"),
         os.path.join(d, "model.npz"), str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stderr[-2000:]
