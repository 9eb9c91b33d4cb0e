//! The worker's side of the agent protocol: length-prefixed frames over one persistent
//! Unix-socket connection per sandbox (runtime/python/README.md), with the agent's answers on a
//! socket of their own.
//!
//! Hand-written on purpose: this is the hot path of every warm invocation. A request is one
//! vectored `write` of a 16-byte header (length, op, request id) and the payload; a reply is a
//! 24-byte header (length, status, flags, exec_us, request id) read with usually one `read`,
//! then the body. The body's length is checked against the limit before a byte of it is
//! buffered.
//!
//! The sandbox is hostile: its handler runs in the agent's process and can write frames of its
//! own on the answer socket. So every request carries a random id the agent echoes, and an
//! answer is taken only for the request in flight: one with another id, or bytes beyond the
//! answer, mean the connection is out of step and the sandbox is broken (a fatal error, never
//! another caller's answer). Every field is range-checked against what the agent can honestly
//! send for that op (statuses, flags, `exec_us` within the time the request took, device
//! memory), and a result nested deeper than [`MAX_RESULT_DEPTH`] is refused before anyone
//! parses it. The socket is opened without following anything the sandbox can change
//! ([`open_agent_socket`]).
//!
//! GPU sandboxes (docs/gpu.md) add two ops, `P` (prefetch the function's device memory to the
//! GPU) and `S` (swap it out to host memory), and every invoke answer of theirs carries the bytes
//! of device memory the CUDA shim holds, in an 8-byte extension of the header (flags bit 1).

use bytes::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use std::io::{IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Room beyond the result limit for an error answer (a handler's message and traceback; the
/// agent truncates long messages to fit).
pub const ERROR_MARGIN_BYTES: usize = 64 * 1024;

/// Request header: u32 BE payload length, op, 3 zero bytes, u64 BE request id.
const REQ_HEADER: usize = 16;
/// Response header: u32 BE body length, u16 BE status, u16 BE flags, u64 BE exec_us, u64 BE
/// request id (the id of the request it answers).
const RESP_HEADER: usize = 24;
/// Response flag: the exec_us field is present.
const FLAG_EXEC_US: u16 = 1;
/// Response flag: an 8-byte BE device-memory count follows the header (not counted in length).
const FLAG_DEVICE_MEMORY: u16 = 2;
/// The header extension of [`FLAG_DEVICE_MEMORY`].
const RESP_DEVICE_MEMORY: usize = 8;
const OP_HEALTH: u8 = b'H';
const OP_INVOKE: u8 = b'I';
const OP_LOAD: u8 = b'L';
const OP_PREFETCH: u8 = b'P';
const OP_SWAP_OUT: u8 = b'S';
/// The connection's first frame: its ancillary data carries the socket the agent answers on.
const OP_REPLY_CHANNEL: u8 = b'R';
/// The largest device ordinal the agent takes (it is a C `int` in the shim).
pub const MAX_DEVICE_ORDINAL: u32 = i32::MAX as u32;
/// The most of a `P`/`S` answer's body read: two small numbers, or an error document.
const GPU_OP_MAX_BODY: usize = 4096;
/// Receive buffer for headers and small bodies; a larger body is read straight into its own.
const RBUF_SIZE: usize = 16 * 1024;
/// The deepest nesting of arrays and objects a handler's result may have. A deeper one (a
/// sandbox can send 3,000,000 levels in 6 MB) would pass the worker, which never builds it, and
/// stop a recursive parser downstream; 128 is what serde_json parses by default.
pub const MAX_RESULT_DEPTH: usize = 128;
/// The most device memory an answer may claim, 16 TiB: more than any GPU with its host's
/// memory behind it holds; a larger number is a lie that would skew the GPU scheduler.
pub const MAX_DEVICE_MEMORY_BYTES: u64 = 1 << 44;
/// What a result nested deeper than [`MAX_RESULT_DEPTH`] becomes: the handler's failure, the
/// sandbox kept (its connection is in step; only the result is refused).
const TOO_DEEP_BODY: &[u8] = b"{\"type\":\"InvalidResult\",\"message\":\"the function's result is nested deeper than 128 levels\",\"phase\":\"result\"}";

/// One response from the agent.
#[derive(Debug, Clone)]
pub struct AgentReply {
    pub status: u16,
    /// Handler time measured inside the agent (the frame's exec_us, when flagged present).
    pub exec_us: Option<u64>,
    /// Bytes of device memory the sandbox's CUDA shim has recorded as held, read by the agent
    /// after the handler returned; present on the invoke answers of GPU sandboxes only.
    pub device_memory_bytes: Option<u64>,
    pub body: Bytes,
}

/// A GPU sandbox's device memory after a prefetch or swap-out: what the shim has recorded,
/// wherever it now lies (moving memory does not forget it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct GpuMemory {
    pub resident_bytes: u64,
    pub regions: u32,
}

/// A request failed. [`AgentError::NoShim`] and [`AgentError::Cuda`] are answers of a healthy
/// agent (the connection stays usable); every other variant means the connection failed (the
/// agent died or spoke nonsense) and the sandbox is not reusable.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent closed the connection")]
    Closed,
    #[error("agent connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("agent sent a malformed response: {0}")]
    Malformed(String),
    /// The agent announced a body over the limit: it was not read, so the connection is lost.
    #[error("the sandbox's answer of {size} bytes is over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// `P`/`S` to an agent without the CUDA shim loaded (409 `NoShim`): not a GPU sandbox.
    #[error("the CUDA shim is not loaded in this sandbox")]
    NoShim,
    /// `P`/`S` refused by the CUDA driver (500 `CudaError`); every region was still attempted.
    /// Only the `CUresult` is kept from the sandbox's message.
    #[error("the CUDA driver refused to move the sandbox's memory (CUresult {})",
            code.map_or_else(|| "unknown".to_string(), |c| c.to_string()))]
    Cuda { code: Option<i32> },
}

impl AgentError {
    /// Whether the connection is lost with this error (the sandbox must go), as opposed to a
    /// refusal answered by a healthy agent.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, AgentError::NoShim | AgentError::Cuda { .. })
    }
}

/// A persistent connection to one agent.
///
/// Requests go out on the connection to the agent's listening socket; answers come back on a
/// socket pair whose other end the worker passes to the agent in the connection's first frame
/// (op `R`). One socket per direction, because a Unix socket signals "writable" to everything
/// waiting on it each time its peer reads (the kernel's `unix_write_space`), and a waiter in a
/// blocking read is woken by that too. On one shared socket the worker's read of each answer
/// woke the agent, asleep in its `recv` for the next request, for nothing: two wake-ups per
/// invocation instead of one, on a 2-CPU guest where a wake-up costs more than the agent's
/// Python (bench/RESULTS.md). The answer socket is the only one registered with the runtime, for
/// reading; requests fit the socket buffer (they alternate with answers), so a write almost
/// never blocks, and when one does a duplicate of the request socket is registered for writing
/// until it is done.
pub struct AgentConn {
    /// Requests are written here; never read (the agent answers on `replies`).
    requests: UnixStream,
    replies: AsyncFd<UnixStream>,
    /// Received bytes not yet consumed are `rbuf[start..end]`.
    rbuf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The largest result body read (an error answer may add [`ERROR_MARGIN_BYTES`]).
    max_result: usize,
}

