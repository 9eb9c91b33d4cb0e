"""Tests for runtime/python/hearth_agent.py: start the agent as a subprocess, speak raw frames."""

import json
import os
import shutil
import signal
import socket
import random
import struct
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


REQ_HDR = struct.Struct(">IB3xQ")
RESP_HDR = struct.Struct(">IHHQQ")


def frame(op, payload=b"", rid=0):
    """A request frame: u32 BE payload length, op byte, 3 zero bytes, u64 BE request id,
    payload."""
    return REQ_HDR.pack(len(payload), ord(op), rid) + payload


def send_with_socket(sock, data, passed):
    """Sends data with passed's descriptor attached (SCM_RIGHTS)."""
    fds = struct.pack("i", passed.fileno())
    assert sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]) == len(data)


class Client:
    """Tiny frame client over a Unix socket, with a receive buffer (pipelining-safe). With
    channel (as the worker does), its first frame passes the agent a socket to answer on, and
    answers are read there; without, they come back on the connection."""

    def __init__(self, path, timeout=10.0, channel=True):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.replies = self.sock
        if channel:
            self.replies, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self.replies.settimeout(timeout)
            send_with_socket(self.sock, frame("R"), theirs)
            theirs.close()
        self.buf = b""
        self.last_id = None  # the request id the last answer read echoed

    def close(self):
        self.sock.close()
        if self.replies is not self.sock:
            self.replies.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.replies.recv(1 << 20)
        if not chunk:
            raise ConnectionError("connection closed by agent")
        self.buf += chunk

    def read_response(self):
        """(status, exec_us or None, body) of the next response frame."""
        while len(self.buf) < 24:
            self._fill()
        n, status, flags, exec_us, self.last_id = RESP_HDR.unpack(self.buf[:24])
        assert flags & ~1 == 0
        if not flags & 1:
            assert exec_us == 0
        self.buf = self.buf[24:]
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, (exec_us if flags & 1 else None), body

    def request(self, op, payload=b""):
        """Sends a frame with a random id, as the worker does; its answer must echo it."""
        rid = random.getrandbits(64)
        self.send_raw(frame(op, payload, rid))
        answer = self.read_response()
        assert self.last_id == rid, "answer echoed id %r, not %r" % (self.last_id, rid)
        return answer

    def health(self):
        return self.request("H")

    def invoke(self, args=None, raw=None):
        return self.request("I", raw if raw is not None else json.dumps(args).encode())

    def load(self, handler="main.main", code_dir=None, env=None, raw=None):
        if raw is None:
            doc = {"handler": handler, "code_dir": code_dir, "env": env or {}}
            raw = json.dumps(doc).encode()
        return self.request("L", raw)


class Agent:
    def __init__(self, proc, sock_path, code_dir):
        self.proc = proc
        self.sock_path = sock_path
        self.code_dir = code_dir

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

    def start(handler="main.main", code=HANDLERS, files=None, python=sys.executable, env=None, generic=False):
        code_dir = os.path.join(workdir, "code")
        os.makedirs(code_dir, exist_ok=True)
        for name, text in ({"main.py": code} if files is None else files).items():
            path = os.path.join(code_dir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))
        sock_path = os.path.join(workdir, "a.sock")
        if generic:  # like a pre-made sandbox: started elsewhere, told its code dir by load
            args = ["--generic"]
            cwd = os.path.join(workdir, "elsewhere")
            os.makedirs(cwd, exist_ok=True)
        else:
            args = ["--code-dir", code_dir, "--handler", handler]
            cwd = None
        proc = subprocess.Popen(
            [python, "-I", "-S", AGENT, "--socket", sock_path] + args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
        )
        procs.append(proc)
        _wait_for_socket(proc, sock_path)
        return Agent(proc, sock_path, code_dir)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()



# ---------------------------------------------------------------------------------------------
# boot mode (handler imported at start)


def test_health_reports_init_us_and_pid(start_agent):
    agent = start_agent()
    status, exec_us, body = agent.client().health()
    assert status == 200 and exec_us is None
    doc = json.loads(body)
    assert doc["status"] == "ok"
    assert isinstance(doc["init_us"], int) and doc["init_us"] >= 0
    assert doc["pid"] == agent.proc.pid
    assert set(doc) == {"status", "init_us", "pid"}


