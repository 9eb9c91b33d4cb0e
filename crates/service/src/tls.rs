//! TLS (rustls with the ring provider) for the listeners of both services and for their
//! clients: the controller's forwarder, the worker's membership client and the CLI's client.
//!
//! Certificates and keys are PEM files named by settings (`tls_cert`, `tls_key`, `tls_ca`).
//! Errors name the setting and what is wrong, never the file's path or any of its contents: a
//! key file given as a certificate must not end up in a log.

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Certificate, key and CA files larger than this are refused (a chain is a few KiB).
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {setting}: {source}")]
    Read {
        setting: &'static str,
        source: std::io::Error,
    },
    #[error("{setting} is larger than {MAX_PEM_BYTES} bytes")]
    TooLarge { setting: &'static str },
    #[error("{setting} is not a valid PEM file")]
    BadPem { setting: &'static str },
    #[error("{setting} holds no PEM {what}")]
    Missing {
        setting: &'static str,
        what: &'static str,
    },
    #[error("tls_cert and tls_key cannot be used together: {0}")]
    Pair(rustls::Error),
    #[error("{setting}: no certificate in it can be trusted: {why}")]
    Untrusted { setting: &'static str, why: String },
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The one crypto provider used everywhere (ring: no C toolchain beyond cc, no cmake).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM file of at most [`MAX_PEM_BYTES`].
fn read_pem(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let file = std::fs::File::open(path).map_err(|source| TlsError::Read { setting, source })?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| TlsError::Read { setting, source })?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(TlsError::TooLarge { setting });
    }
    Ok(bytes)
}

/// A PEM error without its text: pki-types' messages quote lines of the file.
fn pem_error(setting: &'static str, what: &'static str, e: pem::Error) -> TlsError {
    match e {
        pem::Error::NoItemsFound => TlsError::Missing { setting, what },
        pem::Error::Io(source) => TlsError::Read { setting, source },
        _ => TlsError::BadPem { setting },
    }
}

/// Every certificate in the PEM file `path` (setting `setting`); at least one.
pub fn load_certs(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_pem(setting, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(setting, "certificate", e))?;
    if certs.is_empty() {
        return Err(TlsError::Missing {
            setting,
            what: "certificate",
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in the PEM file `path`.
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    const SETTING: &str = "tls_key";
    let bytes = read_pem(SETTING, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| pem_error(SETTING, "private key", e))
}

/// The listener's TLS: the certificate chain in `cert` (leaf first) and its key in `key`.
/// Only HTTP/1.1 is offered, as the listener speaks nothing else.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = load_certs("tls_cert", cert)?;
    let key = load_key(key)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Pair)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The connector of an HTTP client that reaches `http://` peers over plain TCP and
/// `https://` ones over TLS trusting `tls`; connecting gives up after `connect_timeout`.
pub fn client_connector(
    tls: Arc<ClientConfig>,
    connect_timeout: Option<std::time::Duration>,
) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(connect_timeout);
    // The TLS connector takes `https://` URIs through this one; it passes `http://`
    // connections through untouched.
    http.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(Arc::unwrap_or_clone(tls))
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

/// What a client trusts: the certificates in `ca` (setting `setting`) if given, else the
/// system's roots. The system's roots may be missing (a bare container): that is only logged,
/// since plain `http://` peers need none; an `https://` peer then fails its handshake.
pub fn client_config(
    setting: &'static str,
    ca: Option<&Path>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            let (added, ignored) = roots.add_parsable_certificates(load_certs(setting, path)?);
            if added == 0 {
                return Err(TlsError::Untrusted {
                    setting,
                    why: format!("{ignored} certificate(s) could not be parsed"),
                });
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::debug!(error = %e, "a system root certificate could not be loaded");
            }
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    "no system root certificates found: https:// peers will fail unless {setting} is set"
                );
            }
        }
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_refused_without_quoting_them() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "-----BEGIN CERTIFICATE SECRET-LINE\nMIIB\n";
        let f = dir.path().join("bad.pem");
        std::fs::write(&f, secret).unwrap();
        let err = load_certs("tls_cert", &f).unwrap_err().to_string();
        assert!(!err.contains("SECRET") && !err.contains("bad.pem"), "{err}");
        assert!(err.starts_with("tls_cert"), "{err}");

        std::fs::write(&f, "just text, no PEM at all\n").unwrap();
        let err = load_certs("tls_ca", &f).unwrap_err().to_string();
        assert_eq!(err, "tls_ca holds no PEM certificate");
        let err = server_config(&f, &f).unwrap_err().to_string();
        assert_eq!(err, "tls_cert holds no PEM certificate");

        let missing = dir.path().join("nope.pem");
        let err = load_certs("tls_cert", &missing).unwrap_err().to_string();
        assert!(err.starts_with("cannot read tls_cert:"), "{err}");
        assert!(!err.contains("nope.pem"), "{err}");

        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'a'; MAX_PEM_BYTES as usize + 1]).unwrap();
        let err = load_certs("tls_cert", &big).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }
}