impl AgentConn {
    /// Connects to the agent at `path`; a 200 body over `max_result` bytes is never read.
    ///
    /// `path` lies in a directory the sandbox can write: it is opened with
    /// [`open_agent_socket`] (no symlink followed, a socket on the directory's own file system)
    /// and connected through the descriptor, so the worker never reaches another socket.
    pub async fn connect(path: &Path, max_result: usize) -> std::io::Result<Self> {
        let sock = open_agent_socket(path)?;
        // The magic link names the inode opened above; resolving it follows nothing the
        // sandbox can change. tokio's connect does not block the thread; its socket comes back
        // non-blocking.
        let via = format!("/proc/self/fd/{}", sock.as_raw_fd());
        let requests = tokio::net::UnixStream::connect(&via).await?.into_std()?;
        drop(sock);
        let (replies, theirs) = UnixStream::pair()?;
        replies.set_nonblocking(true)?;
        send_reply_channel(&requests, &theirs)?;
        // The agent holds the only other end now: its exit reads as end of file on `replies`.
        drop(theirs);
        Ok(AgentConn {
            requests,
            replies: register(replies, Interest::READABLE)?,
            rbuf: vec![0u8; RBUF_SIZE].into_boxed_slice(),
            start: 0,
            end: 0,
            max_result,
        })
    }

    /// Op `I`: calls the handler with `args` (JSON; empty means `{}`).
    ///
    /// A 200 result nested deeper than [`MAX_RESULT_DEPTH`] comes back as the handler's failure
    /// (500, `InvalidResult`); the sandbox stays usable.
    pub async fn invoke(&mut self, args: &[u8]) -> Result<AgentReply, AgentError> {
        let mut reply = self.request(OP_INVOKE, args).await?;
        if reply.status == 200 && nests_deeper_than(&reply.body, MAX_RESULT_DEPTH) {
            reply.status = 500;
            reply.body = Bytes::from_static(TOO_DEEP_BODY);
        }
        Ok(reply)
    }

    /// Op `H`: after start-up this says whether the handler imported (or that the agent is
    /// generic, waiting for [`AgentConn::load`]).
    pub async fn health(&mut self) -> Result<AgentReply, AgentError> {
        self.request(OP_HEALTH, &[]).await
    }

    /// Op `L`: specializes a generic agent to one function (env, chdir into `code_dir`, import
    /// `handler`). Answers as health does afterwards; 409 if a handler is already loaded.
    pub async fn load(
        &mut self,
        handler: &str,
        code_dir: &str,
        env: &[(String, String)],
    ) -> Result<AgentReply, AgentError> {
        let payload = serde_json::to_vec(&LoadRequest {
            handler,
            code_dir,
            env: EnvMap(env),
        })
        .map_err(std::io::Error::from)?;
        self.request(OP_LOAD, &payload).await
    }