def test_init_us_measures_slow_import(start_agent):
    agent = start_agent(code="import time\ntime.sleep(0.05)\ndef main(args):\n    return {}\n")
    _, _, body = agent.client().health()
    assert json.loads(body)["init_us"] >= 50000


def test_invoke_returns_result_and_exec_us(start_agent):
    agent = start_agent()
    status, exec_us, body = agent.client().invoke({"a": 1, "b": [1, 2, "x"]})
    assert status == 200
    assert isinstance(exec_us, int) and exec_us >= 0
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
    status, exec_us, body = agent.client().invoke({"ms": 20})
    assert status == 200
    assert exec_us >= 20000
    assert json.loads(body) == {"slept": True}


def test_empty_payload_means_empty_object(start_agent):
    c = start_agent().client()
    status, _, body = c.invoke(raw=b"")
    assert status == 200 and json.loads(body) == {"echo": {}}


def test_many_requests_on_one_connection(start_agent):
    c = start_agent().client()
    for i in range(500):
        status, _, body = c.invoke({"i": i})
        assert status == 200
        assert json.loads(body) == {"echo": {"i": i}}
    assert c.health()[0] == 200


def test_new_connection_after_close(start_agent):
    agent = start_agent()
    for i in range(5):
        c = agent.client()
        status, _, body = c.invoke({"conn": i})
        assert status == 200 and json.loads(body) == {"echo": {"conn": i}}
        c.close()


def test_peer_closing_mid_frame_frees_the_agent_for_the_next_connection(start_agent):
    agent = start_agent()
    c = agent.client()
    c.send_raw(frame("I", b'{"a": 1}')[:11])  # header and part of the payload
    c.close()
    c = agent.client()
    c.send_raw(frame("I", b"x" * 100)[:5])  # part of a header
    c.close()
    assert agent.client().invoke({"next": 1})[0] == 200


def test_handler_exception(start_agent):
    agent = start_agent(handler="main.boom")
    c = agent.client()
    status, exec_us, body = c.invoke({})
    assert status == 500
    assert exec_us is not None
    err = json.loads(body)
    assert err["type"] == "ValueError"
    assert err["message"] == "kaboom 1"
    assert err["phase"] == "exec"
    assert 'raise ValueError("kaboom " + str(x))' in err["traceback"]
    assert "ValueError: kaboom 1" in err["traceback"]
    assert len(err["traceback"].splitlines()) <= 8
    # the agent keeps serving on the same connection
    assert c.health()[0] == 200


def test_handler_system_exit_does_not_kill_agent(start_agent):
    agent = start_agent(handler="main.exiter")
    c = agent.client()
    status, _, body = c.invoke({})
    assert status == 500
    assert json.loads(body)["type"] == "SystemExit"
    assert c.health()[0] == 200
    assert agent.proc.poll() is None


def test_non_serializable_result(start_agent):
    c = start_agent(handler="main.unserializable").client()
    status, exec_us, body = c.invoke({})
    assert status == 500
    assert exec_us is not None
    err = json.loads(body)
    assert err["type"] == "TypeError"
    assert err["phase"] == "result"
    assert err["message"].startswith("handler result is not JSON-serializable: ")
    assert "set" in err["message"]


def test_malformed_json_is_400(start_agent):
    c = start_agent().client()
    status, exec_us, body = c.invoke(raw=b'{"a": ')
    assert status == 400 and exec_us is None
    err = json.loads(body)
    assert err["type"] == "BadRequest"
    assert err["phase"] == "request"
    assert err["message"].startswith("arguments are not valid JSON: ")
    status, _, body = c.invoke(raw=b"\xff\xfe\x00garbage")
    assert status == 400
    assert json.loads(body)["phase"] == "request"
    # connection still usable
    assert c.invoke({"ok": 1})[0] == 200


def test_unknown_op_is_400_and_its_payload_is_skipped(start_agent):
    c = start_agent().client()
    # the payload looks like a frame: if it were not skipped it would be answered
    status, exec_us, body = c.request("Z", frame("H") + b"tail")
    assert status == 400 and exec_us is None
    err = json.loads(body)
    assert err["type"] == "BadRequest" and err["phase"] == "request"
    status, _, body = c.invoke({"after": 1})
    assert status == 200 and json.loads(body) == {"echo": {"after": 1}}
    # a payload larger than the receive buffer is skipped as well
    status, _, _ = c.request("x", b"y" * (600 * 1024))
    assert status == 400
    assert c.health()[0] == 200


