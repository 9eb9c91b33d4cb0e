"""Hearth in-sandbox agent: imports one handler and serves it over HTTP/1.1 on a Unix socket.

Run as ``python3 -I -S hearth_agent.py`` (standard library only, no site-packages).
Configuration: HEARTH_SOCKET, HEARTH_CODE_DIR, HEARTH_HANDLER (or --socket, --code-dir,
--handler). Protocol: GET /health, POST /invoke; see runtime/python/README.md.
"""

import importlib
import json
import os
import signal
import socket
import sys
from time import perf_counter_ns

DEFAULT_SOCKET = "/hearth/run/agent.sock"
DEFAULT_CODE_DIR = "/code"
DEFAULT_HANDLER = "main.main"

MAX_HEAD = 64 * 1024  # request line + headers
RECV_SIZE = 256 * 1024
TRACEBACK_LINES = 8
MAX_MESSAGE = 2048  # characters of an error message or traceback (the worker caps error answers)
# The largest result answered (HEARTH_MAX_RESULT_BYTES, set by the worker; 0: no limit). A larger
# one is answered 413 so the worker can refuse it and keep this sandbox.
try:
    MAX_RESULT = int(os.environ.get("HEARTH_MAX_RESULT_BYTES") or 0)
except ValueError:
    MAX_RESULT = 0

_REASONS = {
    100: b"Continue",
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Payload Too Large",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    505: b"HTTP Version Not Supported",
}
_JSON_HDRS = b"\r\nContent-Type: application/json\r\nContent-Length: "
# Precomputed response prefixes: status line + constant headers, up to the Content-Length value.
_PREFIX = {code: b"HTTP/1.1 %d %s%s" % (code, reason, _JSON_HDRS) for code, reason in _REASONS.items()}
_OK_PREFIX = _PREFIX[200]
_CLOSE_HDR = b"Connection: close\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_decode = json.JSONDecoder().decode  # str -> value; same errors as json.loads


# --------------------------------------------------------------------------------------------
# configuration and handler import


