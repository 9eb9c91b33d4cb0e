//! Real etcd on loopback for tests: one or three members, each in its own temporary directory
//! with free client and peer ports, logging to a file there.
//!
//! Kept as a normal module (not `cfg(test)`) because the integration tests of other crates use
//! it. Every member is killed (SIGKILL, by its PID) and every directory removed when the
//! [`LocalEtcd`] is dropped, also when a test panics.
//!
//! [`LocalEtcd::start_with`] serves clients over TLS (files the test made, e.g. with rcgen),
//! optionally demanding client certificates; [`LocalEtcd::enable_auth`] then turns etcd's
//! users and roles on, and [`LocalEtcd::add_user`] adds users confined to key prefixes, so
//! tests run against etcd secured as `deploy/` sets it up.
//!
//! Ports are found by binding port 0 and releasing it just before etcd starts, so another
//! process may in rare cases take one in between; [`LocalEtcd::start`] then fails with the
//! member's log excerpt in [`LocalEtcd::wait_ready`]'s error.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where etcd is looked for unless `HEARTH_ETCD_BIN` names another binary.
pub const DEFAULT_ETCD_BIN: &str = "/usr/bin/etcd";

/// How long [`LocalEtcd::wait_ready`] waits for every running member to serve.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a local etcd could not be run.
#[derive(Debug, thiserror::Error)]
pub enum LocalEtcdError {
    #[error("etcd is not installed at {0}")]
    NotInstalled(String),
    #[error("local etcd: {0}")]
    Io(#[from] std::io::Error),
    #[error("local etcd has {members} members; there is no member {index}")]
    NoSuchMember { index: usize, members: usize },
    #[error("local etcd supports 1 to 7 members, not {0}")]
    BadSize(usize),
    #[error("local etcd did not become ready: {0}")]
    NotReady(String),
    #[error("local etcd's users and roles: {0}")]
    Auth(String),
}

/// TLS for a local etcd's client port: PEM files of a CA and of a server certificate for
/// `127.0.0.1` signed by it.
#[derive(Debug, Clone)]
pub struct LocalEtcdTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// etcd's `--client-cert-auth`: clients without a certificate the CA signed are refused.
    pub client_cert_auth: bool,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running local etcd cluster; dropping it kills the members and removes their data.
pub struct LocalEtcd {
    members: Vec<Member>,
    token: String,
    initial_cluster: String,
    bin: PathBuf,
    tls: Option<LocalEtcdTls>,
    /// What the readiness probe and the admin helpers connect with (TLS, client cert, root).
    admin: super::etcd::EtcdCredentials,
    // Dropped last (fields drop in order): the members are killed in `Drop` first.
    _dir: tempfile::TempDir,
}

/// The etcd binary tests should use: `HEARTH_ETCD_BIN` or [`DEFAULT_ETCD_BIN`].
pub fn etcd_bin() -> PathBuf {
    std::env::var_os("HEARTH_ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ETCD_BIN))
}

/// Whether an etcd binary is there; tests skip (with a message) when not.
pub fn etcd_available() -> bool {
    etcd_bin().is_file()
}

/// For tests: true when etcd can run; false (printed as a skip) when it is missing, unless
/// `HEARTH_REQUIRE_ETCD=1` (the full suite), where a missing etcd fails the test instead.
pub fn etcd_for_tests() -> bool {
    if etcd_available() {
        return true;
    }
    assert!(
        std::env::var("HEARTH_REQUIRE_ETCD").as_deref() != Ok("1"),
        "HEARTH_REQUIRE_ETCD=1 but there is no etcd binary at {} (apt-get install etcd-server)",
        etcd_bin().display()
    );
    eprintln!("skipped: no etcd binary (apt-get install etcd-server)");
    false
}

/// Reserves `n` distinct free loopback ports; the listeners are closed on return.
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

impl LocalEtcd {
    /// Starts `members` members (1 or 3 in practice) as a new cluster; call
    /// [`LocalEtcd::wait_ready`] before using it.
    pub fn start(members: usize) -> Result<LocalEtcd, LocalEtcdError> {
        Self::start_with(members, None)
    }

    /// [`LocalEtcd::start`] serving clients over TLS when `tls` is given. The admin
    /// credentials (for [`LocalEtcd::wait_ready`] and the user helpers) trust its CA and, with
    /// client-cert auth, present its server certificate as a client one unless
    /// [`LocalEtcd::set_admin_identity`] gives another.
    pub fn start_with(
        members: usize,
        tls: Option<LocalEtcdTls>,
    ) -> Result<LocalEtcd, LocalEtcdError> {
        if !(1..=7).contains(&members) {
            return Err(LocalEtcdError::BadSize(members));
        }
        let bin = etcd_bin();
        if !bin.is_file() {
            return Err(LocalEtcdError::NotInstalled(bin.display().to_string()));
        }
        let dir = tempfile::Builder::new().prefix("hearth-etcd-").tempdir()?;
        let token = format!("hearth-test-{:032x}", rand::random::<u128>());
        let ports = free_ports(members * 2)?;
        let mut list = Vec::with_capacity(members);
        for i in 0..members {
            let member_dir = dir.path().join(format!("m{i}"));
            std::fs::create_dir_all(&member_dir)?;
            list.push(Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: member_dir.join("data"),
                log: member_dir.join("etcd.log"),
                child: None,
            });
        }
        let initial_cluster = list
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut admin = super::etcd::EtcdCredentials::default();
        if let Some(t) = &tls {
            admin.ca_pem = Some(std::fs::read(&t.ca)?);
            if t.client_cert_auth {
                admin.identity = Some((std::fs::read(&t.cert)?, std::fs::read(&t.key)?));
            }
        }
        let mut etcd = LocalEtcd {
            members: list,
            token,
            initial_cluster,
            bin,
            tls,
            admin,
            _dir: dir,
        };
        for i in 0..members {
            etcd.spawn(i, "new")?;
        }
        Ok(etcd)
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<(), LocalEtcdError> {
        let m = &self.members[i];
        let log = File::options().create(true).append(true).open(&m.log)?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut cmd = Command::new(&self.bin);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.cert)
                .arg("--key-file")
                .arg(&t.key)
                .arg("--trusted-ca-file")
                .arg(&t.ca);
            if t.client_cert_auth {
                cmd.arg("--client-cert-auth");
            }
        }
        let child = cmd
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn member(&mut self, i: usize) -> Result<&mut Member, LocalEtcdError> {
        let members = self.members.len();
        self.members
            .get_mut(i)
            .ok_or(LocalEtcdError::NoSuchMember { index: i, members })
    }

    /// The client endpoints, `127.0.0.1:PORT`, member 0 first.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The endpoints as `http://127.0.0.1:PORT`, or `https://…` with TLS (what
    /// [`super::StoreUrl::Etcd`] holds).
    pub fn http_endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints()
            .into_iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }

    /// The `--store` value naming this cluster: `etcd://a,b,c`, or `etcds://a,b,c` with TLS.
    pub fn store_url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    /// The credentials the readiness probe and the admin helpers use.
    pub fn admin(&self) -> &super::etcd::EtcdCredentials {
        &self.admin
    }

    /// The client certificate (PEM cert and key) admin connections present.
    pub fn set_admin_identity(&mut self, cert: Vec<u8>, key: Vec<u8>) {
        self.admin.identity = Some((cert, key));
    }

    async fn admin_client(&self) -> Result<etcd_client::Client, LocalEtcdError> {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        let endpoints = self.http_endpoints();
        let opts = self
            .admin
            .apply(opts, &endpoints)
            .map_err(|e| LocalEtcdError::NotReady(e.to_string()))?;
        etcd_client::Client::connect(&endpoints, Some(opts))
            .await
            .map_err(|e| LocalEtcdError::Auth(e.to_string()))
    }

    /// Turns etcd's authentication on: a `root` user (role `root`) with `root_password`,
    /// which the admin credentials use from now on. Every other client needs a user (or a
    /// client certificate whose CN is one) afterwards.
    pub async fn enable_auth(&mut self, root_password: &str) -> Result<(), LocalEtcdError> {
        let mut c = self.admin_client().await?;
        let err = |e: etcd_client::Error| LocalEtcdError::Auth(e.to_string());
        c.user_add("root", root_password, None).await.map_err(err)?;
        c.user_grant_role("root", "root").await.map_err(err)?;
        c.auth_enable().await.map_err(err)?;
        self.admin.user = Some(("root".into(), root_password.into()));
        Ok(())
    }

