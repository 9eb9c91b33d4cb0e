//! `hearth controller` and `hearth up --workers N`: a controller in front of worker processes.

use anyhow::{bail, Context, Result};
use clap::Args;
use hearth_controller::ControllerConfig;
use hearth_core::balance::BalanceKind;
use hearth_worker::BackendKind;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `hearth controller` flags.
#[derive(Args)]
pub struct ControllerArgs {
    /// TOML config file (every key can also be set as HEARTH_<KEY>).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7878.
    #[arg(long)]
    pub listen: Option<String>,
    /// Where the registry and function code live.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Balancing policy: round-robin, random, least-loaded, ch, ch-bl, ch-rlu, k-ch-rlu,
    /// openwhisk.
    #[arg(long)]
    pub balance: Option<BalanceKind>,
    /// The cluster's state store: sqlite (this controller alone) or etcds://HOST:PORT[,…]
    /// (etcd over TLS; etcd:// on loopback): several controllers serve one cluster.
    #[arg(long)]
    pub store: Option<String>,
}

/// Runs a controller until SIGTERM or Ctrl-C.
pub fn controller(args: ControllerArgs) -> Result<()> {
    let mut config = ControllerConfig::load(args.config.as_deref())?;
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(b) = args.balance {
        config.balance = b;
    }
    if let Some(s) = args.store {
        config.store = s;
    }
    config.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.effective_runtime_threads())
        .enable_all()
        .build()?;
    // The signal handlers go in before the server starts (inside the runtime).
    rt.block_on(async {
        hearth_controller::server::serve(config, hearth_service::serving::shutdown_signal(), None)
            .await
    })?;
    Ok(())
}

/// What `hearth up --workers N` was given.
pub struct UpOptions {
    /// Worker config file, passed to every worker.
    pub config: Option<PathBuf>,
    /// The controller's address (the public API).
    pub listen: Option<String>,
    /// Controller data in `<data_dir>/controller`, worker i's in `<data_dir>/workers/worker-i`.
    pub data_dir: Option<PathBuf>,
    pub backend: Option<BackendKind>,
    pub memory_mb: Option<u64>,
    pub balance: Option<BalanceKind>,
    /// Scheduling flags for every worker (`--queue`, `--keepalive`, `--concurrency`, `--cpus`).
    pub worker_args: Vec<String>,
}

