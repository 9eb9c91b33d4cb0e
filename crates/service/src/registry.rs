//! The function registry: specs in an embedded SQLite database, code in the data directory.
//!
//! Reads on the invocation path hit an in-memory map; the database is written on registration
//! and read once at start-up, so registered functions survive restarts.

use base64::Engine;
use dashmap::DashMap;
use hearth_api::FunctionSpec;
use parking_lot::Mutex;
use rusqlite::{params, Connection};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a function's code comes from, in a registration request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CodeSource {
    /// A directory or `.py` file on the worker's host (copied at registration).
    Path(PathBuf),
    /// Base64 of a gzip-compressed tar archive of the code directory.
    Archive(String),
    /// Files by relative path, e.g. `{"main.py": "def main(args): ..."}`.
    Files(BTreeMap<String, String>),
}

/// A registered function with its code location.
#[derive(Debug, Clone)]
pub struct Registered {
    pub spec: Arc<FunctionSpec>,
    /// Host directory mounted read-only at /code in the sandbox; None for code-less sim functions.
    pub code_dir: Option<PathBuf>,
}

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid code: {0}")]
    BadCode(String),
    #[error("storage: {0}")]
    Storage(String),
}

impl From<rusqlite::Error> for RegistryError {
    fn from(e: rusqlite::Error) -> Self {
        RegistryError::Storage(e.to_string())
    }
}

impl From<std::io::Error> for RegistryError {
    fn from(e: std::io::Error) -> Self {
        RegistryError::Storage(e.to_string())
    }
}

/// The registry.
pub struct Registry {
    db: Mutex<Connection>,
    code_root: PathBuf,
    functions: DashMap<String, Registered>,
}

