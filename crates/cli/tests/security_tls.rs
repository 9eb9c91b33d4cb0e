//! Optional TLS (issue 11): listeners with `tls_cert`/`tls_key`, peers over `https://` trusting
//! `tls_ca`, the CLI's client over `https://`. The certificates are made here: a private CA and
//! a server certificate it signs for 127.0.0.1 and localhost.

mod common;

use common::cluster::{join, patient_client, sim_fn, wait_members};
use common::{read_until_closed, Server};
use hearth_cli::client::{Client, ClientError};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A private CA and a server certificate it signed, as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("hearth-tls-")
            .tempdir()
            .unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Each CA its own name, so that a certificate of one is never matched to another.
        let name = format!("Hearth test CA {}", rand_suffix());
        ca.distinguished_name.push(DnType::CommonName, name);
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let mut leaf =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, "hearth test server");
        let leaf_key = KeyPair::generate().unwrap();
        let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), leaf_cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), leaf_key.serialize_pem()).unwrap();
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// The settings of a TLS server that trusts this CA for its own peers.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("HEARTH_TLS_CERT", s(&self.path("cert.pem"))),
            ("HEARTH_TLS_KEY", s(&self.path("key.pem"))),
            ("HEARTH_TLS_CA", s(&self.ca())),
        ]
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed) + u64::from(std::process::id()) * 1000
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn borrow<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn addr_of(s: &Server) -> String {
    s.url.trim_start_matches("https://").to_string()
}

#[test]
fn a_tls_worker_answers_https_and_refuses_plain_http_and_untrusting_clients() {
    let pki = Pki::new();
    let env = pki.env();
    let w = Server::start("sim", &borrow(&env));
    assert!(w.url.starts_with("https://127.0.0.1:"), "{}", w.url);

    // Over https:// with the CA trusted: the whole API works.
    let r = w.put_fn("f", sim_fn(1, 1));
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let r = w.invoke("f", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    // A persistent connection carries many requests.
    let mut c = w.client();
    for _ in 0..5 {
        assert_eq!(c.get("/v1/status").unwrap().status, 200);
    }

    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = format!("http://{}", addr_of(&w));
    let got = Client::new(&plain)
        .unwrap()
        .with_timeout(Some(Duration::from_secs(20)))
        .get("/healthz");
    assert!(got.is_err(), "plain HTTP was answered: {got:?}");
    let mut raw = TcpStream::connect(addr_of(&w)).unwrap();
    raw.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let answer = read_until_closed(&mut raw).expect("the server kept a plain HTTP connection");
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1.1"),
        "plain HTTP was answered in HTTP"
    );

    // A client that trusts another CA (or only the system's roots) refuses the server.
    let other = Pki::new();
    let got = Client::new(&w.url)
        .unwrap()
        .with_ca_file(&other.ca())
        .unwrap()
        .with_timeout(Some(Duration::from_secs(20)))
        .get("/healthz");
    match got {
        Err(ClientError::Tls { error, .. }) => {
            assert!(error.to_string().contains("certificate"), "{error}")
        }
        other => panic!("an untrusted server was accepted: {other:?}"),
    }
    let got = Client::new(&w.url)
        .unwrap()
        .with_timeout(Some(Duration::from_secs(20)))
        .get("/healthz");
    assert!(
        matches!(got, Err(ClientError::Tls { .. })),
        "a server signed by a private CA was trusted through the system roots: {got:?}"
    );
}