def test_answers_come_on_the_passed_socket_and_never_on_the_connection(start_agent):
    c = start_agent().client()
    assert c.replies is not c.sock
    for i in range(3):
        assert c.invoke({"i": i})[0] == 200
    assert c.request("Z")[0] == 400
    c.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        c.sock.recv(1)


def test_without_a_reply_channel_answers_come_on_the_connection(start_agent):
    c = Client(start_agent().sock_path, channel=False)
    status, exec_us, body = c.invoke({"one": 1})
    assert status == 200 and exec_us is not None and json.loads(body) == {"echo": {"one": 1}}
    assert c.health()[0] == 200


def test_an_R_frame_that_is_not_first_or_has_no_socket_is_400(start_agent):
    agent = start_agent()
    # no socket attached: answered on the connection, which stays usable
    c = Client(agent.sock_path, channel=False)
    status, _, body = c.request("R")
    assert status == 400 and "first frame" in json.loads(body)["message"]
    assert c.invoke({"after": 1})[0] == 200
    c.close()
    # after another frame: the socket it carries is not taken
    c = Client(agent.sock_path, channel=False)
    assert c.health()[0] == 200
    spare, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    send_with_socket(c.sock, frame("R"), theirs)
    theirs.close()
    status, _, _ = c.read_response()
    assert status == 400
    assert c.invoke({"still": 1})[0] == 200
    spare.settimeout(2)
    assert spare.recv(1) == b""  # the agent kept no copy of the socket: closed at once
    # an R frame with a payload: the socket is not taken either
    c.close()
    c = Client(agent.sock_path, channel=False)
    spare, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    send_with_socket(c.sock, frame("R", b"xy"), theirs)
    theirs.close()
    assert c.read_response()[0] == 400
    spare.settimeout(2)
    assert spare.recv(1) == b""