impl Registry {
    /// Opens (or creates) the registry under `data_dir` and loads every function.
    pub fn open(data_dir: &Path) -> Result<Self, RegistryError> {
        let code_root = data_dir.join("functions");
        std::fs::create_dir_all(&code_root)?;
        set_mode(&code_root, 0o755)?;
        let db = Connection::open(data_dir.join("hearth.db"))?;
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE IF NOT EXISTS functions (
                 name TEXT PRIMARY KEY,
                 spec TEXT NOT NULL,
                 code_dir TEXT,
                 updated_at INTEGER NOT NULL
             );",
        )?;
        let functions = DashMap::new();
        {
            let mut stmt = db.prepare("SELECT name, spec, code_dir FROM functions")?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            })?;
            for row in rows {
                let (name, spec, code_dir) = row?;
                match serde_json::from_str::<FunctionSpec>(&spec) {
                    Ok(spec) => {
                        functions.insert(
                            name,
                            Registered {
                                spec: Arc::new(spec),
                                code_dir: code_dir.map(PathBuf::from),
                            },
                        );
                    }
                    Err(e) => {
                        tracing::warn!(function = %name, error = %e, "skipping unreadable function record")
                    }
                }
            }
        }
        let reg = Registry {
            db: Mutex::new(db),
            code_root,
            functions,
        };
        reg.remove_unreferenced_code();
        Ok(reg)
    }

    /// The function, if registered (the invocation path's lookup).
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.functions.get(name).map(|r| r.clone())
    }

    /// All functions, by name.
    pub fn list(&self) -> Vec<Registered> {
        let mut all: Vec<Registered> = self.functions.iter().map(|r| r.clone()).collect();
        all.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        all
    }

    /// Registers or updates a function. `code` may be omitted on update (the previous code is
    /// kept) or when `require_code` is false (sim backend). Returns the stored function and the
    /// previous version, if any.
    pub fn put(
        &self,
        mut spec: FunctionSpec,
        code: Option<CodeSource>,
        require_code: bool,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        let previous = self.get(&spec.name);
        spec.version = previous.as_ref().map_or(1, |p| p.spec.version + 1);
        let code_dir = match code {
            Some(src) => {
                let dir = self
                    .code_root
                    .join(&spec.name)
                    .join(format!("v{}", spec.version));
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)?;
                }
                std::fs::create_dir_all(&dir)?;
                let unpacked = unpack(&src, &dir).and_then(|()| check_module(&spec, &dir));
                if let Err(e) = unpacked {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
                Some(dir)
            }
            None => previous.as_ref().and_then(|p| p.code_dir.clone()),
        };
        if require_code && code_dir.is_none() {
            return Err(RegistryError::BadCode(
                "`code` is required (a path, an archive or files)".into(),
            ));
        }
        if let (Some(dir), None) = (&code_dir, &previous) {
            check_module(&spec, dir)?;
        }
        let json =
            serde_json::to_string(&spec).map_err(|e| RegistryError::Storage(e.to_string()))?;
        let code_str = code_dir.as_ref().map(|d| d.to_string_lossy().into_owned());
        self.db.lock().execute(
            "INSERT INTO functions (name, spec, code_dir, updated_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(name) DO UPDATE SET spec = ?2, code_dir = ?3, updated_at = ?4",
            params![spec.name, json, code_str, unix_now()],
        )?;
        let reg = Registered {
            spec: Arc::new(spec),
            code_dir,
        };
        self.functions.insert(reg.spec.name.clone(), reg.clone());
        Ok((reg, previous))
    }

    /// Removes a function; returns it if it existed. Its code is removed by
    /// [`Self::remove_code_dir`] once no sandbox uses it.
    pub fn remove(&self, name: &str) -> Result<Option<Registered>, RegistryError> {
        self.db
            .lock()
            .execute("DELETE FROM functions WHERE name = ?1", params![name])?;
        Ok(self.functions.remove(name).map(|(_, r)| r))
    }

    /// Deletes a code directory that no registered function refers to.
    pub fn remove_code_dir(&self, dir: &Path) {
        let in_use = self
            .functions
            .iter()
            .any(|r| r.code_dir.as_deref() == Some(dir));
        if !in_use && dir.starts_with(&self.code_root) {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove old code");
                }
            }
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir(parent); // only succeeds when empty
            }
        }
    }

    /// Start-up: code directories of deleted or replaced versions are garbage.
    fn remove_unreferenced_code(&self) {
        let Ok(entries) = std::fs::read_dir(&self.code_root) else {
            return;
        };
        for fn_dir in entries.flatten() {
            let Ok(versions) = std::fs::read_dir(fn_dir.path()) else {
                continue;
            };
            for v in versions.flatten() {
                self.remove_code_dir(&v.path());
            }
            let _ = std::fs::remove_dir(fn_dir.path());
        }
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Puts the code into `dir`, readable by the sandbox's unprivileged user.
fn unpack(src: &CodeSource, dir: &Path) -> Result<(), RegistryError> {
    let bad = |m: String| RegistryError::BadCode(m);
    match src {
        CodeSource::Path(path) => {
            let meta =
                std::fs::metadata(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
            if meta.is_dir() {
                copy_dir(path, dir).map_err(|e| bad(format!("copying {}: {e}", path.display())))?;
            } else {
                let name = path
                    .file_name()
                    .ok_or_else(|| bad(format!("{} has no file name", path.display())))?;
                std::fs::copy(path, dir.join(name))
                    .map_err(|e| bad(format!("copying {}: {e}", path.display())))?;
            }
        }
        CodeSource::Archive(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| bad(format!("archive is not valid base64: {e}")))?;
            let gz = flate2::read::GzDecoder::new(&bytes[..]);
            let mut ar = tar::Archive::new(gz);
            ar.set_preserve_permissions(false);
            ar.set_unpack_xattrs(false);
            let entries = ar
                .entries()
                .map_err(|e| bad(format!("archive is not a tar.gz: {e}")))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| bad(format!("archive is not a tar.gz: {e}")))?;
                let kind = entry.header().entry_type();
                if !(kind.is_file() || kind.is_dir()) {
                    continue; // links and devices have no place in function code
                }
                // unpack_in refuses paths that escape `dir`.
                let ok = entry
                    .unpack_in(dir)
                    .map_err(|e| bad(format!("unpacking archive: {e}")))?;
                if !ok {
                    return Err(bad("archive entry escapes the code directory".into()));
                }
            }
        }
        CodeSource::Files(files) => {
            for (rel, content) in files {
                let rel_path = Path::new(rel);
                if rel.is_empty()
                    || rel_path.is_absolute()
                    || rel_path
                        .components()
                        .any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    return Err(bad(format!(
                        "file path {rel:?} must be relative, without .."
                    )));
                }
                let target = dir.join(rel_path);
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&target, content)?;
            }
        }
    }
    make_readable(dir)?;
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let name = entry.file_name();
        if name == "__pycache__" || name == ".git" {
            continue;
        }
        if ty.is_dir() {
            std::fs::create_dir_all(to.join(&name))?;
            copy_dir(&entry.path(), &to.join(&name))?;
        } else if ty.is_file() {
            std::fs::copy(entry.path(), to.join(&name))?;
        }
    }
    Ok(())
}