def _parse_args(argv):
    opts = {
        "socket": os.environ.get("HEARTH_SOCKET") or DEFAULT_SOCKET,
        "code_dir": os.environ.get("HEARTH_CODE_DIR") or DEFAULT_CODE_DIR,
        "handler": os.environ.get("HEARTH_HANDLER") or DEFAULT_HANDLER,
    }
    flags = {"--socket": "socket", "--code-dir": "code_dir", "--handler": "handler"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in flags and eq:
            opts[flags[name]] = value
            i += 1
        elif arg in flags and i + 1 < len(argv):
            opts[flags[arg]] = argv[i + 1]
            i += 2
        else:
            sys.stderr.write(
                "hearth_agent: unknown or incomplete argument %r\n"
                "usage: hearth_agent.py [--socket PATH] [--code-dir DIR] [--handler module.function]\n"
                % arg
            )
            sys.exit(2)
    return opts


def _error_body(type_name, message, phase, tb=None):
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "... (truncated)"
    err = {"type": type_name, "message": message}
    if tb is not None:
        if len(tb) > MAX_MESSAGE:
            tb = "... (truncated)" + tb[-MAX_MESSAGE:]
        err["traceback"] = tb
    err["phase"] = phase
    return json.dumps(err).encode()


def _last_traceback_lines():
    import traceback

    return "\n".join(traceback.format_exc().splitlines()[-TRACEBACK_LINES:])


def load_handler(code_dir, spec):
    """Import ``module.function`` from code_dir. Returns (handler, init_us, init_error_body)."""
    sys.path.insert(0, code_dir)
    t0 = perf_counter_ns()
    try:
        module_name, dot, func_name = spec.rpartition(".")
        if not dot or not module_name or not func_name:
            raise ValueError("handler %r is not of the form module.function" % spec)
        module = importlib.import_module(module_name)
        try:
            handler = getattr(module, func_name)
        except AttributeError:
            raise AttributeError(
                "module %r has no attribute %r (handler %r)" % (module_name, func_name, spec)
            ) from None
        if not callable(handler):
            raise TypeError("handler %r is not callable (it is a %s)" % (spec, type(handler).__name__))
    except BaseException as exc:  # SyntaxError, ImportError, SystemExit from module code, ...
        init_us = (perf_counter_ns() - t0) // 1000
        body = _error_body(type(exc).__name__, str(exc), "init", _last_traceback_lines())
        return None, init_us, body
    init_us = (perf_counter_ns() - t0) // 1000
    return handler, init_us, None


# --------------------------------------------------------------------------------------------
# HTTP


def _response(status, body, extra=b"", close=False):
    return b"%s%d\r\n%s%s\r\n%s" % (
        _PREFIX[status],
        len(body),
        extra,
        _CLOSE_HDR if close else b"",
        body,
    )


def _request_error(status, message, close=False, extra=b""):
    type_name = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed"}.get(status, "BadRequest")
    return _response(status, _error_body(type_name, message, "request"), extra, close)


class Agent:
    def __init__(self, handler, init_us, init_error):
        self.handler = handler
        self.init_us = init_us
        self.init_error = init_error
        if init_error is None:
            self.health_status = 200
            self.health_body = b'{"status":"ok","init_us":%d,"pid":%d}' % (init_us, os.getpid())
        else:
            self.health_status = 500
            self.health_body = init_error
        self._rbuf = bytearray(RECV_SIZE)
        self._rmv = memoryview(self._rbuf)

    # One connection: serve requests until the peer closes it (or asks to close).
    def serve_connection(self, conn):
        recv_into = conn.recv_into
        sendall = conn.sendall
        rbuf = self._rbuf
        rmv = self._rmv
        buf = bytearray()
        while True:
            # ---- head
            idx = buf.find(b"\r\n\r\n")
            while idx < 0:
                if len(buf) > MAX_HEAD:
                    sendall(_request_error(431, "request head larger than %d bytes" % MAX_HEAD, True))
                    return
                n = recv_into(rbuf)
                if not n:
                    return
                start = len(buf) - 3
                buf += rmv[:n]
                idx = buf.find(b"\r\n\r\n", start if start > 0 else 0)
            if idx == 0:  # stray CRLF between requests
                del buf[:2]
                continue
            lines = bytes(buf[:idx]).split(b"\r\n")
            request_line = lines[0]
            if not request_line:  # leading empty line(s) before the request line
                while lines and not lines[0]:
                    del lines[0]
                if not lines:  # unreachable (idx would be 0), but never spin on it
                    del buf[: idx + 4]
                    continue
                request_line = lines[0]
            method, _, rest = request_line.partition(b" ")
            target, _, version = rest.partition(b" ")
            if version[:7] != b"HTTP/1.":
                if version[:5] == b"HTTP/":
                    sendall(_request_error(505, "only HTTP/1.x is supported", True))
                else:
                    sendall(_request_error(400, "malformed request line", True))
                return
            close = version == b"HTTP/1.0"
            clen = 0
            expect_continue = False
            for line in lines[1:]:
                colon = line.find(b":")
                if colon <= 0:
                    sendall(_request_error(400, "malformed header line", True))
                    return
                name = line[:colon].lower()
                if name == b"content-length":
                    value = line[colon + 1 :].strip()
                    if not value.isdigit():
                        sendall(_request_error(400, "invalid Content-Length", True))
                        return
                    clen = int(value)
                elif name == b"connection":
                    value = line[colon + 1 :].strip().lower()
                    if value == b"close":
                        close = True
                    elif value == b"keep-alive":
                        close = False
                elif name == b"transfer-encoding":
                    sendall(_request_error(400, "chunked/transfer-encoded bodies are not supported", True))
                    return
                elif name == b"expect":
                    expect_continue = line[colon + 1 :].strip().lower() == b"100-continue"

            # ---- body
            body_start = idx + 4
            need = body_start + clen
            have = len(buf)
            if have < need:
                if expect_continue:
                    sendall(_CONTINUE)
                buf += bytes(need - have)
                with memoryview(buf) as mv:
                    while have < need:
                        n = recv_into(mv[have:need])
                        if not n:
                            return
                        have += n
            body = buf[body_start:need] if clen else b""
            del buf[:need]

            # ---- dispatch
            qmark = target.find(b"?")
            if qmark >= 0:
                target = target[:qmark]
            if target == b"/invoke":
                if method == b"POST":
                    sendall(self.invoke(body, close))
                else:
                    sendall(_request_error(405, "use POST for /invoke", close, b"Allow: POST\r\n"))
            elif target == b"/health":
                if method == b"GET":
                    sendall(_response(self.health_status, self.health_body, b"", close))
                else:
                    sendall(_request_error(405, "use GET for /health", close, b"Allow: GET\r\n"))
            else:
                sendall(_request_error(404, "no such path: %s" % target.decode("latin-1"), close))
            if close:
                return

    def invoke(self, body, close):
        if self.init_error is not None:
            return _response(500, self.init_error, b"", close)
        if body:
            try:
                args = _decode(body.decode())
            except Exception as exc:  # ValueError, UnicodeDecodeError, RecursionError
                return _request_error(400, "arguments are not valid JSON: %s" % exc, close)
        else:
            args = {}
        handler = self.handler
        t0 = perf_counter_ns()
        try:
            result = handler(args)
        except BaseException as exc:  # SystemExit/KeyboardInterrupt from a handler must not kill us
            exec_us = (perf_counter_ns() - t0) // 1000
            err = _error_body(type(exc).__name__, str(exc), "exec", _last_traceback_lines())
            return _response(500, err, b"X-Exec-Us: %d\r\n" % exec_us, close)
        exec_us = (perf_counter_ns() - t0) // 1000
        try:
            out = _encode(result).encode()
        except Exception as exc:  # TypeError, ValueError (NaN, circular reference), RecursionError
            err = _error_body(
                "TypeError", "handler result is not JSON-serializable: %s" % exc, "result"
            )
            return _response(500, err, b"X-Exec-Us: %d\r\n" % exec_us, close)
        if MAX_RESULT and len(out) > MAX_RESULT:
            err = _error_body(
                "ResultTooLarge",
                "the result is %d bytes, over the limit of %d bytes (max_result_bytes)"
                % (len(out), MAX_RESULT),
                "result",
            )
            return _response(413, err, b"X-Exec-Us: %d\r\n" % exec_us, close)
        return b"%s%d\r\nX-Exec-Us: %d\r\n%s\r\n%s" % (
            _OK_PREFIX,
            len(out),
            exec_us,
            _CLOSE_HDR if close else b"",
            out,
        )

    def serve_forever(self, srv):
        while True:
            try:
                conn, _ = srv.accept()
            except OSError as exc:  # e.g. EMFILE; do not spin
                sys.stderr.write("hearth_agent: accept failed: %s\n" % exc)
                import time

                time.sleep(0.01)
                continue
            try:
                self.serve_connection(conn)
            except OSError:
                pass  # peer went away mid-request/response; wait for the next connection
            except Exception:
                import traceback

                sys.stderr.write("hearth_agent: internal error, dropping connection\n")
                traceback.print_exc()
            finally:
                conn.close()


# --------------------------------------------------------------------------------------------
# main


def _exit_now(signum, frame):
    os._exit(0)


def _line_buffered_stdio():
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.reconfigure(line_buffering=True)
            except Exception:
                pass


def main(argv=None):
    # As pid 1 in a container, SIGTERM/SIGINT have no default action: exit explicitly.
    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
    _line_buffered_stdio()
    sys.dont_write_bytecode = True  # code dir is read-only in a sandbox
    opts = _parse_args(sys.argv[1:] if argv is None else argv)

    handler, init_us, init_error = load_handler(opts["code_dir"], opts["handler"])
    agent = Agent(handler, init_us, init_error)

    path = opts["socket"]
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(16)
        os.chmod(path, 0o777)
    except OSError as exc:
        sys.stderr.write("hearth_agent: cannot listen on %r: %s\n" % (path, exc))
        sys.stderr.flush()
        os._exit(1)
    if init_error is not None:
        sys.stderr.write("hearth_agent: handler init failed: %s\n" % init_error.decode())
    agent.serve_forever(srv)


if __name__ == "__main__":
    main()
