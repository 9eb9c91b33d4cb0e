"""Hearth in-sandbox agent: runs one handler and serves it over length-prefixed frames on a Unix socket.

Run as ``python3 -I -S hearth_agent.py`` (standard library only, no site-packages).
Configuration: HEARTH_SOCKET, HEARTH_CODE_DIR, HEARTH_HANDLER, HEARTH_GENERIC (or --socket,
--code-dir, --handler, --generic); HEARTH_DEPS (a dependency layer, on sys.path right after the
code) and HEARTH_PREIMPORT (modules a generic agent imports before it listens), set by the worker. Protocol: 16-byte request header (u32 BE length, u8 op, 3 zero
bytes, u64 request id), 24-byte response header (u32 BE length, u16 status, u16 flags, u64
exec_us, u64 the request's id echoed), then, when flags bit 1 is set, a u64 BE of device memory
bytes; ops H (health), I (invoke), L (load,
generic mode only), P/S (prefetch / swap out a GPU sandbox's memory through the CUDA shim), and R
(a connection's first frame: answer on the socket it carries); see runtime/python/README.md.
"""

import importlib
import json
import os
import re
import signal
import socket
import struct
import sys
from time import perf_counter_ns

DEFAULT_SOCKET = "/hearth/run/agent.sock"
DEFAULT_CODE_DIR = "/code"
DEFAULT_HANDLER = "main.main"

RECV_SIZE = 256 * 1024  # preallocated receive buffer; larger payloads get their own buffer
MAX_PAYLOAD = 256 * 1024 * 1024  # sanity limit on an announced request payload
SEND_JOIN_MAX = 16 * 1024  # measured: joining header+body is faster below ~16 KiB, sendmsg above
TRACEBACK_LINES = 8
MAX_MESSAGE = 2048  # characters of an error message or traceback (the worker caps error answers)
# The largest result answered (HEARTH_MAX_RESULT_BYTES, set by the worker; 0: no limit). A larger
# one is answered 413 so the worker can refuse it and keep this sandbox.
try:
    MAX_RESULT = int(os.environ.get("HEARTH_MAX_RESULT_BYTES") or 0)
except ValueError:
    MAX_RESULT = 0

# The worker binds each answer to its request by the id it chose; the agent only echoes it.
REQ_HDR = struct.Struct(">IB3xQ")  # payload length, op, 3 reserved bytes, request id
REQ_HDR_SIZE = REQ_HDR.size  # 16
RESP_HDR = struct.Struct(">IHHQQ")  # body length, status, flags, exec_us, request id
RESP_HDR_MEM = struct.Struct(">IHHQQQ")  # ... then the shim's resident bytes (flag bit 1)
FLAG_EXEC_US = 1
FLAG_DEVICE_MEM = 2
OP_HEALTH = ord("H")
OP_INVOKE = ord("I")
OP_LOAD = ord("L")
OP_PREFETCH = ord("P")
OP_SWAP_OUT = ord("S")
OP_REPLY_CHANNEL = ord("R")
MAX_DEVICE = 2**31 - 1  # a CUdevice is a C int

_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_decode = json.JSONDecoder().decode  # str -> value; same errors as json.loads


# --------------------------------------------------------------------------------------------
# configuration and handler import


