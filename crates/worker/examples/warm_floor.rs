//! The floor of Hearth's warm path on this host: an HTTP server that does nothing but hand each
//! request to one of N agents and answer what it said.
//!
//! The same pieces a warm invocation cannot do without (hyper on one runtime thread, the real
//! agent `runtime/python/hearth_agent.py` running a function's handler, [`AgentConn`] with its
//! two sockets, one agent per invocation in flight), and none of what the worker adds: no
//! routing, authentication, engine, keep-alive, regulator, metrics, timeouts or sandbox (the
//! agents are plain processes, each in a `cpu,cpuacct` cgroup of its own with `--cgroups`, as a
//! sandbox's agent is). It holds the low-latency PM QoS request throughout, as a busy worker
//! does (`hearth_worker::latency`): without it every wake-up of an idle vCPU is a halt and an
//! IPI, and the floor would be no floor. `bench/warm-floor.sh` measures it and a worker with the
//! same client; what the worker is slower by is what everything it adds costs.
//!
//!     warm_floor --listen 127.0.0.1:PORT --agents 4 --code functions/noop [--cgroups] [--bare]
//!                [--python /usr/bin/python3]
//!
//! With `--bare` the agents are not Hearth's but the least a Python agent can be (below): one
//! read and one write per request and no handler, which says what the agent's own Python costs.
//!
//! Every request (any method, any path) is an invocation of the handler with the request body
//! as its arguments; the answer is shaped and sized as a worker's.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hearth_service::serving::DEFAULT_MAX_RESULT_BYTES;
use hearth_worker::agent_client::AgentConn;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;

struct Args {
    listen: String,
    agents: usize,
    code: PathBuf,
    handler: String,
    cgroups: bool,
    bare: bool,
    /// The interpreter a sandbox runs (the OCI spec's `/usr/bin/python3`): another build of the
    /// same version (a pyenv one, say) can cost twice the CPU per call.
    python: PathBuf,
}

/// The least a Python agent can be: takes the answer socket from the `R` frame, then per
/// request one `recv_into` (a request and its small payload come in one read) and one
/// `sendall` of a fixed answer (200, `{}`) with the request's id. Not a real agent: it trusts its
/// peer.
const BARE_AGENT: &str = r#"
import socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(1)
while True:
    conn, _ = srv.accept()
    _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    out = socket.socket(fileno=fds[0])
    buf = bytearray(65536); recv_into = conn.recv_into; sendall = out.sendall
    head = b"\0\0\0\2\0\xc8\0\0" + bytes(8)
    while True:
        if recv_into(buf) == 0:
            break
        if buf[4] == 72 or buf[4] == 73:
            sendall(head + buf[8:16] + b"{}")
    conn.close(); out.close()
"#;

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        listen: "127.0.0.1:0".into(),
        agents: 4,
        code: PathBuf::from("functions/noop"),
        handler: "main.main".into(),
        cgroups: false,
        bare: false,
        python: PathBuf::from("/usr/bin/python3"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--cgroups" => {
                a.cgroups = true;
                continue;
            }
            "--bare" => {
                a.bare = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => a.listen = value,
            "--agents" => {
                a.agents = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or("--agents: 1 to 64")?
            }
            "--code" => a.code = PathBuf::from(value),
            "--handler" => a.handler = value,
            "--python" => a.python = PathBuf::from(value),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// The agents' processes and cgroups, removed when the floor exits.
struct Agents {
    children: Vec<Child>,
    cgroups: Vec<PathBuf>,
}

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for g in &self.cgroups {
            let _ = std::fs::remove_dir(g);
        }
    }
}