/// Directories 0755 and files 0644, so uid `nobody` in the sandbox can read but not write.
fn make_readable(dir: &Path) -> std::io::Result<()> {
    set_mode(dir, 0o755)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            make_readable(&entry.path())?;
        } else {
            set_mode(&entry.path(), 0o644)?;
        }
    }
    Ok(())
}

/// The handler's module must exist in the code, or every invocation would fail at import.
fn check_module(spec: &FunctionSpec, dir: &Path) -> Result<(), RegistryError> {
    let rel: PathBuf = spec.handler_module().split('.').collect();
    let file = dir.join(&rel).with_extension("py");
    let package = dir.join(&rel).join("__init__.py");
    if file.is_file() || package.is_file() {
        return Ok(());
    }
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    Err(RegistryError::BadCode(format!(
        "handler module {:?} not found: expected {} in the code (it has: {})",
        spec.handler_module(),
        rel.with_extension("py").display(),
        if found.is_empty() {
            "nothing".into()
        } else {
            found.join(", ")
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(src: &str) -> CodeSource {
        CodeSource::Files(BTreeMap::from([("main.py".to_string(), src.to_string())]))
    }

    #[test]
    fn functions_survive_reopening_and_versions_increase() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        let (a, prev) = reg
            .put(
                FunctionSpec::new("f"),
                Some(files("def main(a): return a")),
                true,
            )
            .unwrap();
        assert!(prev.is_none());
        assert_eq!(a.spec.version, 1);
        let mut s2 = FunctionSpec::new("f");
        s2.memory_mb = 256;
        let (b, prev) = reg.put(s2, None, true).unwrap();
        assert_eq!(b.spec.version, 2);
        assert_eq!(prev.unwrap().spec.version, 1);
        assert_eq!(
            b.code_dir, a.code_dir,
            "code is kept when an update omits it"
        );
        drop(reg);
        let reg = Registry::open(dir.path()).unwrap();
        let got = reg.get("f").unwrap();
        assert_eq!(got.spec.memory_mb, 256);
        assert!(got.code_dir.unwrap().join("main.py").is_file());
        assert!(reg.remove("f").unwrap().is_some());
        drop(reg);
        assert!(Registry::open(dir.path()).unwrap().get("f").is_none());
    }

    #[test]
    fn code_problems_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        let err = reg.put(FunctionSpec::new("f"), None, true).unwrap_err();
        assert!(err.to_string().contains("`code` is required"), "{err}");
        let other = CodeSource::Files(BTreeMap::from([("x.py".into(), String::new())]));
        let err = reg
            .put(FunctionSpec::new("f"), Some(other), true)
            .unwrap_err();
        assert!(err.to_string().contains("main.py"), "{err}");
        assert!(err.to_string().contains("x.py"), "{err}");
        let escape = CodeSource::Files(BTreeMap::from([("../x.py".into(), String::new())]));
        assert!(reg.put(FunctionSpec::new("f"), Some(escape), true).is_err());
        let err = reg
            .put(
                FunctionSpec::new("f"),
                Some(CodeSource::Archive("!!".into())),
                true,
            )
            .unwrap_err();
        assert!(err.to_string().contains("base64"), "{err}");
        assert!(
            reg.get("f").is_none(),
            "failed registrations leave nothing behind"
        );
    }

    #[test]
    fn archives_unpack_with_readable_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        let mut tarball = Vec::new();
        {
            let gz = flate2::write::GzEncoder::new(&mut tarball, flate2::Compression::fast());
            let mut b = tar::Builder::new(gz);
            let data = b"def main(args):\n    return args\n";
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(&mut h, "pkg/mod.py", &data[..]).unwrap();
            b.into_inner().unwrap().finish().unwrap();
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(&tarball);
        let mut spec = FunctionSpec::new("g");
        spec.handler = "pkg.mod.main".into();
        let (r, _) = reg.put(spec, Some(CodeSource::Archive(b64)), true).unwrap();
        let file = r.code_dir.unwrap().join("pkg/mod.py");
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }
}
