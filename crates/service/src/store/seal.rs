//! Sealing of the secrets the cluster keeps in etcd (function records with their `env`,
//! async invocations with their arguments and answers).
//!
//! etcd is a shared service that backups, operators and (without TLS and authentication)
//! anyone on its network can read, so the values that carry tenants' secrets are encrypted
//! and authenticated with a key etcd never sees: XChaCha20-Poly1305 with a key derived
//! (HKDF-SHA256, label [`SEAL_LABEL`]) from the controllers' cluster key, which every
//! controller is given as a file. The etcd key a value is stored under is its associated
//! data, so a sealed value moved to another key does not open either.
//!
//! A sealed value is `hearth-sealed-v1:` followed by base64 of `key id (8) ‖ nonce (24) ‖
//! ciphertext`; the key id (also HKDF-derived, not the key) tells "sealed with another
//! cluster key" apart from "altered".

use super::StoreError;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hkdf::Hkdf;
use sha2::Sha256;

/// The HKDF label of the sealing key; a new label is a new key.
pub const SEAL_LABEL: &[u8] = b"hearth etcd secrets v1";
/// The HKDF label of the key id written beside each sealed value.
const KEY_ID_LABEL: &[u8] = b"hearth etcd secrets v1 key id";
/// What every sealed value starts with.
pub const SEALED_PREFIX: &[u8] = b"hearth-sealed-v1:";
const KEY_ID_BYTES: usize = 8;
const NONCE_BYTES: usize = 24;

/// Seals and opens values with the cluster's sealing key.
#[derive(Clone)]
pub struct Sealer {
    cipher: XChaCha20Poly1305,
    key_id: [u8; KEY_ID_BYTES],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").finish_non_exhaustive()
    }
}

impl Sealer {
    /// The sealer of the cluster whose key is `cluster_key` (`ClusterKey::token()`).
    pub fn from_cluster_key(cluster_key: &str) -> Sealer {
        let hk = Hkdf::<Sha256>::new(None, cluster_key.as_bytes());
        let mut key = [0u8; 32];
        let mut key_id = [0u8; KEY_ID_BYTES];
        // Both lengths are far below HKDF-SHA256's limit of 255 × 32 bytes.
        hk.expand(SEAL_LABEL, &mut key)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        hk.expand(KEY_ID_LABEL, &mut key_id)
            .expect("8 bytes is a valid HKDF-SHA256 length");
        Sealer {
            cipher: XChaCha20Poly1305::new(&key.into()),
            key_id,
        }
    }

    /// `plain` sealed for the etcd key `etcd_key`.
    pub fn seal(&self, etcd_key: &str, plain: &[u8]) -> Result<Vec<u8>, StoreError> {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let ct = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: etcd_key.as_bytes(),
                },
            )
            .map_err(|_| StoreError::Corrupt {
                what: "sealed value",
                why: "encryption failed".into(),
            })?;
        let mut raw = Vec::with_capacity(KEY_ID_BYTES + NONCE_BYTES + ct.len());
        raw.extend_from_slice(&self.key_id);
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&ct);
        let mut out = SEALED_PREFIX.to_vec();
        out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(raw)
                .as_bytes(),
        );
        Ok(out)
    }

    /// The plain bytes of a value read from `etcd_key`. `what` names the record in errors;
    /// errors never carry the value.
    pub fn open(
        &self,
        what: &'static str,
        etcd_key: &str,
        stored: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let corrupt = |why: &str| StoreError::Corrupt {
            what,
            why: why.into(),
        };
        let Some(b64) = stored.strip_prefix(SEALED_PREFIX) else {
            return Err(corrupt(
                "it is not sealed (written without the cluster key, or by an older version); \
                 write it again through a controller",
            ));
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| corrupt("its sealed form is not base64"))?;
        if raw.len() < KEY_ID_BYTES + NONCE_BYTES + 16 {
            return Err(corrupt("its sealed form is truncated"));
        }
        let (key_id, rest) = raw.split_at(KEY_ID_BYTES);
        if key_id != self.key_id {
            return Err(corrupt(
                "it was sealed with another cluster key (this controller's cluster.key is not \
                 the one that wrote it)",
            ));
        }
        let (nonce, ct) = rest.split_at(NONCE_BYTES);
        self.cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: etcd_key.as_bytes(),
                },
            )
            .map_err(|_| corrupt("its seal does not verify (altered, or moved from another key)"))
    }
}

/// Hex SHA-256 of the cluster key: what etcd keeps instead of the key, so that a controller
/// given another key can tell and refuse to start.
pub fn key_fingerprint(cluster_key: &str) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(cluster_key.as_bytes()))
}

/// Whether a stored value is sealed (for reading a value with no sealer).
pub fn is_sealed(stored: &[u8]) -> bool {
    stored.starts_with(SEALED_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_and_opens() {
        let s = Sealer::from_cluster_key("k1");
        let sealed = s
            .seal("/hearth/functions/f", b"{\"env\":{\"A\":\"SECRET\"}}")
            .unwrap();
        assert!(is_sealed(&sealed));
        assert!(!String::from_utf8_lossy(&sealed).contains("SECRET"));
        assert_eq!(
            s.open("function record", "/hearth/functions/f", &sealed)
                .unwrap(),
            b"{\"env\":{\"A\":\"SECRET\"}}"
        );
        // A fresh nonce each time.
        assert_ne!(
            sealed,
            s.seal("/hearth/functions/f", b"{\"env\":{\"A\":\"SECRET\"}}")
                .unwrap()
        );
    }

    #[test]
    fn another_key_is_named_as_the_cause() {
        let sealed = Sealer::from_cluster_key("k1").seal("/p/k", b"x").unwrap();
        let e = Sealer::from_cluster_key("k2")
            .open("function record", "/p/k", &sealed)
            .unwrap_err()
            .to_string();
        assert!(e.contains("another cluster key"), "{e}");
    }

    #[test]
    fn moved_altered_or_plain_values_do_not_open() {
        let s = Sealer::from_cluster_key("k1");
        let sealed = s.seal("/p/a", b"secret").unwrap();
        let e = s.open("r", "/p/b", &sealed).unwrap_err().to_string();
        assert!(e.contains("does not verify"), "{e}");
        let mut bad = sealed.clone();
        let last = bad.len() - 3;
        bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
        assert!(s.open("r", "/p/a", &bad).is_err());
        let e = s
            .open("r", "/p/a", b"{\"env\":{}}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not sealed"), "{e}");
        let e = s
            .open("r", "/p/a", b"hearth-sealed-v1:AAAA")
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        assert!(!e.contains("secret"));
    }
}