def _voluntary_switches(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches for %d" % pid)


def test_with_a_reply_channel_the_agent_sleeps_once_per_invocation(start_agent):
    # Reading an answer from the socket the agent waits on wakes it for nothing (the kernel
    # signals "writable"); answering on a socket of their own spares that wake-up.
    agent = start_agent(handler="main.noop")
    c = agent.client()
    for _ in range(200):
        c.invoke({})
    n = 3000
    before = _voluntary_switches(agent.proc.pid)
    for _ in range(n):
        c.invoke({})
    per_call = (_voluntary_switches(agent.proc.pid) - before) / n
    assert per_call < 1.4, "the agent slept %.2f times per invocation" % per_call


def test_oversized_length_is_413_and_closes(start_agent):
    agent = start_agent()
    c = agent.client()
    c.send_raw(REQ_HDR.pack(256 * 1024 * 1024 + 1, ord("I"), 77))
    status, exec_us, body = c.read_response()
    assert status == 413 and exec_us is None and c.last_id == 77
    err = json.loads(body)
    assert err["type"] == "PayloadTooLarge" and err["phase"] == "request"
    assert c.replies.recv(10) == b""  # the agent closed its end
    # and it accepts the next connection
    assert agent.client().health()[0] == 200


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
    status, _, body = c.health()
    assert status == 500
    err = json.loads(body)
    assert err["type"] == err_type
    assert err["phase"] == "init"
    assert err["message"]
    assert "traceback" in err
    status, exec_us, body = c.invoke({})
    assert status == 500 and exec_us is None
    assert json.loads(body) == err
    assert c.request("Q")[0] == 400


def test_dotted_module_handler(start_agent):
    files = {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/mod.py": "def func(args):\n    return {'where': __name__}\n",
    }
    c = start_agent(handler="pkg.sub.mod.func", files=files).client()
    status, _, body = c.invoke({})
    assert status == 200 and json.loads(body) == {"where": "pkg.sub.mod"}


def test_large_payload_round_trips(start_agent):
    c = start_agent().client()
    payload = {"blob": "x" * (1 << 20) + "end", "n": list(range(1000))}
    status, _, body = c.invoke(payload)
    assert status == 200
    assert json.loads(body) == {"echo": payload}
    assert len(body) > 1 << 20
    assert c.invoke({"after": True})[0] == 200


def test_payloads_around_the_receive_buffer_size(start_agent):
    c = start_agent().client()
    # a small frame first leaves the buffer's start offset, so the next ones wrap or compact
    for size in [10, 256 * 1024 - 40, 256 * 1024 - 20, 256 * 1024 + 5, 100, 300 * 1024]:
        blob = "z" * size
        c.send_raw(frame("I", json.dumps({"b": blob}).encode()) + frame("H"))
        status, _, body = c.read_response()
        assert status == 200 and json.loads(body) == {"echo": {"b": blob}}
        assert c.read_response()[0] == 200


def test_result_over_the_limit_is_413_and_the_agent_keeps_serving(start_agent):
    c = start_agent(env={"HEARTH_MAX_RESULT_BYTES": "1000"}).client()
    status, exec_us, body = c.invoke({"blob": "x" * 2000})
    assert status == 413
    err = json.loads(body)
    assert err["type"] == "ResultTooLarge" and err["phase"] == "result"
    assert "over the limit of 1000 bytes" in err["message"]
    assert exec_us is not None
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
    raw = frame("I", b'{"split": [1, 2, 3]}')
    # split inside the header, at its end, and inside the payload
    cut = [3, 16, len(raw) - 5]
    pieces = [raw[a:b] for a, b in zip([0] + cut, cut + [len(raw)])]
    assert b"".join(pieces) == raw
    for piece in pieces:
        c.send_raw(piece)
        time.sleep(0.01)
    status, _, body = c.read_response()
    assert status == 200 and json.loads(body) == {"echo": {"split": [1, 2, 3]}}
    # byte by byte, the header too
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    for i in range(len(raw)):
        c.send_raw(raw[i : i + 1])
        if i < 16:
            time.sleep(0.002)
    status, _, body = c.read_response()
    assert status == 200 and json.loads(body) == {"echo": {"split": [1, 2, 3]}}


def test_pipelined_requests_in_one_send(start_agent):
    c = start_agent().client()
    c.send_raw(
        frame("I", b'{"n": 1}', 1)
        + frame("H", b"", 2)
        + frame("Z", b"?", 3)
        + frame("I", b'{"n": 2}', 4)
        + frame("I", b"", 5)
    )
    answers = []
    for rid in range(1, 6):
        answers.append(c.read_response())
        assert c.last_id == rid  # in order, each with its request's id
    (s1, _, b1), (s2, _, b2), (s3, _, _), (s4, _, b4), (s5, _, b5) = answers
    assert (s1, json.loads(b1)) == (200, {"echo": {"n": 1}})
    assert s2 == 200 and json.loads(b2)["status"] == "ok"
    assert s3 == 400
    assert (s4, json.loads(b4)) == (200, {"echo": {"n": 2}})
    assert (s5, json.loads(b5)) == (200, {"echo": {}})


def test_every_answer_echoes_its_request_id(start_agent):
    # The worker takes an answer only for the request in flight (a frame a handler wrote, or a
    # stale one, carries another id): every kind of answer carries the id of its request.
    code = (
        "def main(args):\n"
        "    kind = args.get('kind')\n"
        "    if kind == 'raise':\n"
        "        raise ValueError('no')\n"
        "    if kind == 'set':\n"
        "        return {1, 2}\n"
        "    if kind == 'big':\n"
        "        return 'x' * 100\n"
        "    return {}\n"
    )
    c = start_agent(code=code, env={"HEARTH_MAX_RESULT_BYTES": "50"}).client()
    cases = [
        (frame("H", b"", 0), 200, False),
        (frame("I", b'{"a": 1}', 2**64 - 1), 200, True),
        (frame("I", b"{nope", 1 << 63), 400, False),  # arguments not JSON
        (frame("I", b'{"kind": "raise"}', 5), 500, True),
        (frame("I", b'{"kind": "set"}', 6), 500, True),  # not serializable
        (frame("I", b'{"kind": "big"}', 0xDEADBEEF), 413, True),
        (frame("Z", b"junk", 12345), 400, False),  # unknown op, payload skipped
        (frame("L", b"{}", 99), 409, False),  # booted with a handler
        (frame("P", b'{"device": 0}', 7), 409, False),  # no shim
        (frame("S", b"", 8), 409, False),
    ]
    for raw, status, timed in cases:
        rid = REQ_HDR.unpack(raw[:16])[2]
        c.send_raw(raw)
        got, exec_us, _ = c.read_response()
        assert (got, c.last_id, exec_us is not None) == (status, rid, timed), raw


def test_an_init_error_answer_echoes_the_request_id(start_agent):
    c = start_agent(code="raise RuntimeError('at import')\n").client()
    for op in ("H", "I"):
        c.send_raw(frame(op, b"", 4242))
        assert c.read_response()[0] == 500 and c.last_id == 4242


def test_load_on_a_booted_agent_is_409(start_agent):
    c = start_agent().client()
    status, exec_us, body = c.load("main.noop", "/tmp")
    assert status == 409 and exec_us is None
    err = json.loads(body)
    assert err["type"] == "AlreadyLoaded" and err["phase"] == "request"
    # the original handler still serves
    status, _, body = c.invoke({"k": 2})
    assert status == 200 and json.loads(body) == {"echo": {"k": 2}}


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
    assert c.health()[0] == 200
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
    assert agent.client().health()[0] == 200
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


def _run_env_agent(workdir, extra_env, check):
    code_dir = os.path.join(workdir, "code")
    os.makedirs(code_dir, exist_ok=True)
    with open(os.path.join(code_dir, "fn.py"), "w") as f:
        f.write("def handle(args):\n    return {'env': True}\n")
    sock_path = os.path.join(workdir, "e.sock")
    env = dict(os.environ, HEARTH_SOCKET=sock_path, HEARTH_CODE_DIR=code_dir, HEARTH_HANDLER="fn.handle")
    env.update(extra_env)
    proc = subprocess.Popen([sys.executable, "-I", "-S", AGENT], env=env, stderr=subprocess.PIPE)
    try:
        _wait_for_socket(proc, sock_path)
        c = Client(sock_path)
        check(c, proc)
        c.close()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def test_environment_configuration(workdir):
    def check(c, proc):
        status, _, body = c.invoke({})
        assert status == 200 and json.loads(body) == {"env": True}

    _run_env_agent(workdir, {}, check)


def test_hearth_generic_env_takes_precedence_over_hearth_handler(workdir):
    def check(c, proc):
        status, _, body = c.health()
        assert status == 200 and json.loads(body) == {"status": "generic", "pid": proc.pid}
        status, _, body = c.load("fn.handle", os.path.join(workdir, "code"))
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, _, body = c.invoke({})
        assert status == 200 and json.loads(body) == {"env": True}

    _run_env_agent(workdir, {"HEARTH_GENERIC": "1"}, check)


# ---------------------------------------------------------------------------------------------
# generic mode: nothing imported at start, specialized by one load

ENV_CODE = """
import os
AT_IMPORT = os.environ.get("GREETING")

def main(args):
    keys = ["GREETING", "EMPTY", "PATH", "HEARTH_SOCKET", "HEARTH_SECRET", "A=B", "NUL", "SURROGATE",
            "HEARTH_GENERIC", "HEARTH_HANDLER"]
    return {"at_import": AT_IMPORT, "env": {k: os.environ.get(k) for k in keys}}

def read_relative(args):
    with open("data.txt") as f:
        return {"data": f.read(), "cwd": os.getcwd()}
"""


def test_generic_health_and_invoke_before_load(start_agent):
    agent = start_agent(generic=True)
    c = agent.client()
    status, exec_us, body = c.health()
    assert status == 200 and exec_us is None
    assert json.loads(body) == {"status": "generic", "pid": agent.proc.pid}
    status, exec_us, body = c.invoke({})
    assert status == 503 and exec_us is None
    err = json.loads(body)
    assert err["type"] == "NotLoaded" and err["phase"] == "request"


def test_generic_imports_nothing_at_start(start_agent):
    # a handler that would fail to import is not touched until load
    agent = start_agent(generic=True, code="raise RuntimeError('imported too early')\n")
    status, _, body = agent.client().health()
    assert status == 200 and json.loads(body)["status"] == "generic"


def test_generic_load_then_invoke(start_agent):
    agent = start_agent(generic=True)
    c = agent.client()
    status, exec_us, body = c.load("main.main", agent.code_dir)
    assert status == 200 and exec_us is None
    doc = json.loads(body)
    assert doc["status"] == "ok" and doc["pid"] == agent.proc.pid
    assert isinstance(doc["init_us"], int) and doc["init_us"] >= 0
    # health now answers exactly as load did
    assert c.health() == (200, None, body)
    status, exec_us, body = c.invoke({"x": [1]})
    assert status == 200 and exec_us is not None
    assert json.loads(body) == {"echo": {"x": [1]}}
    # the loaded agent serves the next connection too (one connection at a time)
    c.close()
    assert agent.client().invoke({"y": 1})[0] == 200


def test_second_load_is_409_and_the_connection_stays_usable(start_agent):
    agent = start_agent(generic=True)
    c = agent.client()
    assert c.load("main.main", agent.code_dir)[0] == 200
    status, _, body = c.load("main.noop", agent.code_dir)
    assert status == 409
    err = json.loads(body)
    assert err["type"] == "AlreadyLoaded" and err["phase"] == "request"
    status, _, body = c.invoke({"still": "main"})
    assert status == 200 and json.loads(body) == {"echo": {"still": "main"}}


@pytest.mark.parametrize(
    "code,handler,err_type",
    [
        ("import does_not_exist_xyz\n", "main.main", "ModuleNotFoundError"),
        ("def main(args):\n    return {\n", "main.main", "SyntaxError"),
        (HANDLERS, "main.missing", "AttributeError"),
    ],
)
def test_load_with_an_init_error_is_500_on_load_health_and_invoke(start_agent, code, handler, err_type):
    agent = start_agent(generic=True, code=code)
    c = agent.client()
    status, exec_us, body = c.load(handler, agent.code_dir)
    assert status == 500 and exec_us is None
    err = json.loads(body)
    assert err["type"] == err_type and err["phase"] == "init" and "traceback" in err
    assert c.health() == (500, None, body)
    status, _, ibody = c.invoke({})
    assert status == 500 and json.loads(ibody) == err
    # it is no longer generic: a retry is refused
    assert c.load("main.main", agent.code_dir)[0] == 409


def test_load_into_a_missing_code_dir_is_an_init_error(start_agent, workdir):
    agent = start_agent(generic=True)
    c = agent.client()
    status, _, body = c.load("main.main", os.path.join(workdir, "nope"))
    assert status == 500
    err = json.loads(body)
    assert err["phase"] == "init" and err["type"] == "FileNotFoundError"
    assert c.invoke({})[0] == 500


def test_load_into_an_unencodable_code_dir_is_an_init_error(start_agent):
    agent = start_agent(generic=True)
    c = agent.client()
    status, _, body = c.load("main.main", "/tmp/\ud800")
    assert status == 500 and json.loads(body)["phase"] == "init"
    assert c.health()[0] == 500  # same connection, still answering


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"code_dir": "/code"}',
        b'{"handler": 3, "code_dir": "/code"}',
        b'{"handler": "", "code_dir": "/code"}',
        b'{"handler": "main.main", "code_dir": 7}',
        b'{"handler": "main.main", "code_dir": "/code", "env": ["A", "B"]}',
        b'{"handler": "main.main", "code_dir": "/code", "env": {"A": 1}}',
    ],
)
def test_malformed_load_is_400_and_the_agent_stays_generic(start_agent, raw):
    agent = start_agent(generic=True)
    c = agent.client()
    status, _, body = c.load(raw=raw)
    assert status == 400
    err = json.loads(body)
    assert err["type"] == "BadRequest" and err["phase"] == "request"
    assert json.loads(c.health()[2])["status"] == "generic"
    assert c.invoke({})[0] == 503
    assert c.load("main.main", agent.code_dir)[0] == 200
    assert c.invoke({"ok": 1})[0] == 200


