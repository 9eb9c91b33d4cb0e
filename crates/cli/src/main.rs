//! `hearth`: run a worker or a single node, manage functions, invoke, benchmark.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use hearth_api::{AsyncRecord, AsyncState, ErrorBody};
use hearth_cli::client::{default_url, Client, Response};
use hearth_cli::{bench, cluster, code, route_bench, stats::percentile};
use hearth_core::balance::BalanceKind;
use hearth_core::{KeepAliveKind, QueueDiscipline};
use hearth_worker::config::Concurrency;
use hearth_worker::{BackendKind, WorkerConfig};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "hearth",
    version,
    about = "Hearth: a fast, trustworthy FaaS control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start Hearth on this machine (single node: one worker serving the public API; with
    /// --workers N, a controller in front of N worker processes).
    Up(UpArgs),
    /// Run a worker.
    Worker(ServerArgs),
    /// Run a controller: the public API in front of workers that join it.
    Controller(cluster::ControllerArgs),
    /// Manage functions.
    #[command(name = "fn", subcommand)]
    Function(FnCommand),
    /// Manage API keys (the operator's key, or a namespace's admin key).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Manage the cluster (the operator's key).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Manage this host's runtime images (root filesystems sandboxes run on).
    #[command(subcommand)]
    Runtime(hearth_cli::runtime_cmd::RuntimeCommand),
    /// Invoke a function.
    Invoke {
        name: String,
        /// Arguments as JSON.
        #[arg(long, short, default_value = "{}")]
        data: String,
        /// Return an invocation id at once instead of waiting.
        #[arg(long = "async")]
        is_async: bool,
        /// A repeat with the same key gets the first call's id (async) or answer (sync).
        #[arg(long)]
        idempotency_key: Option<String>,
        #[command(flatten)]
        url: UrlArg,
    },
    /// Show an async invocation's status and result.
    Result {
        id: String,
        /// Poll until it finishes.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        url: UrlArg,
    },
    /// Start warm sandboxes for a function ahead of demand.
    Prewarm {
        name: String,
        #[arg(short = 'n', long, default_value_t = 1)]
        count: u32,
        #[command(flatten)]
        url: UrlArg,
    },
    /// Show memory, sandboxes and per-function pool state.
    Status {
        #[command(flatten)]
        url: UrlArg,
    },
    /// Benchmarks that print numbers.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Generate load (closed loop, or a trace replayed open loop); one CSV row per invocation.
    #[command(subcommand)]
    Load(hearth_cli::load::LoadCommand),
    /// Make workload traces from the Azure traces or synthetic shapes.
    #[command(subcommand)]
    Trace(hearth_cli::trace_cmd::TraceCommand),
    /// Summarize results files, compare runs, and plot them.
    Report(hearth_cli::report_cmd::ReportArgs),
    /// Replay a trace through simulated workers and a balancer (the same policy code, virtual
    /// time).
    Sim(hearth_cli::sim_cmd::SimArgs),
    /// Run one of the seeds' comparisons through the simulator: keepalive, balance, queue,
    /// priority, atoll, alps, provision, scaling, gpu (or fidelity: compare a real run with a
    /// simulated one).
    Experiment(hearth_cli::experiment_cmd::ExperimentArgs),
    /// Size a worker's memory for a trace: hit-ratio curve from reuse distances, the memory
    /// for a target hit ratio, and the curve's knee (FaasCache provisioning).
    Provision(hearth_cli::provision_cmd::ProvisionArgs),
}

#[derive(Args, Clone)]
struct UrlArg {
    /// API address.
    #[arg(long, env = "HEARTH_URL", default_value_t = default_url())]
    url: String,
}