#[test]
fn a_tls_controller_forwards_to_a_tls_worker_that_joined_over_https() {
    let pki = Pki::new();
    let env = pki.env();
    let c = Server::start_controller("ch-rlu", &borrow(&env));
    assert!(c.url.starts_with("https://"), "{}", c.url);
    let w = join(&c, None, &borrow(&env));
    assert!(w.url.starts_with("https://"), "{}", w.url);
    let id = w.worker_id();
    wait_members(&c, std::slice::from_ref(&id));
    // The worker advertised its https:// URL (the default follows its TLS setting).
    let status = c.status();
    let member = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["worker"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(member["url"], w.url.as_str(), "{member}");

    let r = c.put_fn("f", sim_fn(1, 1));
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let r = patient_client(&c)
        .post("/v1/functions/f/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], id.as_str(), "{}", r.text());
}

#[test]
fn a_controller_that_does_not_trust_the_workers_ca_never_sends_them_invocations() {
    let pki = Pki::new();
    let other = Pki::new();
    // The controller serves and trusts only `other`'s CA; the worker's certificate is signed
    // by `pki`'s, and it trusts both (the controller's, and its own for the test's clients).
    let c = Server::start_controller("ch-rlu", &borrow(&other.env()));
    let bundle = pki.path("both.pem");
    let both =
        std::fs::read_to_string(pki.ca()).unwrap() + &std::fs::read_to_string(other.ca()).unwrap();
    std::fs::write(&bundle, both).unwrap();
    let mut wenv = pki.env();
    wenv.retain(|(k, _)| *k != "HEARTH_TLS_CA");
    wenv.push(("HEARTH_TLS_CA", s(&bundle)));
    let w = join(&c, None, &borrow(&wenv));
    let id = w.worker_id();
    wait_members(&c, std::slice::from_ref(&id));
    let r = c.put_fn("f", sim_fn(1, 1));
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let r = patient_client(&c)
        .post("/v1/functions/f/invoke", b"{}")
        .unwrap();
    // The handshake fails before any byte of a request leaves: the function never reached the
    // worker, and the invocation is refused (503) rather than sent in the clear.
    assert_eq!(r.status, 503, "{}", r.text());
    let log = c.log_text();
    assert!(log.contains("invalid peer certificate"), "{log}");
    assert_eq!(w.client().get("/v1/functions/f").unwrap().status, 404);
}

#[test]
fn a_connection_that_never_completes_its_handshake_is_closed_at_the_header_timeout() {
    let pki = Pki::new();
    let mut env = pki.env();
    env.push(("HEARTH_HEADER_READ_TIMEOUT_MS", "300".into()));
    // Far longer than the test's 20 s guard: only the header timeout can close these.
    env.push(("HEARTH_IDLE_TIMEOUT_MS", "600000".into()));
    let w = Server::start("sim", &borrow(&env));
    // Opens TCP and never sends a ClientHello.
    let mut silent = TcpStream::connect(addr_of(&w)).unwrap();
    assert!(
        read_until_closed(&mut silent).is_some(),
        "a connection without a ClientHello was kept open"
    );
    // Sends the first bytes of a ClientHello (a handshake record header) and stalls.
    let mut stalled = TcpStream::connect(addr_of(&w)).unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    assert!(
        read_until_closed(&mut stalled).is_some(),
        "a connection with half a ClientHello was kept open"
    );
    // The server still serves.
    assert_eq!(w.client().get("/healthz").unwrap().status, 200);
}

/// Runs `hearth worker` with `env` expecting it to refuse to start; its stderr.
fn refused_start(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.args(["worker", "--backend", "sim", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("HEARTH_LOG", "info")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "hearth started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_tls_settings_stop_the_start_without_quoting_the_files() {
    let pki = Pki::new();
    let (cert, key) = (s(&pki.path("cert.pem")), s(&pki.path("key.pem")));
    let err = refused_start(&[("HEARTH_TLS_CERT", &cert)]);
    assert!(err.contains("tls_cert is set but tls_key is not"), "{err}");
    let err = refused_start(&[("HEARTH_TLS_KEY", &key)]);
    assert!(err.contains("tls_key is set but tls_cert is not"), "{err}");
    // The key given as the certificate: refused, and not one line of the key is printed.
    let err = refused_start(&[("HEARTH_TLS_CERT", &key), ("HEARTH_TLS_KEY", &key)]);
    assert!(err.contains("tls_cert holds no PEM certificate"), "{err}");
    let key_text = std::fs::read_to_string(pki.path("key.pem")).unwrap();
    for line in key_text.lines().filter(|l| l.len() > 8) {
        assert!(!err.contains(line), "the key was printed: {err}");
    }
    // A key that is not the certificate's.
    let other = Pki::new();
    let other_key = s(&other.path("key.pem"));
    let err = refused_start(&[("HEARTH_TLS_CERT", &cert), ("HEARTH_TLS_KEY", &other_key)]);
    assert!(
        err.contains("tls_cert and tls_key cannot be used together"),
        "{err}"
    );
}