def test_load_sets_env_but_not_reserved_or_malformed_keys(start_agent):
    # Started as the worker starts a generic sandbox: HEARTH_GENERIC=1 in its environment.
    agent = start_agent(
        generic=True,
        code=ENV_CODE,
        env={"HEARTH_SECRET": "kept", "PATH": "/usr/bin:/bin", "HEARTH_GENERIC": "1"},
    )
    c = agent.client()
    env = {
        "GREETING": "hello",
        "EMPTY": "",
        "PATH": "/evil",
        "HEARTH_SOCKET": "/evil.sock",
        "HEARTH_SECRET": "overridden",
        "A=B": "x",
        "": "empty key",
        "NUL\u0000": "x",
        "NUL": "bad\u0000value",
        "SURROGATE\ud800": "x",
        "SURROGATE": "\udfff",
    }
    assert c.load("main.main", agent.code_dir, env)[0] == 200
    status, _, body = c.invoke({})
    assert status == 200
    doc = json.loads(body)
    assert doc["at_import"] == "hello"  # set before the import runs
    assert doc["env"] == {
        "GREETING": "hello",
        "EMPTY": "",
        "PATH": "/usr/bin:/bin",
        "HEARTH_SOCKET": None,  # the socket came from --socket; the key stays unset
        "HEARTH_SECRET": "kept",
        "A=B": None,
        "NUL": None,
        "SURROGATE": None,
        # as in a sandbox made for the function: nothing says it was generic
        "HEARTH_GENERIC": None,
        "HEARTH_HANDLER": "main.main",
    }