    /// Adds user `name` with `password` and a role of the same name allowed exactly the given
    /// grants: (key or prefix, whether it is a prefix, read-write (true) or read-only).
    pub async fn add_user(
        &self,
        name: &str,
        password: &str,
        grants: &[(&str, bool, bool)],
    ) -> Result<(), LocalEtcdError> {
        use etcd_client::Permission;
        let mut c = self.admin_client().await?;
        let err = |e: etcd_client::Error| LocalEtcdError::Auth(e.to_string());
        c.user_add(name, password, None).await.map_err(err)?;
        c.role_add(name).await.map_err(err)?;
        for (key, prefix, write) in grants {
            let mut p = if *write {
                Permission::read_write(*key)
            } else {
                Permission::read(*key)
            };
            if *prefix {
                p = p.with_prefix();
            }
            c.role_grant_permission(name, p).await.map_err(err)?;
        }
        c.user_grant_role(name, name).await.map_err(err)?;
        Ok(())
    }

    /// A raw client with the admin credentials (to look at what is stored).
    pub async fn admin_raw(&self) -> Result<etcd_client::Client, LocalEtcdError> {
        self.admin_client().await
    }

    /// Every key under `prefix` and its value as etcd stores it, read with the admin
    /// credentials (tests look for what must not be there in clear).
    pub async fn dump(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, LocalEtcdError> {
        let mut c = self.admin_client().await?;
        let got = c
            .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .map_err(|e| LocalEtcdError::Auth(e.to_string()))?;
        Ok(got
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The log file of member `i` (for a failing test's message).
    pub fn log_path(&self, i: usize) -> Option<&Path> {
        self.members.get(i).map(|m| m.log.as_path())
    }

    /// Kills member `i` with SIGKILL (by its PID) and reaps it; no-op if it is not running.
    pub fn kill(&mut self, i: usize) -> Result<(), LocalEtcdError> {
        let m = self.member(i)?;
        if let Some(mut child) = m.child.take() {
            // `Child::kill` sends SIGKILL to this child's PID on Unix.
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts member `i` again on its data directory and ports (`--initial-cluster-state
    /// existing`); no-op if it is running.
    pub fn restart(&mut self, i: usize) -> Result<(), LocalEtcdError> {
        if self.member(i)?.child.is_some() {
            return Ok(());
        }
        self.spawn(i, "existing")
    }

    /// Waits (at most [`READY_TIMEOUT`]) until every running member answers a put and a get.
    pub async fn wait_ready(&mut self) -> Result<(), LocalEtcdError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let running: Vec<(usize, String)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.child.is_some())
            .map(|(i, m)| (i, format!("{scheme}://127.0.0.1:{}", m.client_port)))
            .collect();
        for (i, endpoint) in running {
            let mut last;
            loop {
                // A member that exited (bad flags, port taken) will never be ready.
                if let Some(Some(status)) = self.members[i]
                    .child
                    .as_mut()
                    .map(|c| c.try_wait().ok().flatten())
                {
                    self.members[i].child = None;
                    return Err(LocalEtcdError::NotReady(format!(
                        "member {i} exited ({status}); see {}",
                        self.members[i].log.display()
                    )));
                }
                match probe(&endpoint, &self.admin).await {
                    Ok(()) => break,
                    Err(e) => last = e,
                }
                if Instant::now() >= deadline {
                    return Err(LocalEtcdError::NotReady(format!(
                        "member {i} at {endpoint}: {last}; see {}",
                        self.members[i].log.display()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

/// One put and one linearizable get through `endpoint` alone.
async fn probe(endpoint: &str, admin: &super::etcd::EtcdCredentials) -> Result<(), String> {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2));
    let opts = admin
        .apply(opts, &[endpoint.to_string()])
        .map_err(|e| e.to_string())?;
    let mut client = etcd_client::Client::connect([endpoint], Some(opts))
        .await
        .map_err(|e| e.to_string())?;
    client
        .put("/__local_etcd_ready", "1", None)
        .await
        .map_err(|e| e.to_string())?;
    let got = client
        .get("/__local_etcd_ready", None)
        .await
        .map_err(|e| e.to_string())?;
    if got.kvs().is_empty() {
        return Err("probe key not found".into());
    }
    Ok(())
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