    /// Op `P`: moves every region the CUDA shim recorded to device `device` (the ordinal inside
    /// the sandbox) and waits for the moves to finish.
    pub async fn prefetch(&mut self, device: u32) -> Result<GpuMemory, AgentError> {
        if device > MAX_DEVICE_ORDINAL {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "device ordinal over 2^31-1",
            )
            .into());
        }
        let payload = format!("{{\"device\":{device}}}");
        self.gpu_op(OP_PREFETCH, payload.as_bytes()).await
    }

    /// Op `S`: moves every region the CUDA shim recorded to host memory and waits for it.
    pub async fn swap_out(&mut self) -> Result<GpuMemory, AgentError> {
        self.gpu_op(OP_SWAP_OUT, &[]).await
    }

    async fn gpu_op(&mut self, op: u8, payload: &[u8]) -> Result<GpuMemory, AgentError> {
        // Two numbers are expected: a body over this is nonsense, and is not buffered.
        let reply = self.request_within(op, payload, GPU_OP_MAX_BODY).await?;
        gpu_memory_answer(&reply)
    }

    async fn request(&mut self, op: u8, payload: &[u8]) -> Result<AgentReply, AgentError> {
        self.request_within(op, payload, self.max_result).await
    }

    /// Sends one request and reads its answer; a 200 body over `max_body` is not read.
    ///
    /// The answer must carry the request's id, a status and flags the agent answers `op` with,
    /// and an `exec_us` no longer than the request took; nothing may follow it. Anything else
    /// is [`AgentError::Malformed`]: the sandbox wrote frames of its own and is not reusable.
    async fn request_within(
        &mut self,
        op: u8,
        payload: &[u8],
        max_body: usize,
    ) -> Result<AgentReply, AgentError> {
        if self.start != self.end {
            return Err(AgentError::Malformed(
                "bytes arrived before a request was sent".into(),
            ));
        }
        let len = u32::try_from(payload.len()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "request payload over 4 GiB",
            )
        })?;
        // Unpredictable, so a frame written before this request was sent cannot answer it.
        let id: u64 = rand::random();
        let hdr = request_header(len, op, id);
        let sent = std::time::Instant::now();
        let written = self.write_now(&hdr, payload)?;
        if written < REQ_HEADER + payload.len() {
            self.write_rest(&hdr, payload, written).await?;
        }
        let reply = self.read_reply(id, max_body).await?;
        if self.start != self.end {
            return Err(AgentError::Malformed(
                "more bytes followed the answer".into(),
            ));
        }
        check_reply(op, &reply, sent.elapsed())?;
        Ok(reply)
    }

    /// Writes what the socket takes without waiting; how many bytes of header + payload.
    fn write_now(&self, hdr: &[u8], payload: &[u8]) -> Result<usize, AgentError> {
        let mut written = 0;
        while written < hdr.len() + payload.len() {
            match write_from(&self.requests, hdr, payload, written) {
                Ok(0) => return Err(AgentError::Closed),
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(written)
    }

    /// The rest of a request the socket buffer did not take at once (a large payload): waits
    /// for room through a duplicate of the socket registered for writing while it lasts.
    async fn write_rest(
        &self,
        hdr: &[u8],
        payload: &[u8],
        mut written: usize,
    ) -> Result<(), AgentError> {
        let w = register(self.requests.try_clone()?, Interest::WRITABLE)?;
        while written < hdr.len() + payload.len() {
            let mut ready = w.writable().await?;
            match ready.try_io(|s| write_from(s.get_ref(), hdr, payload, written)) {
                Ok(Ok(0)) => return Err(AgentError::Closed),
                Ok(Ok(n)) => written += n,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Reads until at least `n` (at most [`RBUF_SIZE`]) unconsumed bytes are buffered.
    async fn fill(&mut self, n: usize) -> Result<(), AgentError> {
        while self.end - self.start < n {
            if self.start > 0 {
                self.rbuf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            match read_some(&self.replies, &mut self.rbuf[self.end..]).await? {
                0 => return Err(AgentError::Closed),
                n => self.end += n,
            }
        }
        Ok(())
    }

    /// Reads the answer to the request `id`: a header with another id is refused before its
    /// body is read.
    async fn read_reply(&mut self, id: u64, max_body: usize) -> Result<AgentReply, AgentError> {
        self.fill(RESP_HEADER).await?;
        let mut hdr = [0u8; RESP_HEADER];
        hdr.copy_from_slice(&self.rbuf[self.start..self.start + RESP_HEADER]);
        self.start += RESP_HEADER;
        let head = parse_header(&hdr)?;
        if head.id != id {
            return Err(AgentError::Malformed("an answer to another request".into()));
        }
        let device_memory_bytes = if head.device_memory {
            self.fill(RESP_DEVICE_MEMORY).await?;
            let mut ext = [0u8; RESP_DEVICE_MEMORY];
            ext.copy_from_slice(&self.rbuf[self.start..self.start + RESP_DEVICE_MEMORY]);
            self.start += RESP_DEVICE_MEMORY;
            Some(u64::from_be_bytes(ext))
        } else {
            None
        };

        // Code in the sandbox may bypass the agent's own check: never buffer more.
        let limit = if head.status == 200 {
            max_body
        } else {
            max_body.saturating_add(ERROR_MARGIN_BYTES)
        };
        if head.len > limit {
            return Err(AgentError::TooLarge {
                size: head.len,
                limit: max_body,
            });
        }

        let mut body = vec![0u8; head.len];
        let mut have = head.len.min(self.end - self.start);
        body[..have].copy_from_slice(&self.rbuf[self.start..self.start + have]);
        self.start += have;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        while have < head.len {
            match read_some(&self.replies, &mut body[have..]).await? {
                0 => return Err(AgentError::Closed),
                n => have += n,
            }
        }
        Ok(AgentReply {
            status: head.status,
            exec_us: head.exec_us,
            device_memory_bytes,
            body: Bytes::from(body),
        })
    }
}

/// A request frame's header: u32 BE payload length, op, 3 zero bytes, u64 BE request id.
fn request_header(len: u32, op: u8, id: u64) -> [u8; REQ_HEADER] {
    let mut hdr = [0u8; REQ_HEADER];
    hdr[..4].copy_from_slice(&len.to_be_bytes());
    hdr[4] = op;
    hdr[8..].copy_from_slice(&id.to_be_bytes());
    hdr
}

/// Opens the agent's socket at `path` as an `O_PATH` descriptor without following a symlink in
/// its last component (the sandbox can replace that file; the directories above it are the
/// worker's), and checks it is a socket on the same file system as its directory (the
/// sandbox's run tmpfs: no host socket lies there). A symlink is opened as itself and refused
/// as `ENOTSOCK`, like any other file that is not a socket; a socket elsewhere is `EXDEV`. The
/// caller retries until the agent listens or its start times out.
pub fn open_agent_socket(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let open = |p: &Path, extra: libc::c_int| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | extra)
            .open(p)
    };
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no directory"))?;
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let dir_dev = open(dir, libc::O_DIRECTORY)?.metadata()?.dev();
    let sock = open(path, 0)?;
    let meta = sock.metadata()?;
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::from_raw_os_error(libc::ENOTSOCK));
    }
    if meta.dev() != dir_dev {
        return Err(std::io::Error::from_raw_os_error(libc::EXDEV));
    }
    Ok(sock)
}

/// Whether an answer to `op` is one the agent can honestly send: its status in the op's set
/// (runtime/python/README.md), `exec_us` on invoke answers only and within `took` (the agent
/// times the handler inside the request's round trip, on the same monotonic clock), the
/// device-memory extension on invoke answers only and under [`MAX_DEVICE_MEMORY_BYTES`].
fn check_reply(op: u8, reply: &AgentReply, took: std::time::Duration) -> Result<(), AgentError> {
    let allowed: &[u16] = match op {
        OP_INVOKE => &[200, 400, 413, 500, 503],
        OP_HEALTH => &[200, 500],
        OP_LOAD => &[200, 400, 409, 500],
        _ => &[200, 400, 409, 500], // P and S
    };
    if !allowed.contains(&reply.status) {
        return Err(AgentError::Malformed(format!(
            "status {} to op {}",
            reply.status,
            char::from(op)
        )));
    }
    if let Some(exec_us) = reply.exec_us {
        if op != OP_INVOKE {
            return Err(AgentError::Malformed(
                "exec_us on a non-invoke answer".into(),
            ));
        }
        if u128::from(exec_us) > took.as_micros() {
            return Err(AgentError::Malformed(
                "exec_us longer than the request took".into(),
            ));
        }
    }
    if let Some(bytes) = reply.device_memory_bytes {
        if op != OP_INVOKE {
            return Err(AgentError::Malformed(
                "device memory on a non-invoke answer".into(),
            ));
        }
        if bytes > MAX_DEVICE_MEMORY_BYTES {
            return Err(AgentError::Malformed("device memory over 16 TiB".into()));
        }
    }
    Ok(())
}

/// Whether the JSON text `body` nests arrays and objects deeper than `limit`. A scan of the
/// bytes that builds nothing (the result is passed on as bytes): strings are skipped with
/// their escapes, so brackets inside them do not count. Whether the text is JSON at all is
/// checked later (`raw_json`); on text that is not, the count may be anything.
fn nests_deeper_than(body: &[u8], limit: usize) -> bool {
    if body.len() <= limit {
        return false; // each level takes a byte
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Sends the `R` frame with `theirs` attached (SCM_RIGHTS). The connection is new and its
/// buffer empty, so the 8 bytes go out at once or not at all.
fn send_reply_channel(requests: &UnixStream, theirs: &UnixStream) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::mem::MaybeUninit;
    use std::os::fd::AsFd;
    let hdr = request_header(0, OP_REPLY_CHANNEL, 0);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [theirs.as_fd()];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("no room for the reply socket"));
    }
    let sent = rustix::net::sendmsg(
        requests,
        &[IoSlice::new(&hdr)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != hdr.len() {
        return Err(std::io::Error::other(
            "the agent's connection did not take the reply-channel frame",
        ));
    }
    Ok(())
}

/// One write of header + payload from byte `written` on (vectored while the header is not out).
fn write_from(
    mut sock: &UnixStream,
    hdr: &[u8],
    payload: &[u8],
    written: usize,
) -> std::io::Result<usize> {
    if written < hdr.len() {
        sock.write_vectored(&[IoSlice::new(&hdr[written..]), IoSlice::new(payload)])
    } else {
        sock.write(&payload[written - hdr.len()..])
    }
}

/// Registers a socket with the runtime for `interest`.
fn register(sock: UnixStream, interest: Interest) -> std::io::Result<AsyncFd<UnixStream>> {
    // SAFETY: the `UnixStream` owns its descriptor and is only reached through `get_ref`, so the
    // descriptor stays open and the same for as long as the `AsyncFd` lives.
    unsafe { AsyncFd::register_with_interest(sock, interest) }.map_err(|e| e.into_parts().1)
}

/// Reads into `buf` once the socket has data; 0 means the agent closed it.
///
/// A read that did not fill `buf` drained the socket, so the readiness is cleared then and there
/// (as tokio's own streams do): otherwise the next answer's read would start with a read that
/// can only fail with `WouldBlock`, one wasted system call per invocation. Any byte that arrives
/// after the read raises a new edge-triggered event, so nothing is missed.
async fn read_some(sock: &AsyncFd<UnixStream>, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        let mut ready = sock.readable().await?;
        match ready.try_io(|s| s.get_ref().read(buf)) {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Ok(n)) => {
                if n > 0 && n < buf.len() {
                    ready.clear_ready();
                }
                return Ok(n);
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
}

/// A decoded response header.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    len: usize,
    status: u16,
    exec_us: Option<u64>,
    /// The device-memory extension follows the header.
    device_memory: bool,
    /// The id of the request answered.
    id: u64,
}

fn parse_header(h: &[u8; RESP_HEADER]) -> Result<Head, AgentError> {
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let status = u16::from_be_bytes([h[4], h[5]]);
    let flags = u16::from_be_bytes([h[6], h[7]]);
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let exec_us = word(8);
    if !(100..=599).contains(&status) {
        return Err(AgentError::Malformed(format!("status {status}")));
    }
    if flags & !(FLAG_EXEC_US | FLAG_DEVICE_MEMORY) != 0 {
        return Err(AgentError::Malformed(format!("unknown flags {flags:#x}")));
    }
    let exec_us = if flags & FLAG_EXEC_US != 0 {
        Some(exec_us)
    } else if exec_us != 0 {
        return Err(AgentError::Malformed("exec_us set but not flagged".into()));
    } else {
        None
    };
    Ok(Head {
        len,
        status,
        exec_us,
        device_memory: flags & FLAG_DEVICE_MEMORY != 0,
        id: word(16),
    })
}

/// The outcome of a `P`/`S` answer: 200 `{"resident_bytes":N,"regions":M}`, 409 `NoShim`, 500
/// `CudaError` with the `CUresult` in its message; anything else is malformed.
fn gpu_memory_answer(reply: &AgentReply) -> Result<GpuMemory, AgentError> {
    #[derive(serde::Deserialize)]
    struct ErrorBody<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
        #[serde(default, borrow)]
        message: std::borrow::Cow<'a, str>,
    }
    if reply.status == 200 {
        return serde_json::from_slice::<GpuMemory>(&reply.body)
            .map_err(|_| AgentError::Malformed("a memory move answered a bad body".into()));
    }
    let err: Option<ErrorBody> = serde_json::from_slice(&reply.body).ok();
    match (reply.status, err) {
        (409, Some(e)) if e.kind == "NoShim" => Err(AgentError::NoShim),
        (500, Some(e)) if e.kind == "CudaError" => Err(AgentError::Cuda {
            code: cuda_result_in(&e.message),
        }),
        (status, _) => Err(AgentError::Malformed(format!(
            "a memory move answered status {status}"
        ))),
    }
}

/// The number after `CUresult ` in the agent's message (`prefetch to device 0 failed: CUresult
/// 2`), if it is one.
fn cuda_result_in(message: &str) -> Option<i32> {
    let (_, rest) = message.rsplit_once("CUresult ")?;
    let digits = rest
        .char_indices()
        .take_while(|&(i, c)| c.is_ascii_digit() || (i == 0 && c == '-'))
        .count();
    rest[..digits].parse().ok()
}

/// The `L` payload: `{"handler": ..., "code_dir": ..., "env": {K: V, ...}}`.
#[derive(serde::Serialize)]
struct LoadRequest<'a> {
    handler: &'a str,
    code_dir: &'a str,
    env: EnvMap<'a>,
}