def test_load_changes_into_the_code_dir(start_agent):
    agent = start_agent(generic=True, files={"main.py": ENV_CODE, "data.txt": "relative file"})
    c = agent.client()
    assert c.load("main.read_relative", agent.code_dir)[0] == 200
    status, _, body = c.invoke({})
    assert status == 200
    doc = json.loads(body)
    assert doc["data"] == "relative file"
    assert os.path.realpath(doc["cwd"]) == os.path.realpath(agent.code_dir)


def test_load_picks_up_code_that_appeared_after_start(start_agent, workdir):
    # the sandbox's code is mounted after the agent started: nothing is cached from before
    agent = start_agent(generic=True, files={})
    c = agent.client()
    assert c.health()[0] == 200
    with open(os.path.join(agent.code_dir, "late.py"), "w") as f:
        f.write("def main(args):\n    return {'late': True}\n")
    assert c.load("late.main", agent.code_dir)[0] == 200
    status, _, body = c.invoke({})
    assert status == 200 and json.loads(body) == {"late": True}


def test_generic_load_frames_split_and_pipelined(start_agent):
    agent = start_agent(generic=True)
    c = agent.client()
    load = frame("L", json.dumps({"handler": "main.main", "code_dir": agent.code_dir, "env": {}}).encode())
    raw = frame("H") + frame("I", b"{}") + load + frame("I", b'{"n": 3}') + load
    for i in range(len(raw)):
        c.send_raw(raw[i : i + 1])
    statuses = [c.read_response() for _ in range(5)]
    assert [s for s, _, _ in statuses] == [200, 503, 200, 200, 409]
    assert json.loads(statuses[3][2]) == {"echo": {"n": 3}}


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason="no /usr/bin/python3")
def test_debian_interpreter(start_agent):
    agent = start_agent(python=DEBIAN_PYTHON)
    c = agent.client()
    status, _, body = c.health()
    assert status == 200 and json.loads(body)["status"] == "ok"
    for i in range(50):
        status, exec_us, body = c.invoke({"i": i})
        assert status == 200 and json.loads(body) == {"echo": {"i": i}}
        assert exec_us is not None
    status, _, body = c.invoke({"blob": "y" * (1 << 20)})
    assert status == 200 and len(body) > 1 << 20
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=5) == 0


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason="no /usr/bin/python3")
def test_debian_interpreter_generic(start_agent):
    agent = start_agent(python=DEBIAN_PYTHON, generic=True)
    c = agent.client()
    assert json.loads(c.health()[2])["status"] == "generic"
    assert c.load("main.main", agent.code_dir)[0] == 200
    status, _, body = c.invoke({"d": 1})
    assert status == 200 and json.loads(body) == {"echo": {"d": 1}}