def _parse_args(argv):
    opts = {
        "socket": os.environ.get("HEARTH_SOCKET") or DEFAULT_SOCKET,
        "code_dir": os.environ.get("HEARTH_CODE_DIR") or DEFAULT_CODE_DIR,
        "handler": os.environ.get("HEARTH_HANDLER") or DEFAULT_HANDLER,
        "generic": (os.environ.get("HEARTH_GENERIC") or "").lower() in ("1", "true", "yes"),
    }
    flags = {"--socket": "socket", "--code-dir": "code_dir", "--handler": "handler"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if arg == "--generic":
            opts["generic"] = True
            i += 1
        elif name in flags and eq:
            opts[flags[name]] = value
            i += 1
        elif arg in flags and i + 1 < len(argv):
            opts[flags[arg]] = argv[i + 1]
            i += 2
        else:
            sys.stderr.write(
                "hearth_agent: unknown or incomplete argument %r\n"
                "usage: hearth_agent.py [--socket PATH] [--code-dir DIR] "
                "[--handler module.function | --generic]\n" % arg
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


# A module name as HEARTH_PREIMPORT may give it: dotted identifiers (the worker validates too).
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
MAX_PREIMPORT = 64  # names imported at most; a layer provides a handful


def add_deps(deps_dir):
    """Puts a dependency layer on sys.path. Called before the code dir is inserted at 0, so the
    function's own modules still win over the layer's (code, then deps, then the stdlib)."""
    if deps_dir and deps_dir not in sys.path:
        sys.path.insert(0, deps_dir)


def preimport(names):
    """Imports the layer's top-level modules before the agent reports ready, so that a handler's
    ``import numpy`` is a sys.modules lookup. A module that fails to import is logged and
    skipped: the handler then imports it itself and gets its own error. Returns (imported, us)."""
    t0 = perf_counter_ns()
    done = 0
    for name in names.split(",")[:MAX_PREIMPORT] if names else ():
        name = name.strip()
        if not name:
            continue
        if not _MODULE_NAME.match(name) or len(name) > 200:
            sys.stderr.write("hearth_agent: preimport: skipped an invalid module name\n")
            continue
        try:
            importlib.import_module(name)
            done += 1
        except BaseException as exc:  # ImportError, SystemExit from module code, ...
            sys.stderr.write(
                "hearth_agent: preimport of %s failed: %s: %s\n"
                % (name, type(exc).__name__, str(exc)[:MAX_MESSAGE])
            )
    return done, (perf_counter_ns() - t0) // 1000


def load_handler(code_dir, spec):
    """Import ``module.function`` from code_dir. Returns (handler, init_us, init_error_body)."""
    sys.path.insert(0, code_dir)
    importlib.invalidate_caches()  # code_dir may have been mounted after we started
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


def _env_key_allowed(key):
    return (
        bool(key)
        and "=" not in key
        and "\0" not in key
        and key != "PATH"
        and not key.startswith("HEARTH_")
    )


def _parse_load(payload):
    """The load request as (handler, code_dir, env pairs), or an error message (a str)."""
    try:
        doc = _decode(payload.decode())
    except Exception as exc:
        return "load payload is not valid JSON: %s" % exc
    if not isinstance(doc, dict):
        return "load payload must be a JSON object"
    handler = doc.get("handler")
    code_dir = doc.get("code_dir", DEFAULT_CODE_DIR)
    env = doc.get("env", {})
    if not isinstance(handler, str) or not handler:
        return "load payload needs \"handler\": \"module.function\""
    if not isinstance(code_dir, str) or not code_dir or "\0" in code_dir:
        return "load payload's \"code_dir\" must be a non-empty string"
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return "load payload's \"env\" must be an object of strings"
    return handler, code_dir, env


# --------------------------------------------------------------------------------------------
# the CUDA shim (runtime/gpu-shim), present in GPU sandboxes only


class Shim:
    """The shim's control API, reached through the process-wide symbols LD_PRELOAD put there."""

    def __init__(self, lib, ctypes):
        self.prefetch = lib.hearth_shim_prefetch
        self.prefetch.argtypes = [ctypes.c_int]
        self.prefetch.restype = ctypes.c_int
        self.swap_out = lib.hearth_shim_swap_out
        self.swap_out.argtypes = []
        self.swap_out.restype = ctypes.c_int
        self.resident_bytes = lib.hearth_shim_resident_bytes
        self.resident_bytes.argtypes = []
        self.resident_bytes.restype = ctypes.c_ulonglong
        self.regions = lib.hearth_shim_regions
        self.regions.argtypes = []
        self.regions.restype = ctypes.c_int


def find_shim():
    """The loaded shim, or None. Looked up once, at start."""
    # Without LD_PRELOAD the shim cannot be there: CPU sandboxes skip importing ctypes.
    if not os.environ.get("LD_PRELOAD"):
        return None
    try:
        import ctypes

        return Shim(ctypes.CDLL(None), ctypes)
    except (ImportError, OSError, AttributeError):
        return None


def _first_read(conn, mv):
    """A connection's first read, which may carry a descriptor (op R): (bytes read, the socket
    passed with them or None). The kernel ends a read at the message that carries descriptors,
    so they come with the R frame's 16 bytes and nothing after them."""
    data, fds, flags, _ = socket.recv_fds(conn, len(mv), 1)
    n = len(data)
    mv[:n] = data
    if len(fds) != 1 or flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        return n, None
    try:
        out = socket.socket(fileno=fds[0])
    except OSError:  # not a socket
        os.close(fds[0])
        return n, None
    if out.family != socket.AF_UNIX or out.type != socket.SOCK_STREAM:
        out.close()
        return n, None
    out.setblocking(True)
    return n, out


def _parse_prefetch(payload):
    """The device ordinal of a prefetch request, or an error message (a str)."""
    try:
        doc = _decode(payload.decode())
    except Exception as exc:
        return "prefetch payload is not valid JSON: %s" % exc
    device = doc.get("device") if isinstance(doc, dict) else None
    if type(device) is not int or not 0 <= device <= MAX_DEVICE:
        return "prefetch payload needs \"device\": a device ordinal from 0 to %d" % MAX_DEVICE
    return device


# --------------------------------------------------------------------------------------------
# frames


class Agent:
    def __init__(self, handler, init_us, init_error, generic=False, shim=None):
        self.generic = generic
        self.shim = shim
        self._rbuf = bytearray(RECV_SIZE)
        self._rmv = memoryview(self._rbuf)
        if generic:
            self.handler = None
            self.init_error = None
            self.health_status = 200
            self.health_body = b'{"status":"generic","pid":%d}' % os.getpid()
        else:
            self._loaded(handler, init_us, init_error)

    def _loaded(self, handler, init_us, init_error):
        self.generic = False
        self.handler = handler
        self.init_error = init_error
        if init_error is None:
            self.health_status = 200
            self.health_body = b'{"status":"ok","init_us":%d,"pid":%d}' % (init_us, os.getpid())
        else:
            self.health_status = 500
            self.health_body = init_error

    def load(self, payload):
        """Specializes a generic agent: env, chdir, sys.path, import. Returns (status, body)."""
        if not self.generic:
            return 409, _error_body("AlreadyLoaded", "a handler is already loaded", "request")
        parsed = _parse_load(payload)
        if isinstance(parsed, str):
            return 400, _error_body("BadRequest", parsed, "request")
        handler_spec, code_dir, env = parsed
        environ = os.environ
        # The handler sees the environment of a sandbox made for it: nothing says it was generic.
        environ.pop("HEARTH_GENERIC", None)
        environ.pop("HEARTH_PREIMPORT", None)
        for key, value in (("HEARTH_HANDLER", handler_spec), ("HEARTH_CODE_DIR", code_dir)):
            try:
                environ[key] = value
            except (ValueError, OSError):  # not encodable: chdir or the import reports it
                pass
        for key, value in env.items():
            if _env_key_allowed(key) and "\0" not in value:
                try:
                    environ[key] = value
                except (ValueError, OSError):  # not encodable (lone surrogates), too long
                    pass
        try:
            # The code is mounted over code_dir after we started: the old cwd is the covered one.
            os.chdir(code_dir)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            body = _error_body(type(exc).__name__, "cannot enter code_dir: %s" % reason, "init", "")
            self._loaded(None, 0, body)
        else:
            self._loaded(*load_handler(code_dir, handler_spec))
        if self.init_error is not None:
            sys.stderr.write("hearth_agent: handler init failed: %s\n" % self.init_error.decode())
        return self.health_status, self.health_body

    def move_memory(self, op, payload):
        """Prefetch (P) to a device or swap out (S) to the host. Returns (status, body)."""
        shim = self.shim
        if shim is None:
            return 409, _error_body("NoShim", "the CUDA shim is not loaded in this sandbox", "request")
        if op == OP_PREFETCH:
            device = _parse_prefetch(payload)
            if isinstance(device, str):
                return 400, _error_body("BadRequest", device, "request")
            rc = shim.prefetch(device)
            what = "prefetch to device %d" % device
        else:
            rc = shim.swap_out()
            what = "swap out to host memory"
        if rc != 0:
            return 500, _error_body("CudaError", "%s failed: CUresult %d" % (what, rc), "request")
        return 200, b'{"resident_bytes":%d,"regions":%d}' % (shim.resident_bytes(), shim.regions())

    # One connection: serve frames until the peer closes it.
    # The answers go on the socket an R frame passed, if the connection began with one.
    def serve_connection(self, conn):
        start = 0
        end, out = _first_read(conn, self._rmv)  # unconsumed bytes are buf[start:end]
        if out is None:
            out = conn
        elif end >= REQ_HDR_SIZE and REQ_HDR.unpack_from(self._rbuf, 0)[:2] == (0, OP_REPLY_CHANNEL):
            start = REQ_HDR_SIZE
        else:  # a socket came with something else than an R frame: not ours to keep
            out.close()
            out = conn
        try:
            self._serve(conn, out, start, end)
        finally:
            if out is not conn:
                out.close()

    # The frame loop: requests from conn, answers on out.
    def _serve(self, conn, out, start, end):
        recv_into = conn.recv_into
        sendall = out.sendall
        sendmsg = out.sendmsg
        unpack_from = REQ_HDR.unpack_from
        pack = RESP_HDR.pack
        buf = self._rbuf
        mv = self._rmv
        cap = len(buf)
        resident = self.shim.resident_bytes if self.shim is not None else None
        rid = 0  # the id of the request being answered

        def send(status, body, exec_us=None, device_mem=None):
            size = len(body)
            flags = 0
            if exec_us is None:
                exec_us = 0
            else:
                flags = FLAG_EXEC_US
            if device_mem is None:
                hdr = pack(size, status, flags, exec_us, rid)
            else:
                hdr = RESP_HDR_MEM.pack(size, status, flags | FLAG_DEVICE_MEM, exec_us, rid, device_mem)
            if size <= SEND_JOIN_MAX:
                sendall(hdr + body)
                return
            sent = sendmsg((hdr, body))
            hlen = len(hdr)
            if sent < hlen:
                sendall(hdr[sent:])
                sent = hlen
            if sent < hlen + size:
                with memoryview(body) as bv:
                    sendall(bv[sent - hlen :])

        def answer_invoke(status, body, exec_us=None):
            # With the shim loaded every invoke answer says how much device memory is held.
            send(status, body, exec_us, resident() if resident is not None else None)

        while True:
            # ---- header
            if end - start < 16:
                if start == end:
                    start = end = 0
                elif start + 16 > cap:
                    buf[: end - start] = buf[start:end]
                    end -= start
                    start = 0
                while end - start < 16:
                    n = recv_into(mv[end:] if end else buf)
                    if not n:
                        return
                    end += n
            length, op, rid = unpack_from(buf, start)
            start += 16

            if length > MAX_PAYLOAD:
                send(413, _error_body(
                    "PayloadTooLarge",
                    "request payload of %d bytes is over the limit of %d bytes" % (length, MAX_PAYLOAD),
                    "request",
                ))
                return
            if (
                op != OP_INVOKE
                and op != OP_LOAD
                and op != OP_HEALTH
                and op != OP_PREFETCH
                and op != OP_SWAP_OUT
            ):
                # ---- unknown op: skip its payload, answer 400, keep the connection
                skip = min(length, end - start)
                start += skip
                length -= skip
                if start == end:
                    start = end = 0
                while length:
                    n = recv_into(mv, min(length, cap))
                    if not n:
                        return
                    length -= n
                if op == OP_REPLY_CHANNEL:
                    why = "op R must be the connection's first frame, with an empty payload and one socket"
                else:
                    why = "unknown op %d" % op
                send(400, _error_body("BadRequest", why, "request"))
                continue

            # ---- payload
            stop = start + length
            if stop <= end:
                payload = buf[start:stop] if length else b""
                start = stop
            elif length <= cap:
                if stop > cap:  # make room: move the partial payload to the front
                    buf[: end - start] = buf[start:end]
                    end -= start
                    start = 0
                    stop = length
                while end < stop:
                    n = recv_into(mv[end:])
                    if not n:
                        return
                    end += n
                payload = buf[start:stop]
                start = stop
            else:
                payload = bytearray(length)
                have = end - start
                payload[:have] = buf[start:end]
                start = end = 0
                with memoryview(payload) as pv:
                    while have < length:
                        n = recv_into(pv[have:])
                        if not n:
                            return
                        have += n

            # ---- dispatch
            if op == OP_INVOKE:
                handler = self.handler
                if handler is None:
                    if self.generic:
                        answer_invoke(503, _error_body("NotLoaded", "no handler is loaded yet", "request"))
                    else:
                        answer_invoke(500, self.init_error)
                    continue
                if payload:
                    try:
                        args = _decode(payload.decode())
                    except Exception as exc:  # ValueError, UnicodeDecodeError, RecursionError
                        answer_invoke(400, _error_body("BadRequest", "arguments are not valid JSON: %s" % exc, "request"))
                        continue
                else:
                    args = {}
                t0 = perf_counter_ns()
                try:
                    result = handler(args)
                except BaseException as exc:  # SystemExit/KeyboardInterrupt must not kill us
                    exec_us = (perf_counter_ns() - t0) // 1000
                    answer_invoke(500, _error_body(type(exc).__name__, str(exc), "exec", _last_traceback_lines()), exec_us)
                    continue
                exec_us = (perf_counter_ns() - t0) // 1000
                try:
                    out = _encode(result).encode()
                except Exception as exc:  # TypeError, ValueError (NaN, cycles), RecursionError
                    err = _error_body("TypeError", "handler result is not JSON-serializable: %s" % exc, "result")
                    answer_invoke(500, err, exec_us)
                    continue
                if MAX_RESULT and len(out) > MAX_RESULT:
                    err = _error_body(
                        "ResultTooLarge",
                        "the result is %d bytes, over the limit of %d bytes (max_result_bytes)"
                        % (len(out), MAX_RESULT),
                        "result",
                    )
                    answer_invoke(413, err, exec_us)
                    continue
                size = len(out)
                if size <= SEND_JOIN_MAX and resident is None:
                    sendall(pack(size, 200, FLAG_EXEC_US, exec_us, rid) + out)
                else:
                    answer_invoke(200, out, exec_us)
            elif op == OP_HEALTH:
                send(self.health_status, self.health_body)
            elif op == OP_LOAD:
                send(*self.load(payload))
            else:
                send(*self.move_memory(op, payload))

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

    shim = find_shim()
    add_deps(os.environ.get("HEARTH_DEPS") or "")
    if opts["generic"]:
        imported, preimport_us = preimport(os.environ.get("HEARTH_PREIMPORT") or "")
        agent = Agent(None, 0, None, generic=True, shim=shim)
        if imported:
            agent.health_body = b'{"status":"generic","pid":%d,"preimported":%d,"preimport_us":%d}' % (
                os.getpid(),
                imported,
                preimport_us,
            )
        init_error = None
    else:
        handler, init_us, init_error = load_handler(opts["code_dir"], opts["handler"])
        agent = Agent(handler, init_us, init_error, shim=shim)

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