fn spawn_agents(a: &Args, dir: &Path) -> std::io::Result<(Agents, Vec<PathBuf>)> {
    let agent = std::fs::canonicalize("runtime/python/hearth_agent.py")?;
    let code = std::fs::canonicalize(&a.code)?;
    let mut agents = Agents {
        children: Vec::new(),
        cgroups: Vec::new(),
    };
    let mut sockets = Vec::new();
    for i in 0..a.agents {
        let sock = dir.join(format!("agent{i}.sock"));
        let mut cmd = Command::new(&a.python);
        cmd.args(["-I", "-S"]);
        if a.bare {
            cmd.arg("-c").arg(BARE_AGENT).arg(&sock);
        } else {
            cmd.arg(&agent)
                .arg("--socket")
                .arg(&sock)
                .arg("--code-dir")
                .arg(&code)
                .arg("--handler")
                .arg(&a.handler);
        }
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec. An agent
        // outlives nothing it should: a floor killed outright takes its agents with it.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        if a.cgroups {
            // One group per agent in each hierarchy, as a sandbox has.
            for h in ["cpu", "cpuacct"] {
                let g = PathBuf::from(format!(
                    "/sys/fs/cgroup/{h}/hearth-floor-{}-{i}",
                    std::process::id()
                ));
                if !g.exists() {
                    std::fs::create_dir(&g)?;
                    agents.cgroups.push(g.clone());
                }
                std::fs::write(g.join("cgroup.procs"), child.id().to_string())?;
            }
        }
        agents.children.push(child);
        sockets.push(sock);
    }
    Ok((agents, sockets))
}

async fn connect(sock: &Path) -> std::io::Result<AgentConn> {
    for _ in 0..200 {
        if let Ok(mut c) = AgentConn::connect(sock, DEFAULT_MAX_RESULT_BYTES).await {
            match c.health().await {
                Ok(r) if r.status == 200 => return Ok(c),
                Ok(r) => {
                    return Err(std::io::Error::other(format!(
                        "the agent answered health with {}: {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    )))
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(std::io::Error::other("an agent did not come up in 5 s"))
}

/// Idle agents; a request takes one and gives it back. The lock is never held across an await.
struct Pool {
    idle: Mutex<Vec<AgentConn>>,
    free: tokio::sync::Semaphore,
}

async fn invoke(pool: Arc<Pool>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, String> {
    let args = req
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let permit = pool.free.acquire().await.map_err(|e| e.to_string())?;
    let Some(mut conn) = pool.idle.lock().pop() else {
        return Err("no idle agent with a permit".into());
    };
    let reply = match conn.invoke(&args).await {
        Ok(r) => r,
        // A connection that broke is not given back, and neither is its permit.
        Err(e) if e.is_fatal() => {
            permit.forget();
            return Err(e.to_string());
        }
        Err(e) => {
            pool.idle.lock().push(conn);
            return Err(e.to_string());
        }
    };
    pool.idle.lock().push(conn);
    drop(permit);
    let exec_us = reply.exec_us.unwrap_or(0);
    let mut body = Vec::with_capacity(reply.body.len() + 128);
    body.extend_from_slice(b"{\"result\":");
    body.extend_from_slice(&reply.body);
    body.extend_from_slice(
        format!(
            ",\"cold\":false,\"worker\":\"floor\",\"timing\":{{\"queue_us\":0,\"init_us\":0,\"exec_us\":{exec_us},\"total_us\":{exec_us}}}}}"
        )
        .as_bytes(),
    );
    Response::builder()
        .status(reply.status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    let latency = hearth_worker::latency::LowLatency::new(true, Duration::from_secs(3600));
    latency.on_activity();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (agents, sockets) = spawn_agents(&args, dir.path()).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let result = rt.block_on(async move {
        let mut idle = Vec::new();
        for s in &sockets {
            idle.push(connect(s).await.map_err(|e| e.to_string())?);
        }
        let pool = Arc::new(Pool {
            free: tokio::sync::Semaphore::new(idle.len()),
            idle: Mutex::new(idle),
        });
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("listening on {addr}");
        // SIGINT or SIGTERM ends it; the agents and their cgroups go with it (`Agents`).
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| e.to_string())?;
        let stop = tokio::signal::ctrl_c();
        tokio::pin!(stop);
        loop {
            let (tcp, _) = tokio::select! {
                r = listener.accept() => r.map_err(|e| e.to_string())?,
                _ = &mut stop => return Ok::<(), String>(()),
                _ = term.recv() => return Ok(()),
            };
            let _ = tcp.set_nodelay(true);
            let pool = pool.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let pool = pool.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(invoke(pool, req).await.unwrap_or_else(
                            |e| {
                                let mut r = Response::new(Full::new(Bytes::from(e)));
                                *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
                                r
                            },
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    drop(agents);
    drop(latency);
    result
}