#[derive(Args)]
struct ServerArgs {
    /// TOML config file (every key can also be set as HEARTH_<KEY>).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7878.
    #[arg(long)]
    listen: Option<String>,
    /// Where the registry, code and sandbox bundles live.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Sandbox backend: runc (real containers) or sim (sleeps; for experiments).
    #[arg(long)]
    backend: Option<BackendKind>,
    /// Memory budget for sandboxes, MiB.
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Proactive pool inside the memory budget, MiB, for sandboxes a controller sets up ahead
    /// of demand (Atoll; 0: off).
    #[arg(long)]
    proactive_mb: Option<u64>,
    /// CPU scheduling of runc sandboxes: cfs (the kernel alone), sfs (a fixed slice at raised
    /// weight, then idle) or alps (learned ranks and slices; docs/alps-backend.md).
    #[arg(long)]
    cpu_sched: Option<hearth_worker::cpu_sched::CpuSchedKind>,
    /// SFS's slice of CPU time, ms (cpu_sched sfs).
    #[arg(long)]
    sfs_slice_ms: Option<u64>,
    /// Queue discipline: fcfs, sjf, eedf, rare or srsf.
    #[arg(long)]
    queue: Option<QueueDiscipline>,
    /// Keep-alive policy: ttl, lru, gdsf, lfu, landlord or hist.
    #[arg(long)]
    keepalive: Option<KeepAliveKind>,
    /// Concurrency limit of queued invocations: a number, or aimd.
    #[arg(long)]
    concurrency: Option<Concurrency>,
    /// CPUs to schedule for (default: the machine's; with --backend sim, simulated CPUs).
    #[arg(long)]
    cpus: Option<u32>,
    /// Join this controller (http://HOST:PORT) and push status to it.
    #[arg(long)]
    controller: Option<String>,
    /// Join a cluster through its state store (etcds://HOST:PORT[,…] over TLS, or etcd:// on
    /// loopback; the store_* settings give its CA and credentials): every controller of the
    /// cluster finds this worker there.
    #[arg(long)]
    store: Option<String>,
}

#[derive(Args)]
struct UpArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Start a controller and this many worker processes (separate ports and data directories).
    #[arg(long)]
    workers: Option<usize>,
    /// The controller's balancing policy (with --workers).
    #[arg(long)]
    balance: Option<BalanceKind>,
}

/// Where a function runs (`fn register`).
#[derive(clap::Args)]
struct GpuArgs {
    /// Where the handler runs: cpu (default), gpu (only on workers with a GPU) or any (a CPU
    /// and a GPU variant, chosen by expected speedup).
    #[arg(long)]
    device: Option<hearth_api::Device>,
    /// GPU memory one invocation needs, MiB (required with --device gpu or any).
    #[arg(long)]
    gpu_memory: Option<u64>,
    /// Warm time on a GPU for the sim backend, ms.
    #[arg(long)]
    sim_gpu_warm_ms: Option<f64>,
    /// Cold-start cost on a GPU for the sim backend, ms.
    #[arg(long)]
    sim_gpu_cold_ms: Option<f64>,
}