/// Starts a controller here and `n` worker processes that join it; stops them all on SIGTERM
/// or Ctrl-C.
pub fn up(opts: UpOptions, n: usize) -> Result<()> {
    if n == 0 {
        bail!("--workers must be at least 1");
    }
    let mut config = ControllerConfig::load(None)?;
    if let Some(l) = &opts.listen {
        config.listen = l.clone();
    }
    let data_dir = opts
        .data_dir
        .clone()
        .unwrap_or_else(hearth_service::serving::default_data_dir);
    config.data_dir = data_dir.join("controller");
    if let Some(b) = opts.balance {
        config.balance = b;
    }
    config.check()?;
    let listen: SocketAddr = config.listen.parse().context("--listen")?;
    // Each worker proves membership with a credential of its own, made below through the
    // controller's API with the operator's key; the controller's cluster key stays with it.
    let membership = Membership {
        auth: config.auth,
        admin_key: config.data_dir.join(hearth_service::auth::ADMIN_KEY_FILE),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.effective_runtime_threads())
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let signal = hearth_service::serving::shutdown_signal();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(hearth_controller::server::serve(
            config,
            async {
                let _ = stop_rx.await;
            },
            Some(ready_tx),
        ));
        let Ok(bound) = ready_rx.await else {
            return match server.await {
                Ok(Err(e)) => Err(e.into()),
                _ => Err(anyhow::anyhow!("the controller did not start")),
            };
        };
        let host = if listen.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            bound.ip().to_string()
        };
        let controller_url = format!("http://{host}:{}", bound.port());
        if membership.auth {
            let (url, admin, dir) = (
                controller_url.clone(),
                membership.admin_key.clone(),
                data_dir.join("workers"),
            );
            let made =
                tokio::task::spawn_blocking(move || worker_credentials(&url, &admin, &dir, n))
                    .await
                    .map_err(|e| anyhow::anyhow!("making worker credentials: {e}"))
                    .and_then(|r| r);
            if let Err(e) = made {
                let _ = stop_tx.send(());
                let _ = server.await;
                return Err(e);
            }
        }
        let mut workers = Vec::new();
        for i in 1..=n {
            let dir = data_dir.join("workers").join(format!("worker-{i}"));
            match spawn_worker(i, &dir, &controller_url, &membership, &opts) {
                Ok(child) => workers.push(child),
                Err(e) => {
                    stop_workers(&mut workers);
                    let _ = stop_tx.send(());
                    let _ = server.await;
                    return Err(e);
                }
            }
        }
        tracing::info!(workers = n, url = %controller_url, "cluster up: controller and workers started");
        let mut slots: Vec<Slot> = workers.into_iter().map(Slot::new).collect();
        let respawn = |i: usize| {
            let dir = data_dir.join("workers").join(format!("worker-{i}"));
            spawn_worker(i, &dir, &controller_url, &membership, &opts)
        };
        tokio::select! {
            _ = signal => {}
            _ = supervise(&mut slots, respawn) => {}
        }
        // Workers first, so that they can say goodbye to the controller.
        let mut workers: Vec<Child> = slots.into_iter().filter_map(|s| s.child).collect();
        stop_workers(&mut workers);
        let _ = stop_tx.send(());
        match server.await {
            Ok(res) => res.map_err(anyhow::Error::from),
            Err(e) => Err(anyhow::anyhow!("controller task: {e}")),
        }
    })
}

/// How `hearth up`'s workers authenticate to its controller.
struct Membership {
    auth: bool,
    /// The operator's key, to make the workers' credentials with.
    admin_key: PathBuf,
}

/// The credential file of `hearth up`'s worker `i`.
fn credential_file(workers_dir: &std::path::Path, i: usize) -> PathBuf {
    workers_dir.join(format!("worker-{i}.credential"))
}

/// Gives each of `hearth up`'s `n` workers a credential bound to its id (`worker-i`): the one
/// its file already holds if the controller still knows it, else a new one (older ones of that
/// worker are revoked, so restarts do not pile them up).
fn worker_credentials(
    controller: &str,
    admin_key: &std::path::Path,
    workers_dir: &std::path::Path,
    n: usize,
) -> Result<()> {
    use crate::client::Client;
    let token = std::fs::read_to_string(admin_key)
        .with_context(|| format!("reading the operator's key {}", admin_key.display()))?;
    let mut client = Client::new(controller)?.with_token(Some(token.trim().to_string()));
    let r = client.get("/v1/cluster/credentials")?;
    if r.status != 200 {
        bail!("listing worker credentials: {} {}", r.status, r.text());
    }
    let listed = r.json();
    let listed: Vec<(String, String)> = listed["credentials"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c["id"].as_str()?.into(), c["worker"].as_str()?.into())))
        .collect();
    std::fs::create_dir_all(workers_dir)
        .with_context(|| format!("creating {}", workers_dir.display()))?;
    for i in 1..=n {
        let worker = format!("worker-{i}");
        let file = credential_file(workers_dir, i);
        let held = std::fs::read_to_string(&file).ok().and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("hw_"))?;
            line.get(3..19).map(String::from)
        });
        if held
            .as_ref()
            .is_some_and(|id| listed.iter().any(|(c, w)| c == id && *w == worker))
        {
            continue;
        }
        for (id, _) in listed.iter().filter(|(_, w)| *w == worker) {
            let _ = client.delete(&format!("/v1/cluster/credentials/{id}"))?;
        }
        let body = serde_json::json!({"worker": worker, "description": "made by hearth up"});
        let r = client.post("/v1/cluster/credentials", body.to_string().as_bytes())?;
        if r.status != 201 {
            bail!("making {worker}'s credential: {} {}", r.status, r.text());
        }
        let text = r.json()["file"]
            .as_str()
            .map(String::from)
            .context("the controller's answer has no credential file")?;
        let _ = std::fs::remove_file(&file);
        hearth_service::auth::write_private(&file, &text)
            .with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(())
}