# ---------------------------------------------------------------------------------------------
# dependency layers (HEARTH_DEPS) and pre-imported generic agents (HEARTH_PREIMPORT)


def _make_layer(workdir, modules=40):
    """A layer dir with a package `slowpkg` of `modules` submodules (imported all at once) and a
    module `shadowed` that the function's own code overrides."""
    deps = os.path.join(workdir, "deps")
    pkg = os.path.join(deps, "slowpkg")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write("".join("from . import m%d\n" % i for i in range(modules)))
        f.write("import os\nIMPORTED_BY = os.getpid()\n")
    for i in range(modules):
        with open(os.path.join(pkg, "m%d.py" % i), "w") as f:
            f.write("VALUE = %d\n" % i + "def f%d(x):\n    return x + %d\n" % (i, i) * 20)
    with open(os.path.join(deps, "shadowed.py"), "w") as f:
        f.write("WHO = 'layer'\n")
    with open(os.path.join(deps, "broken.py"), "w") as f:
        f.write("raise SystemExit('broken at import')\n")
    return deps


DEPS_CODE = """
import sys, os
import slowpkg, shadowed

def main(args):
    return {"pid": slowpkg.IMPORTED_BY, "who": shadowed.WHO, "n": len(slowpkg.m7.__dict__),
            "path": sys.path[:2], "preimport": os.environ.get("HEARTH_PREIMPORT")}
"""


