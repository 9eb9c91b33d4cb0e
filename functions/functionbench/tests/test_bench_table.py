"""Tests for bench/functionbench.py's offline parts: Ilúvatar's medians, the combined table from
saved results, and a clear failure when no Hearth answers."""

import json
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "bench", "functionbench.py")


def bench(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def iluvatar_file(tmp_path):
    data = {
        "hello": {
            "warm_results_sec": [0.001, 0.003, 0.002],
            "warm_over_results_us": [2000.0, 4000.0, 3000.0],
            "cold_results_sec": [0.004, 0.006],
            "cold_over_results_us": [1_000_000.0, 2_000_000.0],
        },
        "lin_pack": {
            "warm_results_sec": [0.5],
            "warm_over_results_us": [5000.0],
            "cold_results_sec": [0.7],
            "cold_over_results_us": [3_000_000.0],
        },
    }
    p = tmp_path / "ilu.json"
    p.write_text(json.dumps({"data": data}))
    return str(p)


def test_iluvatar_medians(tmp_path):
    p = bench("iluvatar", "--json", iluvatar_file(tmp_path))
    assert p.returncode == 0, p.stderr
    rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]] for l in p.stdout.splitlines()[2:]}
    assert rows["hello"] == ["2.000", "3.00", "5.000", "1500"]
    assert rows["lin_pack"] == ["500.000", "5.00", "700.000", "3000"]


def test_iluvatar_real_file_has_every_function():
    p = bench("iluvatar")
    if not os.path.exists(os.path.join(os.path.dirname(ROOT), "shared", "traces", "iluvatar-paper-repro")):
        assert p.returncode == 2 and "cannot read" in p.stderr
        return
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 2 + 12


def test_combined_table_and_ratios(tmp_path):
    sample = lambda exec_, init, over, client, path=None: {
        "exec": exec_, "init": init, "overhead": over, "queue": 0, "client": client, "cold": init > 0, "path": path,
    }
    results = {
        "url": "http://127.0.0.1:7878", "n": 3, "cpus": 2,
        "functions": {
            "hello": {
                "memory_mb": 128,
                "warm": [sample(10, 0, 50, 210), sample(20, 0, 60, 320), sample(30, 0, 70, 430)],
                "cold": [sample(10, 5000, 100, 5210, "generic"), sample(10, 7000, 100, 7410, "fresh"),
                         {"error": "HTTP 502"}],
            },
            "lin_pack": {"memory_mb": 256, "warm": [], "cold": [], "register_error": "layer build failed"},
        },
    }
    f = tmp_path / "res.json"
    f.write_text(json.dumps(results))
    p = bench("table", str(f), "--json", iluvatar_file(tmp_path))
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("| hello") or l.startswith("| lin_pack")]
    hello = [c.strip() for c in rows[0].split("|")[1:-1]]
    # warm: exec p50 20 µs, overhead 60, client − exec 300 µs vs Ilúvatar's 3000 µs → 0.1
    assert hello[1:7] == ["128", "0.02", "60", "300", "3000", "0.100"]
    # cold: init p50 6 ms, overhead 100, client − exec 6.3 ms vs 1500 ms → 0.0042
    assert hello[7:12] == ["6.0", "100", "6.3", "1500", "0.0042"]
    assert hello[12] == "fresh generic" and "errors: warm 0, cold 1" in hello[0]
    assert "layer build failed" in rows[1] and "| – |" in rows[1]
    # hello's cold starts had an error, lin_pack has no samples: neither meets a target.
    assert "cold overhead ≤ 1 % of Ilúvatar's: 0/2 functions (none measured)" in p.stdout
    assert "warm overhead p50 ≤ 0.5 ms: 1/2 (worst hello 60 µs)" in p.stdout


def test_run_without_hearth_fails_clearly():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    p = bench("run", "--n", "1", "--url", f"http://127.0.0.1:{port}", "--hearth", sys.executable)
    assert p.returncode == 2
    assert f"no Hearth at http://127.0.0.1:{port}" in p.stderr and "Traceback" not in p.stderr
    bad = bench("run", "--n", "0", "--hearth", sys.executable)
    assert bad.returncode == 2 and "N must be" in bad.stderr


def test_error_text_is_one_bounded_markdown_safe_line():
    import importlib.util

    spec = importlib.util.spec_from_file_location("functionbench_bench", SCRIPT)
    fb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fb)
    doc = {"error": {"code": "init_error", "message": "x failed: ModuleNotFoundError | y\n" + "z" * 500}}
    t = fb.error_text(doc)
    assert t.startswith(" init_error: x failed: ModuleNotFoundError / y z")
    assert "|" not in t and "\n" not in t and len(t) <= 121
    assert fb.error_text({"error": "busy"}) == " busy"
    assert fb.error_text({}) == fb.error_text([]) == fb.error_text({"error": 5}) == ""
