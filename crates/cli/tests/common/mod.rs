//! Test harness: runs the real `hearth` binary as a worker on a free loopback port.
#![allow(dead_code)]

pub mod cluster;
pub mod scenario;

use hearth_cli::client::{Client, Response};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub url: String,
    /// The operator key the server wrote at its first start (None with auth off).
    pub key: Option<String>,
    pub data_dir: PathBuf,
    /// For a TLS server (started with `HEARTH_TLS_CERT`): the CA its clients trust, the one in
    /// its own `HEARTH_TLS_CA`.
    pub ca_file: Option<PathBuf>,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
    pub log: PathBuf,
    /// How it was started (program arguments, environment), for [`Server::restart`].
    launched: (
        Vec<std::ffi::OsString>,
        Vec<(std::ffi::OsString, std::ffi::OsString)>,
    ),
}

/// Operator keys of the servers this test process started, by URL.
fn keys() -> &'static std::sync::Mutex<std::collections::HashMap<String, String>> {
    static KEYS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, String>>> =
        std::sync::OnceLock::new();
    KEYS.get_or_init(Default::default)
}

/// A client for a server this test started, with its operator key.
pub fn client_for(url: &str) -> Result<Client, hearth_cli::client::ClientError> {
    let key = keys()
        .lock()
        .unwrap()
        .get(url.trim_end_matches('/'))
        .cloned();
    Ok(Client::new(url)?.with_token(key))
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl Server {
    /// Starts a worker with `backend` and extra `HEARTH_*` environment settings.
    pub fn start(backend: &str, env: &[(&str, &str)]) -> Server {
        Server::start_with_args(backend, env, &[])
    }

    /// Starts a worker with extra command-line flags.
    pub fn start_with_args(backend: &str, env: &[(&str, &str)], args: &[&str]) -> Server {
        let tmp = tempfile::Builder::new()
            .prefix("hearth-test-")
            .tempdir()
            .unwrap();
        let data_dir = tmp.path().join("data");
        let mut s = Server::launch(backend, &data_dir, env, args);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a worker on an existing data directory (restart tests).
    pub fn start_in(backend: &str, data_dir: &Path, env: &[(&str, &str)]) -> Server {
        Server::launch(backend, data_dir, env, &[])
    }

    fn launch(backend: &str, data_dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Server {
        let args = [&["worker", "--backend", backend][..], args].concat();
        Server::spawn_hearth(&args, data_dir, env, |cmd, port| {
            cmd.env("HEARTH_WORKER_ID", format!("test-{port}"))
                .env_remove("HEARTH_REQUIRE_RUNC");
        })
    }

    /// Runs `hearth ARGS --listen 127.0.0.1:PORT --data-dir DATA_DIR` on a free port, logging to
    /// `DATA_DIR.PORT.log`, and waits for /healthz. `setup` adds settings that need the port;
    /// `env` goes on top of everything.
    fn spawn_hearth(
        args: &[&str],
        data_dir: &Path,
        env: &[(&str, &str)],
        setup: impl FnOnce(&mut Command, u16),
    ) -> Server {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(data_dir).unwrap();
        let log = data_dir.with_extension(format!("{port}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
        cmd.args(args)
            .args(["--listen", &listen])
            .arg("--data-dir")
            .arg(data_dir)
            .env("HEARTH_SHUTDOWN_GRACE_S", "10")
            .env("HEARTH_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        setup(&mut cmd, port);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let launched = (
            cmd.get_args().map(|a| a.to_os_string()).collect(),
            cmd.get_envs()
                .filter_map(|(k, v)| Some((k.to_os_string(), v?.to_os_string())))
                .collect(),
        );
        let child = cmd.spawn().expect("spawn hearth");
        let setting = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let scheme = match setting("HEARTH_TLS_CERT") {
            Some(_) => "https",
            None => "http",
        };
        let mut s = Server {
            key: None,
            url: format!("{scheme}://{listen}"),
            data_dir: data_dir.to_path_buf(),
            ca_file: setting("HEARTH_TLS_CA").map(PathBuf::from),
            child: Some(child),
            _tmp: None,
            log,
            launched,
        };
        s.wait_ready();
        // `hearth up --workers N` keeps the controller's data (and key) in `controller/`.
        s.key = [
            data_dir.join("admin.key"),
            data_dir.join("controller/admin.key"),
        ]
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .map(|k| k.trim().to_string());
        if let Some(k) = &s.key {
            keys().lock().unwrap().insert(s.url.clone(), k.clone());
        }
        s
    }

    /// Starts the same command again, on the same port and data directory, after it was
    /// killed (crash-restart tests); waits for /healthz.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "kill it first");
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
        cmd.args(&self.launched.0)
            .envs(self.launched.1.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawn hearth"));
        // The port may linger briefly after the kill.
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = self.connect() {
                if let Ok(r) = c.get("/healthz") {
                    if r.status == 200 {
                        return;
                    }
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("hearth exited at start ({status}): {}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "hearth did not start: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client of this server (trusting its CA if it serves TLS), with the default key.
    fn connect(&self) -> Result<Client, hearth_cli::client::ClientError> {
        let c = Client::new(&self.url)?;
        match &self.ca_file {
            Some(ca) => c.with_ca_file(ca),
            None => Ok(c),
        }
    }

    /// A client with the server's operator key.
    pub fn client(&self) -> Client {
        self.connect().unwrap().with_token(self.key.clone())
    }

    /// A client without any key.
    pub fn anonymous(&self) -> Client {
        self.connect().unwrap().with_token(None)
    }

    /// A client with `key`.
    pub fn client_with(&self, key: &str) -> Client {
        self.connect().unwrap().with_token(Some(key.to_string()))
    }

    /// Creates an API key (`namespace`, `role`) with the operator key; returns its token.
    pub fn new_key(&self, namespace: &str, role: &str) -> String {
        let r = self
            .client()
            .post(
                "/v1/keys",
                serde_json::json!({"namespace": namespace, "role": role})
                    .to_string()
                    .as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()["key"].as_str().unwrap().to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("hearth did not exit after SIGTERM: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn put_fn(&self, name: &str, spec: Value) -> Response {
        self.client()
            .put(
                &format!("/v1/functions/{name}"),
                spec.to_string().as_bytes(),
            )
            .unwrap()
    }

    pub fn invoke(&self, name: &str, args: &str) -> Response {
        self.client()
            .post(&format!("/v1/functions/{name}/invoke"), args.as_bytes())
            .unwrap()
    }

    pub fn status(&self) -> Value {
        self.client().get("/v1/status").unwrap().json()
    }

    /// Whether the sandbox whose bundle is `sandboxes/<id>` is a ready generic one (not yet a
    /// function's): its bundle's code mount point is still empty.
    pub fn is_ready_generic(&self, id: &str) -> bool {
        let point = self.data_dir.join("sandboxes").join(id).join("code");
        std::fs::read_dir(point).is_ok_and(|mut d| d.next().is_none())
    }

    /// The cgroup (in hierarchy `controller`) of the worker's only function sandbox (ready generic
    /// sandboxes aside).
    pub fn only_sandbox_cgroup(&self, controller: &str) -> PathBuf {
        let worker: String = self.status()["worker"]
            .as_str()
            .unwrap()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let parent = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("hearth")
            .join(worker);
        let dirs: Vec<PathBuf> = std::fs::read_dir(&parent)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && !p.ends_with("frozen-anchor"))
            .filter(|p| {
                // `hearth-<worker>-<id>`: its bundle is `sandboxes/<id>`.
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                !self.is_ready_generic(name.rsplit('-').next().unwrap())
            })
            .collect();
        assert_eq!(dirs.len(), 1, "one sandbox expected: {dirs:?}");
        dirs.into_iter().next().unwrap()
    }

    /// Waits (up to 10 s) until the worker's generic pool has a ready sandbox, so that the next
    /// cold start specializes one.
    pub fn wait_generic_ready(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.status()["generic_pool"]["ready"].as_u64().unwrap_or(0) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no generic sandbox became ready: {}",
                self.status()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            let status = self.terminate();
            if !std::thread::panicking() {
                assert!(
                    status.success(),
                    "hearth exited with {status}: {}",
                    self.log_text()
                );
            }
        }
    }
}

/// Polls an async invocation until it is no longer running.
pub fn wait_invocation(s: &Server, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = s
            .client()
            .get(&format!("/v1/invocations/{id}"))
            .unwrap()
            .json();
        if v["status"] != "running" {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "async invocation {id} never finished"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs the `hearth` binary with `args` (no `HEARTH_URL` from the environment).
/// With `--url` of a server this test started, its operator key goes along.
pub fn hearth(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.args(args).env_remove("HEARTH_URL");
    let url = args
        .iter()
        .position(|a| *a == "--url")
        .and_then(|i| args.get(i + 1));
    if let Some(key) = url.and_then(|u| keys().lock().unwrap().get(*u).cloned()) {
        cmd.env("HEARTH_API_KEY", key);
    }
    cmd.output().expect("run hearth")
}

/// Asserts success; returns stdout and stderr together.
pub fn ok(out: Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "hearth failed: {text}");
    text
}

/// Asserts failure; returns stderr.
pub fn failed(out: Output) -> String {
    assert!(!out.status.success(), "hearth should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Whether real-sandbox tests can run here (root and runc); with `HEARTH_REQUIRE_RUNC` set, a
/// missing runc fails the test instead of skipping it.
pub fn runc_available() -> bool {
    let ok = unsafe { libc::geteuid() } == 0
        && Command::new("runc")
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var("HEARTH_REQUIRE_RUNC").is_err(),
            "HEARTH_REQUIRE_RUNC is set but runc or root is missing"
        );
        eprintln!("skipping: real-sandbox tests need root and runc (apt-get install runc)");
    }
    ok
}

/// Reads until the server closes the connection; `None` if it is still open after 20 s.
pub fn read_until_closed(s: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    use std::io::Read;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            // A reset is the server closing too.
            Err(_) => return Some(out),
        }
    }
}