fn spawn_worker(
    i: usize,
    dir: &std::path::Path,
    controller: &str,
    membership: &Membership,
    opts: &UpOptions,
) -> Result<Child> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let exe = std::env::current_exe().context("locating the hearth binary")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "worker",
        "--listen",
        "127.0.0.1:0",
        "--controller",
        controller,
    ])
    .arg("--data-dir")
    .arg(dir)
    .env("HEARTH_WORKER_ID", format!("worker-{i}"))
    .stdin(Stdio::null());
    if membership.auth {
        let workers_dir = dir.parent().unwrap_or(dir);
        cmd.env("HEARTH_CLUSTER_KEY_FILE", credential_file(workers_dir, i));
    } else {
        cmd.env("HEARTH_AUTH", "false");
    }
    if let Some(c) = &opts.config {
        cmd.arg("--config").arg(c);
    }
    if let Some(b) = opts.backend {
        cmd.args(["--backend", &b.to_string()]);
    }
    if let Some(m) = opts.memory_mb {
        cmd.args(["--memory-mb", &m.to_string()]);
    }
    cmd.args(&opts.worker_args);
    // A worker must not outlive `hearth up`, even if it is killed.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("starting worker-{i}"))
}

/// One supervised worker process.
struct Slot {
    /// None once it exited (reaped: its pid may belong to someone else now).
    child: Option<Child>,
    started: Instant,
    /// The wait before the next restart; doubles while restarts keep failing.
    backoff: Duration,
    /// When to restart it.
    due: Option<Instant>,
}

/// First wait before restarting a worker that exited, and the longest.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));
/// A worker that ran this long before exiting starts over at the first back-off.
const STABLE_RUN: Duration = Duration::from_secs(60);

impl Slot {
    fn new(child: Child) -> Slot {
        Slot {
            child: Some(child),
            started: Instant::now(),
            backoff: RESTART_BACKOFF.0,
            due: None,
        }
    }
}

/// Restarts workers that exit on their own, so one worker's crash never takes the cluster down
/// (the controller routes around it meanwhile); a worker that keeps crashing is restarted ever
/// more slowly (0.5 s doubling to 30 s). Runs until the cluster stops.
async fn supervise(slots: &mut [Slot], respawn: impl Fn(usize) -> Result<Child>) {
    loop {
        let now = Instant::now();
        for (i, slot) in slots.iter_mut().enumerate() {
            let n = i + 1;
            if let Some(child) = slot.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    slot.child = None;
                    if slot.started.elapsed() >= STABLE_RUN {
                        slot.backoff = RESTART_BACKOFF.0;
                    }
                    tracing::error!(worker = n, %status, restart_in = ?slot.backoff, "a worker exited; restarting it");
                    slot.due = Some(now + slot.backoff);
                    slot.backoff = (slot.backoff * 2).min(RESTART_BACKOFF.1);
                }
                continue;
            }
            if slot.due.is_some_and(|due| due <= now) {
                match respawn(n) {
                    Ok(child) => {
                        tracing::info!(worker = n, "worker restarted");
                        slot.child = Some(child);
                        slot.started = now;
                        slot.due = None;
                    }
                    Err(e) => {
                        tracing::error!(worker = n, error = %e, retry_in = ?slot.backoff, "restarting a worker failed");
                        slot.due = Some(now + slot.backoff);
                        slot.backoff = (slot.backoff * 2).min(RESTART_BACKOFF.1);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGTERM to every worker, then waits (SIGKILL after 60 s).
fn stop_workers(workers: &mut [Child]) {
    for w in workers.iter() {
        unsafe {
            libc::kill(w.id() as i32, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for w in workers.iter_mut() {
        loop {
            match w.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = w.kill();
                    let _ = w.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}