/// Env pairs serialized as a JSON object without building a map.
struct EnvMap<'a>(&'a [(String, String)]);

impl Serialize for EnvMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{UnixListener, UnixStream};

    thread_local! {
        /// The id of the last request a fake agent read ([`read_frame`]): [`reply`] answers it.
        /// Each test's runtime (current-thread) runs its fake agent on the test's thread.
        static LAST_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// An answer to the last request read.
    fn reply(status: u16, exec_us: Option<u64>, body: &[u8]) -> Vec<u8> {
        reply_to(LAST_ID.get(), status, exec_us, body)
    }

    /// An answer to the request `id`.
    fn reply_to(id: u64, status: u16, exec_us: Option<u64>, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&status.to_be_bytes());
        v.extend_from_slice(&(exec_us.is_some() as u16).to_be_bytes());
        v.extend_from_slice(&exec_us.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    /// A GPU sandbox's answer to the last request read: flags bit 1 and the device-memory
    /// extension after the header.
    fn reply_mem(status: u16, exec_us: Option<u64>, device_mem: u64, body: &[u8]) -> Vec<u8> {
        reply_mem_to(LAST_ID.get(), status, exec_us, device_mem, body)
    }

    fn reply_mem_to(
        id: u64,
        status: u16,
        exec_us: Option<u64>,
        device_mem: u64,
        body: &[u8],
    ) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&status.to_be_bytes());
        v.extend_from_slice(&(exec_us.is_some() as u16 | 2).to_be_bytes());
        v.extend_from_slice(&exec_us.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(&device_mem.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    /// Reads one request frame: (op, payload); its id is kept for [`reply`].
    async fn read_frame(s: &mut UnixStream) -> Option<(u8, Vec<u8>)> {
        let mut hdr = [0u8; 16];
        s.read_exact(&mut hdr).await.ok()?;
        assert_eq!(&hdr[5..8], &[0, 0, 0], "reserved bytes are zero");
        let len = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
        let mut id = [0u8; 8];
        id.copy_from_slice(&hdr[8..]);
        LAST_ID.set(u64::from_be_bytes(id));
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.ok()?;
        Some((hdr[4], payload))
    }

    /// Accepts the worker's connection as the agent does: its first frame is `R` and carries
    /// the socket to answer on. Returns (requests, answers).
    async fn accept(listener: &UnixListener) -> (UnixStream, UnixStream) {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        use std::mem::MaybeUninit;
        let (s, _) = listener.accept().await.unwrap();
        let mut hdr = [0u8; 16];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            s.readable().await.unwrap();
            let r = s.try_io(Interest::READABLE, || {
                let mut iov = [std::io::IoSliceMut::new(&mut hdr)];
                Ok(rustix::net::recvmsg(&s, &mut iov, &mut control, RecvFlags::empty())?.bytes)
            });
            match r {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(
            &hdr[..got],
            &[0, 0, 0, 0, b'R', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            "the first frame is R"
        );
        let mut fds = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(passed) = m {
                fds.extend(passed);
            }
        }
        assert_eq!(fds.len(), 1, "R carries one socket");
        let out = std::os::unix::net::UnixStream::from(fds.pop().unwrap());
        out.set_nonblocking(true).unwrap();
        (s, UnixStream::from_std(out).unwrap())
    }

    fn listen() -> (tempfile::TempDir, std::path::PathBuf, UnixListener) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = UnixListener::bind(&path).unwrap();
        (dir, path, listener)
    }

    #[test]
    fn headers_decode_and_bad_ones_are_malformed() {
        let ok = reply_to(0x0102_0304_0506_0708, 200, Some(17), b"");
        let h: [u8; 24] = ok[..24].try_into().unwrap();
        assert_eq!(
            parse_header(&h).unwrap(),
            Head {
                len: 0,
                status: 200,
                exec_us: Some(17),
                device_memory: false,
                id: 0x0102_0304_0506_0708,
            }
        );
        for unknown in [4u16, 5, 0x8001] {
            let mut bad = h;
            bad[6..8].copy_from_slice(&unknown.to_be_bytes());
            assert!(
                matches!(parse_header(&bad), Err(AgentError::Malformed(_))),
                "{unknown:#x}"
            );
        }
        let mut gpu = h;
        gpu[7] = 3; // exec_us and device memory
        assert_eq!(
            parse_header(&gpu).unwrap(),
            Head {
                len: 0,
                status: 200,
                exec_us: Some(17),
                device_memory: true,
                id: 0x0102_0304_0506_0708,
            }
        );
        let mut bad = h;
        bad[7] = 0; // exec_us without its flag
        assert!(matches!(parse_header(&bad), Err(AgentError::Malformed(_))));
        let mut bad = h;
        bad[4..6].copy_from_slice(&0u16.to_be_bytes());
        assert!(matches!(parse_header(&bad), Err(AgentError::Malformed(_))));
        let mut bad = h;
        bad[4..6].copy_from_slice(&(b'H' as u16 * 256 + b'T' as u16).to_be_bytes()); // "HT"TP
        assert!(matches!(parse_header(&bad), Err(AgentError::Malformed(_))));
    }

    #[tokio::test]
    async fn round_trips_over_a_unix_socket_with_split_writes() {
        let (_dir, path, listener) = listen();
        let server = tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            for i in 0..3u64 {
                let (op, payload) = read_frame(&mut s).await.unwrap();
                let frame = if i < 2 {
                    assert_eq!(op, b'I');
                    assert_eq!(payload, format!("{{\"i\":{i}}}").into_bytes());
                    reply(200, Some(5 + i), b"{\"ok\":true}")
                } else {
                    assert_eq!((op, payload.len()), (b'H', 0));
                    reply(500, None, b"{\"type\":\"X\"}")
                };
                // the header byte by byte, then the body in two pieces
                for b in &frame[..24] {
                    out.write_all(&[*b]).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                out.write_all(&frame[24..28]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                out.write_all(&frame[28..]).await.unwrap();
            }
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        for i in 0..2u64 {
            let r = c.invoke(format!("{{\"i\":{i}}}").as_bytes()).await.unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.exec_us, Some(5 + i));
            assert_eq!(&r.body[..], b"{\"ok\":true}");
        }
        let r = c.health().await.unwrap();
        assert_eq!((r.status, r.exec_us), (500, None));
        assert_eq!(&r.body[..], b"{\"type\":\"X\"}");
        server.await.unwrap();
        assert!(matches!(
            c.invoke(b"{}").await,
            Err(AgentError::Closed | AgentError::Io(_))
        ));
    }

    #[tokio::test]
    async fn answers_are_read_from_the_passed_socket_only() {
        let (_dir, path, listener) = listen();
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let _ = read_frame(&mut s).await;
            // Whatever arrives on the request connection is not an answer.
            s.write_all(&reply(500, None, b"{\"wrong\":1}"))
                .await
                .unwrap();
            out.write_all(&reply(200, Some(1), b"{\"right\":1}"))
                .await
                .unwrap();
            let _ = read_frame(&mut s).await;
            // The answer socket closes (the agent died) while the connection stays open.
            drop(out);
            let _ = closed_rx.await;
            drop(s);
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"{\"right\":1}"[..]));
        assert!(matches!(c.health().await, Err(AgentError::Closed)));
        let _ = closed_tx.send(());
    }

    #[tokio::test]
    async fn a_large_payload_and_body_round_trip() {
        let (_dir, path, listener) = listen();
        let big = vec![b'x'; 3 << 20];
        let expect = big.clone();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let (op, payload) = read_frame(&mut s).await.unwrap();
            assert_eq!(op, b'I');
            assert!(payload == expect);
            out.write_all(&reply(200, Some(1), &payload)).await.unwrap();
            let (_, small) = read_frame(&mut s).await.unwrap();
            out.write_all(&reply(200, None, &small)).await.unwrap();
        });
        let mut c = AgentConn::connect(&path, 4 << 20).await.unwrap();
        // Over the socket buffer: the write waits for room, then the connection reads only.
        let r = c.invoke(&big).await.unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body[..] == big[..]);
        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!(&r.body[..], b"{}");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_before_it_is_read() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let _ = read_frame(&mut s).await;
            // Announces 1 GiB; sends only the header.
            let mut frame = reply(200, Some(1), b"");
            frame[..4].copy_from_slice(&(1u32 << 30).to_be_bytes());
            let _ = out.write_all(&frame).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = AgentConn::connect(&path, 1000).await.unwrap();
        match c.invoke(b"{}").await {
            Err(AgentError::TooLarge { size, limit }) => {
                assert_eq!((size, limit), (1 << 30, 1000));
            }
            other => panic!("{other:?}"),
        }
        assert!(c.rbuf.len() < 1 << 20);
    }

    #[tokio::test]
    async fn error_answers_get_the_margin_and_no_more() {
        let (_dir, path, listener) = listen();
        let limit = 1000;
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            // an error answer within the margin is read; one past it is refused
            let _ = read_frame(&mut s).await;
            let within = vec![b'e'; limit + ERROR_MARGIN_BYTES];
            out.write_all(&reply(500, Some(2), &within)).await.unwrap();
            let _ = read_frame(&mut s).await;
            let mut frame = reply(413, Some(2), b"");
            frame[..4].copy_from_slice(&((limit + ERROR_MARGIN_BYTES + 1) as u32).to_be_bytes());
            let _ = out.write_all(&frame).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = AgentConn::connect(&path, limit).await.unwrap();
        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!((r.status, r.body.len()), (500, limit + ERROR_MARGIN_BYTES));
        match c.invoke(b"{}").await {
            Err(AgentError::TooLarge { size, limit: l }) => {
                assert_eq!((size, l), (limit + ERROR_MARGIN_BYTES + 1, limit));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_reply_that_is_not_a_frame_is_malformed() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let _ = read_frame(&mut s).await;
            // an old HTTP agent's answer
            let _ = out
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                .await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        assert!(matches!(
            c.invoke(b"{}").await,
            Err(AgentError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn a_header_cut_short_is_closed() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let _ = read_frame(&mut s).await;
            let _ = out.write_all(&reply(200, None, b"{}")[..20]).await;
        });
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        assert!(matches!(c.health().await, Err(AgentError::Closed)));
    }

    #[tokio::test]
    async fn a_body_cut_short_is_closed() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let _ = read_frame(&mut s).await;
            let frame = reply(200, Some(1), &[b'a'; 40000]);
            let _ = out.write_all(&frame[..30000]).await;
        });
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        assert!(matches!(c.invoke(b"{}").await, Err(AgentError::Closed)));
    }

    #[tokio::test]
    async fn load_sends_the_specified_frame() {
        let (_dir, path, listener) = listen();
        let server = tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let (op, payload) = read_frame(&mut s).await.unwrap();
            assert_eq!(op, b'L');
            out.write_all(&reply(200, None, b"{\"status\":\"ok\"}"))
                .await
                .unwrap();
            payload
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        let env = vec![
            ("GREETING".to_string(), "hi \"there\"".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let r = c.load("pkg.mod.fn", "/code", &env).await.unwrap();
        assert_eq!((r.status, r.exec_us), (200, None));
        let payload = server.await.unwrap();
        assert_eq!(
            payload,
            br#"{"handler":"pkg.mod.fn","code_dir":"/code","env":{"GREETING":"hi \"there\"","EMPTY":""}}"#
        );
    }

    #[tokio::test]
    async fn device_memory_is_read_from_the_header_extension() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            // The extension arrives byte by byte, split from both header and body.
            let _ = read_frame(&mut s).await.unwrap();
            let frame = reply_mem(200, Some(9), 0x0304_0506_0708, b"{\"x\":1}");
            assert_eq!(&frame[24..32], &[0, 0, 3, 4, 5, 6, 7, 8]);
            for b in &frame {
                out.write_all(&[*b]).await.unwrap();
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            // A handler error of a GPU sandbox, without exec_us, then a plain 24-byte answer,
            // both in one write: the extension must not be taken from the next frame.
            let _ = read_frame(&mut s).await.unwrap();
            let _ = read_frame(&mut s).await.unwrap();
            let mut both = reply_mem_to(7, 500, None, 0, b"{\"type\":\"E\"}");
            both.extend_from_slice(&reply_to(8, 200, Some(4), b"{}"));
            out.write_all(&both).await.unwrap();
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!(
            (r.status, r.exec_us, r.device_memory_bytes),
            (200, Some(9), Some(0x0304_0506_0708))
        );
        assert_eq!(&r.body[..], b"{\"x\":1}");
        let (a, b) = {
            // Pipelined by hand: both requests are out before either answer is read.
            let mut s = &c.requests;
            s.write_all(&request_header(0, b'I', 7)).unwrap();
            s.write_all(&request_header(0, b'H', 8)).unwrap();
            (
                c.read_reply(7, 1024).await.unwrap(),
                c.read_reply(8, 1024).await.unwrap(),
            )
        };
        assert_eq!(
            (a.status, a.exec_us, a.device_memory_bytes),
            (500, None, Some(0))
        );
        assert_eq!(&a.body[..], b"{\"type\":\"E\"}");
        assert_eq!(
            (b.status, b.exec_us, b.device_memory_bytes),
            (200, Some(4), None)
        );
        assert_eq!(&b.body[..], b"{}");
    }

    #[tokio::test]
    async fn a_header_cut_short_in_its_extension_is_closed() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let _ = read_frame(&mut s).await;
            let _ = out
                .write_all(&reply_mem(200, Some(1), 7, b"{}")[..28])
                .await;
        });
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        assert!(matches!(c.invoke(b"{}").await, Err(AgentError::Closed)));
    }

    #[tokio::test]
    async fn prefetch_and_swap_out_send_the_specified_frames() {
        let (_dir, path, listener) = listen();
        let server = tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let mut frames = Vec::new();
            for body in [
                &br#"{"resident_bytes":1073741824,"regions":3}"#[..],
                br#"{"resident_bytes":0,"regions":0}"#,
            ] {
                let mut hdr = [0u8; 16];
                s.read_exact(&mut hdr).await.unwrap();
                let len = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
                let mut payload = vec![0u8; len];
                s.read_exact(&mut payload).await.unwrap();
                // The id (bytes 8..16) is random: the rest is what the agent is sent.
                LAST_ID.set(u64::from_be_bytes(hdr[8..].try_into().unwrap()));
                frames.push([&hdr[..8], &payload].concat());
                out.write_all(&reply(200, None, body)).await.unwrap();
            }
            frames
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        assert_eq!(
            c.prefetch(3).await.unwrap(),
            GpuMemory {
                resident_bytes: 1 << 30,
                regions: 3
            }
        );
        assert_eq!(
            c.swap_out().await.unwrap(),
            GpuMemory {
                resident_bytes: 0,
                regions: 0
            }
        );
        let frames = server.await.unwrap();
        assert_eq!(frames[0], b"\0\0\0\x0cP\0\0\0{\"device\":3}");
        assert_eq!(frames[1], b"\0\0\0\0S\0\0\0");
    }

    #[tokio::test]
    async fn memory_move_refusals_are_typed_and_keep_the_connection() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let answers: [(u16, Option<u64>, &[u8]); 4] = [
                (
                    409,
                    None,
                    br#"{"type":"NoShim","message":"the CUDA shim is not loaded in this sandbox","phase":"request"}"#,
                ),
                (
                    500,
                    None,
                    br#"{"type":"CudaError","message":"prefetch to device 0 failed: CUresult 2","phase":"request"}"#,
                ),
                (
                    500,
                    None,
                    br#"{"type":"CudaError","message":"/host/secret CUresult x","phase":"request"}"#,
                ),
                (200, Some(1), b"{}"),
            ];
            for (status, exec_us, body) in answers {
                let _ = read_frame(&mut s).await.unwrap();
                out.write_all(&reply(status, exec_us, body)).await.unwrap();
            }
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        let e = c.swap_out().await.unwrap_err();
        assert!(matches!(e, AgentError::NoShim) && !e.is_fatal(), "{e:?}");
        let e = c.prefetch(0).await.unwrap_err();
        assert!(matches!(e, AgentError::Cuda { code: Some(2) }) && !e.is_fatal());
        assert!(e.to_string().contains("CUresult 2"), "{e}");
        // The sandbox's own text never reaches the message.
        let e = c.prefetch(0).await.unwrap_err();
        assert!(matches!(e, AgentError::Cuda { code: None }));
        assert!(!e.to_string().contains("secret"), "{e}");
        assert_eq!(c.invoke(b"{}").await.unwrap().status, 200);
    }

    #[tokio::test]
    async fn memory_move_nonsense_is_malformed_or_too_large() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let spaces = [b' '; 5000];
            let answers: [(u16, &[u8]); 4] = [
                (400, br#"{"type":"BadRequest","phase":"request"}"#),
                (200, br#"{"resident_bytes":-1,"regions":0}"#),
                (409, br#"{"type":"AlreadyLoaded"}"#),
                (200, &spaces),
            ];
            for (status, body) in answers {
                let _ = read_frame(&mut s).await.unwrap();
                out.write_all(&reply(status, None, body)).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        // A large result limit does not let a memory move answer more than a few KiB.
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        for _ in 0..3 {
            let e = c.prefetch(1).await.unwrap_err();
            assert!(
                matches!(e, AgentError::Malformed(_)) && e.is_fatal(),
                "{e:?}"
            );
        }
        assert!(matches!(
            c.swap_out().await,
            Err(AgentError::TooLarge { size: 5000, .. })
        ));
    }

    #[tokio::test]
    async fn a_device_ordinal_over_the_agents_range_is_not_sent() {
        let (_dir, path, listener) = listen();
        let server = tokio::spawn(async move {
            let (mut s, _out) = accept(&listener).await;
            read_frame(&mut s).await
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        match c.prefetch(MAX_DEVICE_ORDINAL + 1).await {
            Err(AgentError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput),
            other => panic!("{other:?}"),
        }
        drop(c);
        assert!(server.await.unwrap().is_none(), "nothing was sent");
    }

    /// A fake agent that answers each request with what `answer` makes of its (op, id), then
    /// keeps the connection open.
    fn fake_agent(
        listener: UnixListener,
        answer: impl Fn(u8, u64) -> Vec<u8> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            while let Some((op, _)) = read_frame(&mut s).await {
                if out.write_all(&answer(op, LAST_ID.get())).await.is_err() {
                    return;
                }
            }
        })
    }

    /// Asserts a request's answer is refused as malformed (the sandbox is broken).
    fn assert_malformed(r: Result<AgentReply, AgentError>, why: &str) {
        match r {
            Err(e @ AgentError::Malformed(_)) => assert!(e.is_fatal()),
            other => panic!("{why}: expected a malformed answer, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn every_request_carries_a_fresh_unpredictable_id() {
        let (_dir, path, listener) = listen();
        let ids = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = std::sync::Arc::clone(&ids);
        let _agent = fake_agent(listener, move |_, id| {
            seen.lock().push(id);
            reply_to(id, 200, None, b"{}")
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        for _ in 0..32 {
            assert_eq!(c.health().await.unwrap().status, 200);
        }
        let mut ids = ids.lock().clone();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 32, "ids repeat");
        // Not a counter: consecutive ids are not neighbours.
        assert!(ids.windows(2).any(|w| w[1] - w[0] > 1 << 32), "{ids:?}");
    }

    #[tokio::test]
    async fn an_answer_to_another_request_is_refused_before_its_body_is_read() {
        let (_dir, path, listener) = listen();
        let _agent = fake_agent(listener, |_, id| {
            reply_to(id.wrapping_add(1), 200, Some(0), b"{\"other\":1}")
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        assert_malformed(c.invoke(b"{}").await, "wrong id");
    }

    /// The attack of issue 31 item 9: the handler writes a frame of its own (it can read the
    /// request's id from the agent's memory), then the agent writes the real answer. The first
    /// caller gets what its own handler wrote; the next caller must get an error, never the
    /// first caller's answer that is still in the socket.
    #[tokio::test]
    async fn a_decoy_frame_never_hands_an_answer_to_the_next_caller() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, mut out) = accept(&listener).await;
            let (_, args) = read_frame(&mut s).await.unwrap();
            let id = LAST_ID.get();
            out.write_all(&reply_to(id, 200, Some(0), b"\"decoy\""))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            // The agent's real answer to the first caller arrives after the decoy was read.
            out.write_all(&reply_to(id, 200, Some(0), &args))
                .await
                .unwrap();
            while let Some((_, args)) = read_frame(&mut s).await {
                let _ = out.write_all(&reply(200, Some(0), &args)).await;
            }
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        let first = c.invoke(br#"{"caller":"A"}"#).await.unwrap();
        assert_eq!(&first.body[..], b"\"decoy\"");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_malformed(c.invoke(br#"{"caller":"B"}"#).await, "stale frame");
    }

    #[tokio::test]
    async fn a_frame_that_follows_the_answer_at_once_is_refused() {
        let (_dir, path, listener) = listen();
        let _agent = fake_agent(listener, |_, id| {
            let mut two = reply_to(id, 200, Some(0), b"\"decoy\"");
            two.extend_from_slice(&reply_to(id, 200, Some(0), b"\"real\""));
            two
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        assert_malformed(c.invoke(b"{}").await, "extra frame");
    }

    #[tokio::test]
    async fn an_exec_us_longer_than_the_request_is_refused() {
        let (_dir, path, listener) = listen();
        let _agent = fake_agent(listener, |_, id| reply_to(id, 200, Some(u64::MAX), b"{}"));
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        assert_malformed(c.invoke(b"{}").await, "exec_us 2^64-1");

        let (_dir, path, listener) = listen();
        // An hour, after a round trip of well under one.
        let _agent = fake_agent(listener, |_, id| {
            reply_to(id, 500, Some(3_600_000_000), b"{}")
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        assert_malformed(c.invoke(b"{}").await, "exec_us of an hour");

        // Within the round trip it is taken.
        let (_dir, path, listener) = listen();
        let _agent = fake_agent(listener, |_, id| reply_to(id, 200, Some(0), b"{}"));
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        assert_eq!(c.invoke(b"{}").await.unwrap().exec_us, Some(0));
    }

    #[tokio::test]
    async fn statuses_and_fields_an_op_is_never_answered_with_are_refused() {
        // (op of the request, the answer's status, exec_us, device memory)
        let cases: [(u8, u16, Option<u64>, Option<u64>); 9] = [
            (b'I', 404, Some(0), None),
            (b'I', 409, None, None),
            (b'I', 302, None, None),
            (b'H', 400, None, None),
            (b'H', 413, None, None),
            (b'H', 200, Some(0), None),
            (b'L', 503, None, None),
            (b'H', 200, None, Some(0)),
            (b'I', 200, Some(0), Some(MAX_DEVICE_MEMORY_BYTES + 1)),
        ];
        for (op, status, exec_us, mem) in cases {
            let (_dir, path, listener) = listen();
            let _agent = fake_agent(listener, move |_, id| match mem {
                Some(m) => reply_mem_to(id, status, exec_us, m, b"{}"),
                None => reply_to(id, status, exec_us, b"{}"),
            });
            let mut c = AgentConn::connect(&path, 1024).await.unwrap();
            let r = match op {
                b'I' => c.invoke(b"{}").await,
                b'H' => c.health().await,
                _ => c.load("main.main", "/code", &[]).await,
            };
            assert_malformed(r, &format!("{} {status} {exec_us:?} {mem:?}", op as char));
        }
        // What the agent does answer passes: invoke's 400, 413, 503; health's 500; load's 409.
        for (op, status, exec_us) in [
            (b'I', 400, None),
            (b'I', 413, Some(0)),
            (b'I', 503, None),
            (b'H', 500, None),
            (b'L', 409, None),
        ] {
            let (_dir, path, listener) = listen();
            let _agent = fake_agent(listener, move |_, id| reply_to(id, status, exec_us, b"{}"));
            let mut c = AgentConn::connect(&path, 1024).await.unwrap();
            let r = match op {
                b'I' => c.invoke(b"{}").await,
                b'H' => c.health().await,
                _ => c.load("main.main", "/code", &[]).await,
            };
            assert_eq!(r.unwrap().status, status);
        }
    }

    #[tokio::test]
    async fn a_result_nested_3_000_000_deep_is_the_handlers_failure_and_the_sandbox_stays() {
        let (_dir, path, listener) = listen();
        let deep = [vec![b'['; 3_000_000], vec![b']'; 3_000_000]].concat();
        let _agent = fake_agent(listener, move |_, id| reply_to(id, 200, Some(0), &deep));
        let mut c = AgentConn::connect(&path, 8 << 20).await.unwrap();
        let started = std::time::Instant::now();
        let r = c.invoke(b"{}").await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "no stall");
        assert_eq!(r.status, 500);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["type"], "InvalidResult");
        assert_eq!(v["phase"], "result");
        let message = v["message"].as_str().unwrap();
        assert!(message.contains(&MAX_RESULT_DEPTH.to_string()), "{message}");
        // The connection is in step: the next request is answered.
        assert_eq!(c.invoke(b"{}").await.unwrap().status, 500);
    }

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        let nest = |n: usize| [vec![b'['; n], vec![b']'; n]].concat();
        assert!(!nests_deeper_than(
            &nest(MAX_RESULT_DEPTH),
            MAX_RESULT_DEPTH
        ));
        assert!(nests_deeper_than(
            &nest(MAX_RESULT_DEPTH + 1),
            MAX_RESULT_DEPTH
        ));
        let objects = "{\"a\":".repeat(200) + "1" + &"}".repeat(200);
        assert!(nests_deeper_than(objects.as_bytes(), MAX_RESULT_DEPTH));
        // Brackets in strings, also after an escaped quote, do not count.
        let text = format!("[\"\\\"{}\", {{\"k\": \"\\\\\"}}]", "[".repeat(1000));
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "{text}"
        );
        assert!(!nests_deeper_than(text.as_bytes(), 2));
        assert!(nests_deeper_than(text.as_bytes(), 1));
        assert!(!nests_deeper_than(b"{}", 1));
        assert!(!nests_deeper_than(b"17", 0));
    }

    /// Issue 31 item 7: the sandbox replaces its socket by a symlink to a host socket. The
    /// worker must not connect there (the test's listener sees nothing), and fails cleanly.
    #[tokio::test]
    async fn a_symlink_at_the_socket_path_is_not_followed() {
        let host = tempfile::tempdir().unwrap();
        let host_sock = host.path().join("host.sock");
        let host_listener = std::os::unix::net::UnixListener::bind(&host_sock).unwrap();
        host_listener.set_nonblocking(true).unwrap();
        let sandbox = tempfile::tempdir().unwrap();
        let path = sandbox.path().join("agent.sock");
        std::os::unix::fs::symlink(&host_sock, &path).unwrap();
        // O_PATH | O_NOFOLLOW opens the link itself, which is not a socket.
        let e = AgentConn::connect(&path, 1024)
            .await
            .err()
            .expect("refused");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
        // Not a socket at all: a regular file, a directory.
        let file = sandbox.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = AgentConn::connect(&file, 1024)
            .await
            .err()
            .expect("refused");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
        let e = AgentConn::connect(sandbox.path(), 1024)
            .await
            .err()
            .expect("refused");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
        match host_listener.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the host socket was connected to: {other:?}"),
        }
        // The real socket at the same path is connected to.
        std::fs::remove_file(&path).unwrap();
        let listener = UnixListener::bind(&path).unwrap();
        let _agent = fake_agent(listener, |_, id| reply_to(id, 200, None, b"{}"));
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        assert_eq!(c.health().await.unwrap().status, 200);
    }

    /// A socket of another file system mounted over the socket's path (only a process that can
    /// mount could do that; the sandbox cannot) is refused too: on the run tmpfs of a sandbox
    /// lie only the sandbox's own sockets. Needs root to mount; says so and passes otherwise.
    #[tokio::test]
    async fn a_socket_of_another_file_system_is_refused() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: mounting over the socket path needs root");
            return;
        }
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let elsewhere = shm.path().join("host.sock");
        let host_listener = std::os::unix::net::UnixListener::bind(&elsewhere).unwrap();
        host_listener.set_nonblocking(true).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        std::fs::write(&path, b"").unwrap();
        let (src, dst) = (cstr(&elsewhere), cstr(&path));
        // SAFETY: two valid NUL-terminated paths; a bind mount of one file over another.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        let e = AgentConn::connect(&path, 1024).await.err();
        // SAFETY: the mount made above.
        unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
        let e = e.expect("refused");
        assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
        assert!(matches!(
            host_listener.accept(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        ));
    }

    fn cstr(p: &std::path::Path) -> std::ffi::CString {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    #[test]
    fn the_cuda_result_is_taken_from_the_message_only_when_numeric() {
        assert_eq!(
            cuda_result_in("swap out to host memory failed: CUresult 999"),
            Some(999)
        );
        assert_eq!(cuda_result_in("x failed: CUresult -3"), Some(-3));
        assert_eq!(cuda_result_in("CUresult 99999999999"), None);
        assert_eq!(cuda_result_in("CUresult "), None);
        assert_eq!(cuda_result_in("no code"), None);
    }

    #[tokio::test]
    async fn the_real_agent_loads_and_invokes_in_generic_mode() {
        let agent = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../runtime/python/hearth_agent.py"
        );
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("code");
        std::fs::create_dir(&code).unwrap();
        std::fs::write(
            code.join("main.py"),
            "import os\n\
             def main(args):\n\
             \x20   with open('data.txt') as f:\n\
             \x20       data = f.read()\n\
             \x20   return {'n': args['n'] + 1, 'data': data, 'env': os.environ.get('GREETING')}\n",
        )
        .unwrap();
        std::fs::write(code.join("data.txt"), "relative").unwrap();
        let sock = dir.path().join("a.sock");
        let mut cmd = tokio::process::Command::new("python3");
        cmd.args(["-I", "-S", agent, "--generic", "--socket"])
            .arg(&sock)
            .current_dir(dir.path())
            .kill_on_drop(true); // killed when the test ends, also on panic
        let _child = cmd.spawn().unwrap();

        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut c = loop {
            match AgentConn::connect(&sock, 1 << 20).await {
                Ok(c) => break c,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("the agent did not listen: {e}"),
            }
        };
        let r = c.health().await.unwrap();
        assert_eq!(r.status, 200);
        let health: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(health["status"], "generic");

        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!(r.status, 503);

        let env = vec![("GREETING".to_string(), "hello".to_string())];
        let r = c
            .load("main.main", code.to_str().unwrap(), &env)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        let loaded: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(loaded["status"], "ok");

        let r = c.invoke(br#"{"n": 41}"#).await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert!(r.exec_us.is_some());
        let result: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            result,
            serde_json::json!({"n": 42, "data": "relative", "env": "hello"})
        );

        let r = c.load("main.main", "/code", &[]).await.unwrap();
        assert_eq!(r.status, 409);
        let r = c.invoke(br#"{"n": 1}"#).await.unwrap();
        assert_eq!((r.status, r.device_memory_bytes), (200, None));
        // Without the CUDA shim (no LD_PRELOAD) memory moves are refused, and nothing breaks.
        assert!(matches!(c.prefetch(0).await, Err(AgentError::NoShim)));
        assert!(matches!(c.swap_out().await, Err(AgentError::NoShim)));
        assert_eq!(c.invoke(br#"{"n": 1}"#).await.unwrap().status, 200);
    }
}