#[derive(Subcommand)]
enum FnCommand {
    /// Register or update a function.
    Register {
        name: String,
        /// A directory or a single .py file.
        #[arg(long)]
        code: Option<PathBuf>,
        /// `function` or `module.function` (a single file's module is its name).
        #[arg(long, default_value = "main")]
        handler: String,
        #[arg(long, default_value_t = 128)]
        memory: u64,
        #[arg(long, default_value_t = 1.0)]
        cpus: f64,
        /// Priority level (higher is more important; k-ch-rlu gives each level a pool).
        #[arg(long)]
        priority: Option<i32>,
        /// e.g. 30s, 500ms.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// Environment variables, KEY=VALUE (repeatable).
        #[arg(long = "env", value_parser = parse_env)]
        env: Vec<(String, String)>,
        /// Warm time for the sim backend, ms.
        #[arg(long)]
        sim_warm_ms: Option<f64>,
        /// Cold-start cost for the sim backend, ms.
        #[arg(long)]
        sim_cold_ms: Option<f64>,
        /// --device, --gpu-memory and the sim backend's GPU times (boxed: rarely set).
        #[command(flatten)]
        gpu: Box<GpuArgs>,
        /// Retries of a failed async invocation before it is dead-lettered (0-10, default 2).
        #[arg(long)]
        retries: Option<u32>,
        /// Return once the function's build (its requirements.txt layer and bytecode) is over:
        /// exit 0 when it is ready, non-zero with the build log's tail when it failed.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        url: UrlArg,
    },
    /// List functions.
    List {
        #[command(flatten)]
        url: UrlArg,
    },
    /// Show a function.
    Show {
        name: String,
        #[command(flatten)]
        url: UrlArg,
    },
    /// Delete a function (running invocations finish first).
    Rm {
        name: String,
        #[command(flatten)]
        url: UrlArg,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Worker credentials: each lets one worker id join the controller, and nothing else.
    #[command(subcommand)]
    Credential(CredentialCommand),
}

#[derive(Subcommand)]
enum CredentialCommand {
    /// Create a worker credential bound to one worker id; writes the worker's credential file
    /// (0600, for its cluster_key_file), whose secrets are shown nowhere else.
    Create {
        /// The worker id it may join as (the worker's worker_id).
        #[arg(long)]
        worker: String,
        /// Where to write the credential file (refused if it exists).
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        url: UrlArg,
    },
    /// List worker credentials (never their secrets).
    List {
        #[command(flatten)]
        url: UrlArg,
    },
    /// Revoke a worker credential: its worker leaves the ring at once.
    Rm {
        id: String,
        #[command(flatten)]
        url: UrlArg,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create a key; its secret is printed once.
    Create {
        /// `*` (every namespace, operator only) or a namespace; default: the caller's own.
        #[arg(long)]
        namespace: Option<String>,
        /// admin (manage functions and keys, invoke, read every result), invoke (invoke and
        /// read its own results) or metrics (read /metrics only: give this one to Prometheus).
        #[arg(long, default_value = "invoke")]
        role: String,
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        url: UrlArg,
    },
    /// List keys (never their secrets).
    List {
        #[command(flatten)]
        url: UrlArg,
    },
    /// Delete a key.
    Rm {
        id: String,
        #[command(flatten)]
        url: UrlArg,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Closed-loop warm invocations: throughput and control-plane overhead (e2e − exec).
    Overhead {
        #[command(flatten)]
        url: UrlArg,
        #[arg(long, default_value_t = 1)]
        clients: usize,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        /// The function sleeps this long per invocation (0: a no-op).
        #[arg(long, default_value_t = 0)]
        exec_ms: u64,
        /// Sandboxes made before the run (default: one per client; fewer makes a burst).
        #[arg(long)]
        prewarm: Option<usize>,
        /// Benchmark a `device: gpu` function (a worker with GPUs; its GPU sandboxes start on
        /// demand, during the warm-up, and are not prewarmed).
        #[arg(long)]
        gpu: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Cost of one routing decision per balancing policy (no server needed).
    Route {
        #[arg(long, default_value_t = 64)]
        workers: usize,
        #[arg(long, default_value_t = 10_000)]
        functions: usize,
        /// Timed decisions per policy.
        #[arg(long, default_value_t = 200_000)]
        decisions: usize,
        /// Mean initial worker load (normalized; higher makes the ring policies forward more).
        #[arg(long, default_value_t = 1.0)]
        mean_load: f64,
        /// Only this policy (default: all).
        #[arg(long)]
        balance: Option<BalanceKind>,
        #[arg(long)]
        json: bool,
    },
    /// Cost of checking an API key on the request path (no server needed).
    Auth {
        #[arg(long, default_value_t = 200_000)]
        checks: usize,
        #[arg(long)]
        json: bool,
    },
    /// Async accept latency: sequential `?async=true` calls, each answered 202 once its record
    /// is durable (SQLite or etcd).
    Async {
        #[command(flatten)]
        url: UrlArg,
        #[arg(short = 'n', long, default_value_t = 2000)]
        n: usize,
        #[arg(long)]
        json: bool,
    },
    /// Cold starts of a hello function (or of `--code DIR`): sandbox + agent + import, per
    /// path taken (pre-imported, generic, fresh).
    Cold {
        #[command(flatten)]
        url: UrlArg,
        #[arg(short = 'n', long, default_value_t = 20)]
        rounds: usize,
        /// The function to measure: a directory (or .py file) as `fn register --code` takes it,
        /// with its requirements.txt; default: a hello function.
        #[arg(long)]
        code: Option<PathBuf>,
        /// Its memory (MiB) with --code.
        #[arg(long, default_value_t = 256)]
        memory: u64,
        /// Also time the host's own import of these modules (comma-separated), with
        /// --host-site first on sys.path, and print generic-path init / host import.
        #[arg(long, requires = "host_site")]
        host_import: Option<String>,
        /// The packages' directory on the host (e.g. a `pip install --target` of the
        /// requirements).
        #[arg(long, requires = "host_import")]
        host_site: Option<PathBuf>,
        /// The interpreter the host import runs with (the runtime's, for a fair ratio).
        #[arg(long, default_value = "/usr/bin/python3")]
        host_python: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Cost of one ALPS training: a busy worker's window through the SRPT simulation and the
    /// policy learning (no server needed).
    Alps {
        #[arg(long, default_value_t = 16)]
        cpus: u32,
        /// The window W in seconds.
        #[arg(long, default_value_t = 5)]
        window_s: u64,
        #[arg(long, default_value_t = 21)]
        rounds: usize,
        #[arg(long)]
        json: bool,
    },
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HEARTH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Trace(_)
            | Command::Report(_)
            | Command::Sim(_)
            | Command::Experiment(_)
            | Command::Provision(_)
            | Command::Function(_)
            | Command::Key(_)
            | Command::Cluster(_)
            | Command::Runtime(_)
            | Command::Invoke { .. }
            | Command::Result { .. }
            | Command::Prewarm { .. }
            | Command::Status { .. }
    ) {
        quiet_on_closed_pipe();
    }
    if let Err(e) = run(cli) {
        eprintln!("error: {}", chain_message(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, each once: a typed error that shows its source in its own message
/// (`authentication: {0}`) would otherwise print that source again after it.
fn chain_message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if out.ends_with(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
    }
    out
}

/// Commands whose output users pipe into `head` end quietly on a closed pipe, like other Unix
/// tools, instead of panicking in `println!`. Safe where every socket write is `send` with
/// `MSG_NOSIGNAL` (std's `TcpStream::write`, which the blocking client uses); the servers and
/// `load` (Tokio, vectored writes) keep Rust's ignored SIGPIPE, so a dead peer is an error there.
fn quiet_on_closed_pipe() {
    // SAFETY: resetting a signal disposition to its default before any thread is spawned.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Up(UpArgs {
            server,
            workers: Some(n),
            balance,
        }) => cluster::up(
            cluster::UpOptions {
                worker_args: worker_policy_args(&server),
                config: server.config,
                listen: server.listen,
                data_dir: server.data_dir,
                backend: server.backend,
                memory_mb: server.memory_mb,
                balance,
            },
            n,
        ),
        Command::Up(UpArgs { server, .. }) | Command::Worker(server) => serve(server),
        Command::Controller(args) => cluster::controller(args),
        Command::Function(cmd) => function(cmd),
        Command::Key(cmd) => key(cmd),
        Command::Runtime(cmd) => hearth_cli::runtime_cmd::run(cmd),
        Command::Cluster(ClusterCommand::Credential(cmd)) => credential(cmd),
        Command::Invoke {
            name,
            data,
            is_async,
            idempotency_key,
            url,
        } => {
            serde_json::from_str::<Value>(&data).context("--data is not valid JSON")?;
            let q = if is_async { "?async=true" } else { "" };
            let mut c = client(&url)?;
            c.set_header("Idempotency-Key", idempotency_key.as_deref())?;
            let r = c.post(&format!("/v1/functions/{name}/invoke{q}"), data.as_bytes())?;
            print_response(r)
        }
        Command::Result { id, wait, url } => {
            let mut c = client(&url)?;
            loop {
                let r = c.get(&format!("/v1/invocations/{id}"))?;
                let running = r
                    .typed::<AsyncRecord>()
                    .is_some_and(|rec| rec.status == AsyncState::Running);
                if !wait || r.status != 200 || !running {
                    return print_response(r);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Command::Prewarm { name, count, url } => {
            let body = json!({ "count": count }).to_string();
            print_response(
                client(&url)?.post(&format!("/v1/functions/{name}/prewarm"), body.as_bytes())?,
            )
        }
        Command::Status { url } => print_response(client(&url)?.get("/v1/status")?),
        Command::Bench(b) => bench_cmd(b),
        Command::Load(c) => hearth_cli::load::run(c),
        Command::Trace(c) => hearth_cli::trace_cmd::run(c),
        Command::Report(a) => hearth_cli::report_cmd::run(a),
        Command::Sim(a) => hearth_cli::sim_cmd::run(a),
        Command::Experiment(a) => hearth_cli::experiment_cmd::run(a),
        Command::Provision(a) => hearth_cli::provision_cmd::run(a),
    }
}

/// The scheduling flags `hearth up --workers N` hands to every worker it starts.
fn worker_policy_args(s: &ServerArgs) -> Vec<String> {
    let mut a = Vec::new();
    if let Some(q) = s.queue {
        a.extend(["--queue".to_string(), q.to_string()]);
    }
    if let Some(k) = s.keepalive {
        a.extend(["--keepalive".to_string(), k.to_string()]);
    }
    match &s.concurrency {
        Some(Concurrency::Limit(n)) => a.extend(["--concurrency".to_string(), n.to_string()]),
        Some(Concurrency::Named(n)) => a.extend(["--concurrency".to_string(), n.clone()]),
        None => {}
    }
    if let Some(c) = s.cpus {
        a.extend(["--cpus".to_string(), c.to_string()]);
    }
    if let Some(m) = s.proactive_mb {
        a.extend(["--proactive-mb".to_string(), m.to_string()]);
    }
    if let Some(k) = s.cpu_sched {
        a.extend(["--cpu-sched".to_string(), k.to_string()]);
    }
    if let Some(m) = s.sfs_slice_ms {
        a.extend(["--sfs-slice-ms".to_string(), m.to_string()]);
    }
    a
}

fn key(cmd: KeyCommand) -> Result<()> {
    match cmd {
        KeyCommand::Create {
            namespace,
            role,
            description,
            url,
        } => {
            let mut body = json!({"role": role, "description": description});
            if let Some(ns) = namespace {
                body["namespace"] = json!(ns);
            }
            print_response(client(&url)?.post("/v1/keys", body.to_string().as_bytes())?)
        }
        KeyCommand::List { url } => print_response(client(&url)?.get("/v1/keys")?),
        KeyCommand::Rm { id, url } => {
            let r = client(&url)?.delete(&format!("/v1/keys/{id}"))?;
            if r.status == 204 {
                println!("deleted key {id}");
                return Ok(());
            }
            print_response(r)
        }
    }
}

fn credential(cmd: CredentialCommand) -> Result<()> {
    match cmd {
        CredentialCommand::Create {
            worker,
            out,
            description,
            url,
        } => {
            if out.exists() {
                bail!("{} exists; choose another --out", out.display());
            }
            let body = json!({"worker": worker, "description": description});
            let r = client(&url)?.post("/v1/cluster/credentials", body.to_string().as_bytes())?;
            if r.status != 201 {
                return print_response(r);
            }
            let v = r.json();
            let file = v["file"]
                .as_str()
                .context("the controller's answer has no credential file")?;
            hearth_service::auth::write_private(&out, file)
                .with_context(|| format!("writing {}", out.display()))?;
            println!(
                "created worker credential {} for worker {worker:?}; wrote {} (give it to that worker as cluster_key_file)",
                v["id"].as_str().unwrap_or_default(),
                out.display()
            );
            Ok(())
        }
        CredentialCommand::List { url } => {
            print_response(client(&url)?.get("/v1/cluster/credentials")?)
        }
        CredentialCommand::Rm { id, url } => {
            let r = client(&url)?.delete(&format!("/v1/cluster/credentials/{id}"))?;
            if r.status == 204 {
                println!("revoked worker credential {id}");
                return Ok(());
            }
            print_response(r)
        }
    }
}

fn client(url: &UrlArg) -> Result<Client> {
    Ok(Client::new(&url.url)?)
}

/// Prints a JSON answer; an error status becomes a non-zero exit with the server's message.
fn print_response(r: Response) -> Result<()> {
    if r.status >= 400 {
        let Some(ErrorBody { error }) = r.error_body() else {
            bail!("{} error: {}", r.status, r.text());
        };
        let traceback = error.details.get("traceback").and_then(Value::as_str);
        if let Some(tb) = traceback.filter(|t| !t.is_empty()) {
            eprintln!("{tb}");
        }
        bail!("{} {}: {}", r.status, error.code, error.message);
    }
    let v = r.json();
    if v.is_null() {
        if !r.body.is_empty() {
            println!("{}", r.text());
        }
    } else {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

fn serve(args: ServerArgs) -> Result<()> {
    let mut config = WorkerConfig::load(args.config.as_deref())?;
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(b) = args.backend {
        config.backend = b;
    }
    if let Some(m) = args.memory_mb {
        config.memory_mb = m;
    }
    if let Some(m) = args.proactive_mb {
        config.proactive_mb = m;
    }
    if let Some(k) = args.cpu_sched {
        config.cpu_sched = k;
    }
    if let Some(m) = args.sfs_slice_ms {
        config.sfs_slice_ms = m;
    }
    if let Some(q) = args.queue {
        config.queue = q;
    }
    if let Some(k) = args.keepalive {
        config.keepalive = k;
    }
    if let Some(c) = args.concurrency {
        config.concurrency = c;
    }
    if let Some(c) = args.cpus {
        config.cpus = c;
    }
    if let Some(s) = args.store {
        config.store = Some(s);
    }
    if let Some(c) = args.controller {
        config.controller = Some(c);
    }
    config.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.effective_runtime_threads())
        .enable_all()
        .build()?;
    // The signal handlers go in before the server starts (inside the runtime).
    rt.block_on(async {
        hearth_worker::server::serve(config, hearth_service::serving::shutdown_signal()).await
    })?;
    Ok(())
}

fn function(cmd: FnCommand) -> Result<()> {
    match cmd {
        FnCommand::Register {
            name,
            code,
            handler,
            memory,
            cpus,
            priority,
            timeout,
            env,
            sim_warm_ms,
            sim_cold_ms,
            gpu,
            retries,
            wait,
            url,
        } => {
            let mut body = json!({
                "handler": handler,
                "memory_mb": memory,
                "cpus": cpus,
                "timeout_ms": timeout.as_millis() as u64,
                "env": env.into_iter().map(|(k, v)| (k, Value::String(v))).collect::<serde_json::Map<String, Value>>(),
            });
            if let Some(path) = code {
                let (code, module) = code::pack(&path).map_err(anyhow::Error::msg)?;
                body["code"] = code;
                if let Some(m) = module.filter(|_| !handler.contains('.')) {
                    body["handler"] = json!(format!("{m}.{handler}"));
                }
            }
            if let Some(p) = priority {
                body["priority"] = json!(p);
            }
            if let Some(v) = sim_warm_ms {
                body["sim_warm_ms"] = json!(v);
            }
            if let Some(v) = sim_cold_ms {
                body["sim_cold_ms"] = json!(v);
            }
            if let Some(d) = gpu.device {
                body["device"] = json!(d);
            }
            if let Some(v) = gpu.gpu_memory {
                body["gpu_memory_mb"] = json!(v);
            }
            if let Some(v) = gpu.sim_gpu_warm_ms {
                body["sim_gpu_warm_ms"] = json!(v);
            }
            if let Some(v) = gpu.sim_gpu_cold_ms {
                body["sim_gpu_cold_ms"] = json!(v);
            }
            if let Some(v) = retries {
                body["retries"] = json!(v);
            }
            let path = if wait {
                format!("/v1/functions/{name}?wait=true")
            } else {
                format!("/v1/functions/{name}")
            };
            let r = client(&url)?.put(&path, body.to_string().as_bytes())?;
            let failed = wait && r.status < 300 && r.json()["state"] == "failed";
            if failed {
                let v = r.json();
                eprintln!("{}", v["build_log"].as_str().unwrap_or(""));
                bail!("{name} failed to build (`hearth fn show {name}` shows the build log)");
            }
            print_response(r)
        }
        FnCommand::List { url } => {
            let r = client(&url)?.get("/v1/functions")?;
            if r.status != 200 {
                return print_response(r);
            }
            let v = r.json();
            println!(
                "{:<32} {:<8} {:>8} {:>6} {:>10} {:>5} {:>8}",
                "NAME", "STATE", "MEMORY", "CPUS", "TIMEOUT", "WARM", "RUNNING"
            );
            for f in v["functions"].as_array().into_iter().flatten() {
                let name = f["name"].as_str().unwrap_or("");
                let name = match f["namespace"].as_str() {
                    Some(ns) if ns != "default" => format!("{ns}.{name}"),
                    _ => name.to_string(),
                };
                println!(
                    "{:<32} {:<8} {:>6}Mi {:>6} {:>8}ms {:>5} {:>8}",
                    name,
                    // A controller's list has no state: its workers build.
                    f["state"].as_str().unwrap_or("-"),
                    // Value's Display ignores widths: pad the rendered text.
                    f["memory_mb"].to_string(),
                    f["cpus"].to_string(),
                    f["timeout_ms"].to_string(),
                    f["pool"]["warm"].as_u64().unwrap_or(0),
                    f["pool"]["running"].as_u64().unwrap_or(0),
                );
            }
            Ok(())
        }
        FnCommand::Show { name, url } => {
            print_response(client(&url)?.get(&format!("/v1/functions/{name}"))?)
        }
        FnCommand::Rm { name, url } => {
            let r = client(&url)?.delete(&format!("/v1/functions/{name}"))?;
            if r.status == 204 {
                println!("deleted {name}");
                return Ok(());
            }
            print_response(r)
        }
    }
}

fn bench_cmd(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Overhead {
            url,
            clients,
            duration,
            warmup,
            exec_ms,
            prewarm,
            gpu,
            json: as_json,
        } => {
            if clients == 0 {
                bail!("--clients must be at least 1");
            }
            let f = bench::register_bench_function(&url.url, exec_ms, gpu)
                .map_err(anyhow::Error::msg)?;
            let prewarm = if gpu { 0 } else { prewarm.unwrap_or(clients) };
            let r = bench::closed_loop_prewarmed(&url.url, &f, clients, prewarm, duration, warmup)
                .map_err(anyhow::Error::msg)?;
            if as_json {
                println!("{}", r.to_json());
            } else {
                let p = |v: &[u64], q| percentile(v, q);
                println!(
                    "bench overhead: {} client(s), {:.1} s, function {f} (exec {exec_ms} ms)",
                    clients,
                    duration.as_secs_f64()
                );
                println!(
                    "throughput   {:>10.0} invocations/s ({} invocations, {} errors, {} cold)",
                    r.throughput(),
                    r.invocations,
                    r.errors,
                    r.cold
                );
                println!(
                    "overhead µs  p50 {:>6}  p90 {:>6}  p99 {:>6}   (client e2e − exec)",
                    p(&r.overhead_us, 50.0),
                    p(&r.overhead_us, 90.0),
                    p(&r.overhead_us, 99.0)
                );
                println!(
                    "  in server  p50 {:>6}  p90 {:>6}  p99 {:>6}   (timing.overhead: worker, + controller if any)",
                    p(&r.server_overhead_us, 50.0),
                    p(&r.server_overhead_us, 90.0),
                    p(&r.server_overhead_us, 99.0)
                );
                if !r.controller_us.is_empty() {
                    println!(
                        "  controller p50 {:>6}  p90 {:>6}  p99 {:>6}   (timing.controller, included above)",
                        p(&r.controller_us, 50.0),
                        p(&r.controller_us, 90.0),
                        p(&r.controller_us, 99.0)
                    );
                }
                println!(
                    "e2e µs       p50 {:>6}  p90 {:>6}  p99 {:>6}",
                    p(&r.e2e_us, 50.0),
                    p(&r.e2e_us, 90.0),
                    p(&r.e2e_us, 99.0)
                );
            }
            Ok(())
        }
        BenchCommand::Route {
            workers,
            functions,
            decisions,
            mean_load,
            balance,
            json: as_json,
        } => {
            if workers == 0 || functions == 0 || decisions == 0 {
                bail!("--workers, --functions and --decisions must be at least 1");
            }
            if !(mean_load.is_finite() && mean_load >= 0.0) {
                bail!("--mean-load must be a non-negative number");
            }
            let kinds = balance.map_or(BalanceKind::ALL.to_vec(), |k| vec![k]);
            // Atoll is not a `--balance` policy (it is `[atoll]`): measured with the full set.
            let atoll = balance.is_none();
            let setup = route_bench::Setup {
                workers,
                functions,
                decisions,
                mean_load,
            };
            route_bench::print(&setup, &kinds, atoll, as_json).map_err(anyhow::Error::msg)
        }
        BenchCommand::Auth {
            checks,
            json: as_json,
        } => hearth_cli::auth_bench::run(checks, as_json),
        BenchCommand::Alps {
            cpus,
            window_s,
            rounds,
            json: as_json,
        } => hearth_cli::alps_bench::run(cpus, window_s, rounds, as_json),
        BenchCommand::Async {
            url,
            n,
            json: as_json,
        } => {
            let (lat, errors) =
                bench::async_accepts(&url.url, n.max(1), 100).map_err(anyhow::Error::msg)?;
            let mean = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64;
            let j = json!({
                "accepts": lat.len(),
                "errors": errors,
                "accept_us": {"p50": percentile(&lat, 50.0), "p90": percentile(&lat, 90.0),
                               "p99": percentile(&lat, 99.0), "mean": mean.round()},
            });
            if as_json {
                println!("{j}");
            } else {
                println!(
                    "bench async: {} accepts ({} errors); accept µs p50 {} p90 {} p99 {} mean {:.0}",
                    lat.len(),
                    errors,
                    percentile(&lat, 50.0),
                    percentile(&lat, 90.0),
                    percentile(&lat, 99.0),
                    mean
                );
            }
            Ok(())
        }
        BenchCommand::Cold {
            url,
            rounds,
            code,
            memory,
            host_import,
            host_site,
            host_python,
            json: as_json,
        } => bench_cold(
            &url.url,
            rounds.max(1),
            code.as_deref(),
            memory,
            host_import.as_deref().zip(host_site.as_deref()),
            &host_python,
            as_json,
        ),
    }
}

/// `hearth bench cold`: the cold starts per path, and with a host import the ratio the issue
/// targets (generic-path init / the host's own import of the same packages).
fn bench_cold(
    url: &str,
    rounds: usize,
    code: Option<&Path>,
    memory_mb: u64,
    host: Option<(&str, &Path)>,
    host_python: &Path,
    as_json: bool,
) -> Result<()> {
    let (samples, what) = match code {
        None => (
            bench::cold_starts(url, rounds).map_err(anyhow::Error::msg)?,
            "a hello function".to_string(),
        ),
        Some(dir) => {
            let (packed, module) = code::pack(dir).map_err(anyhow::Error::msg)?;
            let handler = module.map_or("main.main".to_string(), |m| format!("{m}.main"));
            let spec = json!({"code": packed, "handler": handler, "memory_mb": memory_mb});
            let samples = bench::cold_starts_of(url, "hearth-bench-cold-code", &spec, rounds)
                .map_err(anyhow::Error::msg)?;
            (samples, format!("the function of {}", dir.display()))
        }
    };
    let host_us = match host {
        Some((modules, site)) => Some(
            bench::host_imports(host_python, site, modules, rounds).map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
    let ms = |v: &[u64], p: f64| percentile(v, p) as f64 / 1000.0;
    let mut paths = serde_json::Map::new();
    for path in ["preimported", "generic", "fresh"] {
        let of = |f: fn(&bench::ColdSample) -> u64| {
            let mut v: Vec<u64> = samples.iter().filter(|s| s.path == path).map(f).collect();
            v.sort_unstable();
            v
        };
        let (init, e2e) = (of(|s| s.init_us), of(|s| s.e2e_us));
        if init.is_empty() {
            continue;
        }
        paths.insert(
            path.to_string(),
            json!({
                "rounds": init.len(),
                "init_ms": {"p50": ms(&init, 50.0), "p99": ms(&init, 99.0)},
                "e2e_ms": {"p50": ms(&e2e, 50.0), "p99": ms(&e2e, 99.0)},
            }),
        );
    }
    let mut j = json!({"rounds": rounds, "paths": paths});
    if let Some(h) = &host_us {
        let host_p50 = ms(h, 50.0);
        j["host_import_ms"] = json!({"p50": host_p50, "p99": ms(h, 99.0), "runs": h.len()});
        // The ratio is the generic path's; a function of a layer whose cold starts all
        // found a pre-imported sandbox or none has no generic path: the fresh one is printed too.
        for path in ["generic", "fresh"] {
            let Some(p) = paths.get(path) else { continue };
            let init = p["init_ms"]["p50"].as_f64().unwrap_or(0.0);
            if host_p50 > 0.0 {
                j[format!("{path}_over_host_import")] =
                    json!((init / host_p50 * 100.0).round() / 100.0);
            }
        }
    }
    if as_json {
        println!("{j}");
        return Ok(());
    }
    println!("bench cold: {rounds} cold starts of {what}");
    for (path, p) in &paths {
        let v = |k: &str, q: &str| p[k][q].as_f64().unwrap_or(0.0);
        let label = if path == "preimported" {
            "pre-imported"
        } else {
            path.as_str()
        };
        println!(
            "{label:<12} ({:>3})  init ms p50 {:>7.1} p99 {:>7.1}   client e2e ms p50 {:>7.1} p99 {:>7.1}",
            p["rounds"],
            v("init_ms", "p50"),
            v("init_ms", "p99"),
            v("e2e_ms", "p50"),
            v("e2e_ms", "p99"),
        );
    }
    if let Some(h) = &j.get("host_import_ms") {
        println!(
            "host import  ({:>3})  ms p50 {:>7.1} p99 {:>7.1}",
            h["runs"],
            h["p50"].as_f64().unwrap_or(0.0),
            h["p99"].as_f64().unwrap_or(0.0)
        );
        match j.get("generic_over_host_import") {
            Some(r) => println!("generic-path init / host import: {r} (target <= 1.3)"),
            None => println!("generic-path init / host import: no generic cold start measured"),
        }
        if let Some(r) = j.get("fresh_over_host_import") {
            println!("fresh-path init / host import: {r} (sandbox creation included)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("the key file is bad")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("authentication: {0}")]
        Auth(#[from] Inner),
    }

    #[test]
    fn an_error_that_shows_its_source_prints_it_once() {
        let e = anyhow::Error::new(Outer::from(Inner)).context("starting the worker");
        assert_eq!(
            super::chain_message(&e),
            "starting the worker: authentication: the key file is bad"
        );
    }
}
