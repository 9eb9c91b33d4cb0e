"""Tests for runtime/python/hearth_agent.py: start the agent as a subprocess, talk raw HTTP/1.1."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

AGENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hearth_agent.py")
DEBIAN_PYTHON = "/usr/bin/python3"

HANDLERS = '''
import time

def main(args):
    return {"echo": args}

def noop(args):
    return {}

def sleepy(args):
    time.sleep(args.get("ms", 20) / 1000)
    return {"slept": True}

def boom(args):
    x = 1
    raise ValueError("kaboom " + str(x))  # the raising line

def unserializable(args):
    return {"s": {1, 2, 3}}

def chatty(args):
    print("to stdout", args)
    import sys
    print("to stderr", file=sys.stderr)
    return {"ok": True}

def exiter(args):
    raise SystemExit(3)

not_callable = 42
'''


class Client:
    """Tiny HTTP/1.1 client over a Unix socket, with a receive buffer (pipelining-safe)."""

    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    @staticmethod
    def build(method, path, body=None, headers=None):
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: agent"]
        if body is not None:
            lines.append("Content-Length: %d" % len(body))
        for k, v in (headers or {}).items():
            lines.append("%s: %s" % (k, v))
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("connection closed by agent")
        self.buf += chunk

    def read_response(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, status, _reason = lines[0].split(" ", 2)
        assert version == "HTTP/1.1"
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers["content-length"])
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return int(status), headers, body

    def request(self, method, path, body=None, headers=None):
        self.send_raw(self.build(method, path, body, headers))
        return self.read_response()

    def invoke(self, args=None, raw=None):
        body = raw if raw is not None else json.dumps(args).encode()
        return self.request("POST", "/invoke", body)


class Agent:
    def __init__(self, proc, sock_path):
        self.proc = proc
        self.sock_path = sock_path

    def client(self):
        return Client(self.sock_path)


def _wait_for_socket(proc, path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("agent exited early: rc=%s stderr=%s" % (proc.returncode, proc.stderr.read()))
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.close()
            return
        except OSError:
            time.sleep(0.01)
    raise TimeoutError("agent did not listen on %s" % path)


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(dir="/tmp", prefix="hagent-")  # short path: AF_UNIX limit is 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def start_agent(workdir):
    procs = []

    def start(handler="main.main", code=HANDLERS, files=None, python=sys.executable, env=None):
        code_dir = os.path.join(workdir, "code")
        os.makedirs(code_dir, exist_ok=True)
        for name, text in ({"main.py": code} if files is None else files).items():
            path = os.path.join(code_dir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))
        sock_path = os.path.join(workdir, "a.sock")
        proc = subprocess.Popen(
            [python, "-I", "-S", AGENT, "--socket", sock_path, "--code-dir", code_dir, "--handler", handler],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        procs.append(proc)
        _wait_for_socket(proc, sock_path)
        return Agent(proc, sock_path)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# ---------------------------------------------------------------------------------------------


def test_health_reports_init_us_and_pid(start_agent):
    agent = start_agent()
    c = agent.client()
    status, headers, body = c.request("GET", "/health")
    assert status == 200
    assert headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["status"] == "ok"
    assert isinstance(doc["init_us"], int) and doc["init_us"] >= 0
    assert doc["pid"] == agent.proc.pid
    assert set(doc) == {"status", "init_us", "pid"}


def test_init_us_measures_slow_import(start_agent):
    agent = start_agent(code="import time\ntime.sleep(0.05)\ndef main(args):\n    return {}\n")
    _, _, body = agent.client().request("GET", "/health")
    assert json.loads(body)["init_us"] >= 50000


def test_invoke_returns_result_and_exec_us(start_agent):
    agent = start_agent()
    status, headers, body = agent.client().invoke({"a": 1, "b": [1, 2, "x"]})
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert int(headers["x-exec-us"]) >= 0
    assert json.loads(body) == {"echo": {"a": 1, "b": [1, 2, "x"]}}
    assert body == b'{"echo":{"a":1,"b":[1,2,"x"]}}'  # compact separators


def test_invoke_accepts_any_json_value(start_agent):
    c = start_agent().client()
    for value in [[1, 2], "s", 3.5, None, True]:
        status, _, body = c.invoke(value)
        assert status == 200
        assert json.loads(body) == {"echo": value}


def test_exec_us_reflects_handler_time(start_agent):
    agent = start_agent(handler="main.sleepy")
    status, headers, body = agent.client().invoke({"ms": 20})
    assert status == 200
    assert int(headers["x-exec-us"]) >= 20000
    assert json.loads(body) == {"slept": True}


def test_empty_body_means_empty_object(start_agent):
    c = start_agent().client()
    status, _, body = c.invoke(raw=b"")
    assert status == 200 and json.loads(body) == {"echo": {}}
    # no Content-Length at all: also an empty body
    c.send_raw(b"POST /invoke HTTP/1.1\r\nHost: a\r\n\r\n")
    status, _, body = c.read_response()
    assert status == 200 and json.loads(body) == {"echo": {}}


def test_many_requests_on_one_connection(start_agent):
    c = start_agent().client()
    for i in range(500):
        status, _, body = c.invoke({"i": i})
        assert status == 200
        assert json.loads(body) == {"echo": {"i": i}}
    status, _, _ = c.request("GET", "/health")
    assert status == 200


def test_new_connection_after_close(start_agent):
    agent = start_agent()
    for i in range(5):
        c = agent.client()
        status, _, body = c.invoke({"conn": i})
        assert status == 200 and json.loads(body) == {"echo": {"conn": i}}
        c.close()


def test_connection_close_header(start_agent):
    agent = start_agent()
    c = agent.client()
    status, headers, _ = c.request("GET", "/health", headers={"Connection": "close"})
    assert status == 200
    assert headers["connection"] == "close"
    assert c.sock.recv(10) == b""  # agent closed its end
    c.close()
    # and it accepts the next connection
    assert agent.client().request("GET", "/health")[0] == 200


def test_handler_exception(start_agent):
    agent = start_agent(handler="main.boom")
    c = agent.client()
    status, headers, body = c.invoke({})
    assert status == 500
    assert "x-exec-us" in headers
    err = json.loads(body)
    assert err["type"] == "ValueError"
    assert err["message"] == "kaboom 1"
    assert err["phase"] == "exec"
    assert 'raise ValueError("kaboom " + str(x))' in err["traceback"]
    assert "ValueError: kaboom 1" in err["traceback"]
    assert len(err["traceback"].splitlines()) <= 8
    # the agent keeps serving on the same connection
    assert c.request("GET", "/health")[0] == 200


def test_handler_system_exit_does_not_kill_agent(start_agent):
    agent = start_agent(handler="main.exiter")
    c = agent.client()
    status, _, body = c.invoke({})
    assert status == 500
    assert json.loads(body)["type"] == "SystemExit"
    assert c.request("GET", "/health")[0] == 200
    assert agent.proc.poll() is None


def test_non_serializable_result(start_agent):
    c = start_agent(handler="main.unserializable").client()
    status, headers, body = c.invoke({})
    assert status == 500
    assert "x-exec-us" in headers
    err = json.loads(body)
    assert err["type"] == "TypeError"
    assert err["phase"] == "result"
    assert err["message"].startswith("handler result is not JSON-serializable: ")
    assert "set" in err["message"]


def test_malformed_json_is_400(start_agent):
    c = start_agent().client()
    status, _, body = c.invoke(raw=b'{"a": ')
    assert status == 400
    err = json.loads(body)
    assert err["type"] == "BadRequest"
    assert err["phase"] == "request"
    assert err["message"].startswith("arguments are not valid JSON: ")
    status, _, body = c.invoke(raw=b"\xff\xfe\x00garbage")
    assert status == 400
    # connection still usable
    assert c.invoke({"ok": 1})[0] == 200


def test_unknown_path_404_and_wrong_method_405(start_agent):
    c = start_agent().client()
    status, _, body = c.request("GET", "/nope")
    assert status == 404
    err = json.loads(body)
    assert err["phase"] == "request" and "/nope" in err["message"]
    status, headers, body = c.request("GET", "/invoke")
    assert status == 405 and headers["allow"] == "POST"
    assert json.loads(body)["phase"] == "request"
    status, headers, _ = c.request("POST", "/health", b"{}")
    assert status == 405 and headers["allow"] == "GET"
    assert c.request("GET", "/health")[0] == 200


def test_chunked_body_rejected(start_agent):
    c = start_agent().client()
    c.send_raw(b"POST /invoke HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    status, headers, body = c.read_response()
    assert status == 400
    assert json.loads(body)["phase"] == "request"


@pytest.mark.parametrize(
    "files,handler,err_type",
    [
        ({"main.py": "def main(args):\n    return {\n"}, "main.main", "SyntaxError"),
        ({"main.py": "def main(args):\n    return {}\n"}, "main.missing", "AttributeError"),
        ({"main.py": "def main(args):\n    return {}\n"}, "nomodule.main", "ModuleNotFoundError"),
        ({"main.py": "import does_not_exist_xyz\n"}, "main.main", "ModuleNotFoundError"),
        ({"main.py": "raise RuntimeError('init blew up')\n"}, "main.main", "RuntimeError"),
        ({"main.py": HANDLERS}, "main.not_callable", "TypeError"),
        ({"main.py": HANDLERS}, "main", "ValueError"),
    ],
)
def test_init_errors_reported_on_health_and_invoke(start_agent, files, handler, err_type):
    agent = start_agent(handler=handler, files=files)
    c = agent.client()
    status, _, body = c.request("GET", "/health")
    assert status == 500
    err = json.loads(body)
    assert err["type"] == err_type
    assert err["phase"] == "init"
    assert err["message"]
    assert "traceback" in err
    status, _, body = c.invoke({})
    assert status == 500
    assert json.loads(body) == err
    assert c.request("GET", "/nope")[0] == 404


def test_dotted_module_handler(start_agent):
    files = {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/mod.py": "def func(args):\n    return {'where': __name__}\n",
    }
    c = start_agent(handler="pkg.sub.mod.func", files=files).client()
    status, _, body = c.invoke({})
    assert status == 200 and json.loads(body) == {"where": "pkg.sub.mod"}


def test_large_body_round_trips(start_agent):
    c = start_agent().client()
    payload = {"blob": "x" * (1 << 20) + "end", "n": list(range(1000))}
    status, _, body = c.invoke(payload)
    assert status == 200
    assert json.loads(body) == {"echo": payload}
    assert len(body) > 1 << 20
    assert c.invoke({"after": True})[0] == 200


def test_result_over_the_limit_is_413_and_the_agent_keeps_serving(start_agent):
    c = start_agent(env={"HEARTH_MAX_RESULT_BYTES": "1000"}).client()
    status, headers, body = c.invoke({"blob": "x" * 2000})
    assert status == 413
    err = json.loads(body)
    assert err["type"] == "ResultTooLarge" and err["phase"] == "result"
    assert "over the limit of 1000 bytes" in err["message"]
    assert "x-exec-us" in headers
    status, _, body = c.invoke({"small": 1})
    assert status == 200 and json.loads(body) == {"echo": {"small": 1}}


def test_long_error_messages_are_truncated(start_agent):
    code = HANDLERS + "\ndef loud(args):\n    raise ValueError('y' * 1000000)\n"
    c = start_agent(handler="main.loud", code=code).client()
    status, _, body = c.invoke({})
    assert status == 500
    err = json.loads(body)
    assert len(body) < 64 * 1024 and err["message"].endswith("(truncated)")


def test_request_split_across_sends(start_agent):
    c = start_agent().client()
    raw = Client.build("POST", "/invoke", b'{"split": [1, 2, 3]}')
    # split inside the request line, inside the \r\n\r\n, and inside the body
    cut = [3, 10, len(raw) - 22, len(raw) - 20, len(raw) - 5]
    pieces = [raw[a:b] for a, b in zip([0] + cut, cut + [len(raw)])]
    assert b"".join(pieces) == raw
    for piece in pieces:
        c.send_raw(piece)
        time.sleep(0.01)
    status, _, body = c.read_response()
    assert status == 200 and json.loads(body) == {"echo": {"split": [1, 2, 3]}}
    # byte by byte
    for i in range(len(raw)):
        c.send_raw(raw[i : i + 1])
    status, _, body = c.read_response()
    assert status == 200 and json.loads(body) == {"echo": {"split": [1, 2, 3]}}


def test_pipelined_requests_in_one_send(start_agent):
    c = start_agent().client()
    raw = (
        Client.build("POST", "/invoke", b'{"n": 1}')
        + Client.build("GET", "/health")
        + Client.build("POST", "/invoke", b'{"n": 2}')
    )
    c.send_raw(raw)
    s1, _, b1 = c.read_response()
    s2, _, b2 = c.read_response()
    s3, _, b3 = c.read_response()
    assert (s1, json.loads(b1)) == (200, {"echo": {"n": 1}})
    assert s2 == 200 and json.loads(b2)["status"] == "ok"
    assert (s3, json.loads(b3)) == (200, {"echo": {"n": 2}})


def test_header_names_case_insensitive_and_query_ignored(start_agent):
    c = start_agent().client()
    c.send_raw(b"POST /invoke?x=1 HTTP/1.1\r\ncOnTeNt-LeNgTh: 7\r\n\r\n{\"a\":1}")
    status, _, body = c.read_response()
    assert status == 200 and json.loads(body) == {"echo": {"a": 1}}


def test_handler_output_does_not_break_protocol(start_agent):
    agent = start_agent(handler="main.chatty")
    c = agent.client()
    for _ in range(3):
        status, _, body = c.invoke({"k": 1})
        assert status == 200 and json.loads(body) == {"ok": True}
    # output is line-buffered: it is visible while the agent is still running
    agent.proc.send_signal(signal.SIGTERM)
    agent.proc.wait(timeout=5)
    out = agent.proc.stdout.read()
    err = agent.proc.stderr.read()
    assert out.count("to stdout {'k': 1}") == 3
    assert err.count("to stderr") == 3


def test_sigterm_exits_promptly(start_agent):
    agent = start_agent()
    c = agent.client()  # idle connection open: the agent is blocked in recv
    assert c.request("GET", "/health")[0] == 200
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    rc = agent.proc.wait(timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert rc == 0


def test_sigterm_while_waiting_for_connection(start_agent):
    agent = start_agent()
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=5) == 0
    assert time.monotonic() - t0 < 1.0


def test_stale_socket_file_is_replaced(start_agent, workdir):
    stale = os.path.join(workdir, "a.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)  # leaves a socket file nobody listens on
    s.close()
    agent = start_agent()
    assert agent.client().request("GET", "/health")[0] == 200
    assert os.stat(stale).st_mode & 0o777 == 0o777


def test_bind_failure_exits_nonzero(workdir):
    code_dir = os.path.join(workdir, "code")
    os.makedirs(code_dir)
    with open(os.path.join(code_dir, "main.py"), "w") as f:
        f.write("def main(args):\n    return {}\n")
    bad = os.path.join(workdir, "no", "such", "dir", "a.sock")
    proc = subprocess.run(
        [sys.executable, "-I", "-S", AGENT, "--socket", bad, "--code-dir", code_dir, "--handler", "main.main"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode != 0
    assert "cannot listen" in proc.stderr


def test_environment_configuration(workdir):
    code_dir = os.path.join(workdir, "code")
    os.makedirs(code_dir)
    with open(os.path.join(code_dir, "fn.py"), "w") as f:
        f.write("def handle(args):\n    return {'env': True}\n")
    sock_path = os.path.join(workdir, "e.sock")
    env = dict(os.environ, HEARTH_SOCKET=sock_path, HEARTH_CODE_DIR=code_dir, HEARTH_HANDLER="fn.handle")
    proc = subprocess.Popen([sys.executable, "-I", "-S", AGENT], env=env, stderr=subprocess.PIPE)
    try:
        _wait_for_socket(proc, sock_path)
        c = Client(sock_path)
        status, _, body = c.invoke({})
        assert status == 200 and json.loads(body) == {"env": True}
        c.close()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason="no /usr/bin/python3")
def test_debian_interpreter(start_agent):
    agent = start_agent(python=DEBIAN_PYTHON)
    c = agent.client()
    status, _, body = c.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    for i in range(50):
        status, headers, body = c.invoke({"i": i})
        assert status == 200 and json.loads(body) == {"echo": {"i": i}}
        assert "x-exec-us" in headers
    status, _, body = c.invoke({"blob": "y" * (1 << 20)})
    assert status == 200 and len(body) > 1 << 20
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=5) == 0