def test_deps_come_right_after_the_code_dir(start_agent, workdir):
    deps = _make_layer(workdir)
    files = {"main.py": DEPS_CODE, "shadowed.py": "WHO = 'code'\n"}
    agent = start_agent(files=files, env={"HEARTH_DEPS": deps})
    status, _, body = agent.client().invoke({})
    assert status == 200, body
    out = json.loads(body)
    assert out["who"] == "code"  # the function's own module wins over the layer's
    assert out["path"] == [agent.code_dir, deps]


def test_without_deps_a_layer_module_is_not_found(start_agent, workdir):
    _make_layer(workdir)
    agent = start_agent(files={"main.py": DEPS_CODE})
    status, _, body = agent.client().health()
    assert status == 500 and json.loads(body)["type"] == "ModuleNotFoundError"


def test_a_preimported_generic_agent_imported_before_listening(start_agent, workdir):
    deps = _make_layer(workdir)
    env = {"HEARTH_DEPS": deps, "HEARTH_PREIMPORT": "slowpkg,not-a.name!,missing_mod,broken,,shadowed"}
    agent = start_agent(generic=True, files={"main.py": DEPS_CODE}, env=env)
    c = agent.client()
    status, _, body = c.health()
    doc = json.loads(body)
    # slowpkg and shadowed imported; the invalid name, the missing module and the one raising
    # SystemExit are skipped, never fatal
    assert status == 200 and doc["status"] == "generic" and doc["preimported"] == 2
    assert isinstance(doc["preimport_us"], int) and doc["preimport_us"] > 0
    status, _, body = c.load("main.main", agent.code_dir)
    assert status == 200, body
    # the handler's import was a sys.modules lookup: the layer's `shadowed`, already imported,
    # is what it gets (a pre-imported key's functions share the layer's modules)
    status, _, body = c.invoke({})
    out = json.loads(body)
    assert status == 200 and out["pid"] == agent.proc.pid and out["preimport"] is None
    assert out["path"] == [agent.code_dir, deps]
    agent.proc.kill()
    err = agent.proc.communicate()[1]
    assert "preimport of missing_mod failed: ModuleNotFoundError" in err
    assert "preimport of broken failed: SystemExit" in err
    assert "skipped an invalid module name" in err


def test_preimport_makes_the_handlers_import_cheap(start_agent, workdir):
    deps = _make_layer(workdir, modules=300)
    files = {"main.py": "import slowpkg\ndef main(args):\n    return 1\n"}
    cold = start_agent(generic=True, files=files, env={"HEARTH_DEPS": deps})
    status, _, body = cold.client().load("main.main", cold.code_dir)
    assert status == 200, body
    cold_us = json.loads(body)["init_us"]
    cold.proc.kill()  # the next agent binds the same socket path
    cold.proc.wait()
    warm = start_agent(
        generic=True, files=files, env={"HEARTH_DEPS": deps, "HEARTH_PREIMPORT": "slowpkg"}
    )
    status, _, body = warm.client().load("main.main", warm.code_dir)
    assert status == 200, body
    warm_us = json.loads(body)["init_us"]
    # 300 modules take tens of ms; a sys.modules lookup well under one
    assert warm_us * 10 < cold_us, (warm_us, cold_us)
