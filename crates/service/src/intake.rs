//! Code intake: putting a registration's code into a directory, treating every upload as
//! hostile (docs/security.md). Archives and file maps hold only regular files and directories
//! inside the tree, bounded in size and count while they unpack; `code.path` copies only
//! world-readable files from inside the operator's `code_path_roots`, never from the data
//! directory. Error messages name paths inside the uploaded tree only, never a host path or a
//! file's content. The [`crate::registry`] stages, checks and commits what this produces.

use crate::registry::{CodeIntake, CodeLimit, RegistryError};
use base64::Engine;
use hearth_api::FunctionSpec;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// A directory the sandbox user can read (0755 whatever the umask).
pub(crate) fn create_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o755).create(path)?;
    set_mode(path, 0o755)
}

/// What is left of the limits while one upload unpacks.
pub(crate) struct Budget {
    files_left: u64,
    bytes_left: u64,
    /// Bytes the upload may use in all (its own limit or its namespace's room).
    bytes_allowed: u64,
    max_files: u64,
    max_bytes: u64,
    /// Set when the namespace's room, not the function's limit, bounds the bytes:
    /// (namespace, its limit, what it holds besides this function).
    namespace: Option<(String, u64, u64)>,
}

impl Budget {
    pub(crate) fn new(intake: &CodeIntake) -> Self {
        Budget {
            files_left: intake.max_files,
            bytes_left: intake.max_unpacked_bytes,
            bytes_allowed: intake.max_unpacked_bytes,
            max_files: intake.max_files,
            max_bytes: intake.max_unpacked_bytes,
            namespace: None,
        }
    }

    /// Bounds the bytes also by what is left of `namespace`'s limit of `max` bytes when it
    /// holds `held` bytes in its other functions.
    pub(crate) fn within_namespace(mut self, namespace: &str, max: u64, held: u64) -> Self {
        let room = max.saturating_sub(held);
        if room < self.bytes_left {
            self.bytes_left = room;
            self.bytes_allowed = room;
            self.namespace = Some((namespace.to_string(), max, held));
        }
        self
    }

    /// Bytes of content taken so far.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.bytes_allowed - self.bytes_left
    }

    /// One more file or directory.
    fn entry(&mut self) -> Result<(), RegistryError> {
        if self.files_left == 0 {
            return Err(RegistryError::TooLarge {
                limit: CodeLimit::Files,
                max: self.max_files,
            });
        }
        self.files_left -= 1;
        Ok(())
    }

    fn over_bytes(&self) -> RegistryError {
        match &self.namespace {
            Some((namespace, max, held)) => RegistryError::NamespaceCode {
                namespace: namespace.clone(),
                max: *max,
                held: *held,
            },
            None => RegistryError::TooLarge {
                limit: CodeLimit::UnpackedBytes,
                max: self.max_bytes,
            },
        }
    }

    /// `n` more bytes of content.
    fn bytes(&mut self, n: u64) -> Result<(), RegistryError> {
        if n > self.bytes_left {
            return Err(self.over_bytes());
        }
        self.bytes_left -= n;
        Ok(())
    }

    /// Copies `from` into `to`, stopping as soon as the content goes over the limit.
    fn copy(&mut self, from: &mut impl Read, to: &mut impl Write) -> Result<(), CopyError> {
        let copied = std::io::copy(&mut from.take(self.bytes_left + 1), to)?;
        self.bytes(copied).map_err(CopyError::Limit)
    }
}

/// A failed copy: over a limit, or an I/O error to classify.
pub(crate) enum CopyError {
    Limit(RegistryError),
    Io(std::io::Error),
}

impl From<std::io::Error> for CopyError {
    fn from(e: std::io::Error) -> Self {
        CopyError::Io(e)
    }
}

/// An I/O error while writing `rel` into the code directory: the upload's fault (400) when the
/// names clash or are unusable, else the server's (500). The message names only `rel`.
pub(crate) fn write_error(rel: &str, e: std::io::Error) -> RegistryError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::AlreadyExists
        | K::NotADirectory
        | K::IsADirectory
        | K::InvalidInput
        | K::InvalidFilename
        | K::NotFound => RegistryError::BadCode(format!(
            "{rel:?} cannot be created: it clashes with another file or directory of the code, \
             or its name is unusable"
        )),
        _ => RegistryError::Storage(format!("writing {rel:?}: {e}")),
    }
}

pub(crate) fn copy_error(rel: &str, e: CopyError) -> RegistryError {
    match e {
        CopyError::Limit(e) => e,
        CopyError::Io(e) => write_error(rel, e),
    }
}

/// A name inside the uploaded tree, as a relative path of normal components (`./` is allowed
/// in archives, where `tar -C dir .` puts it); None when it is empty, absolute or has `..`.
pub(crate) fn safe_relative(name: &str, allow_cur_dir: bool) -> Option<PathBuf> {
    if name.is_empty() || name.len() > 4096 || name.contains('\0') {
        return None;
    }
    let mut out = PathBuf::new();
    for c in Path::new(name).components() {
        match c {
            Component::Normal(n) if n.len() <= 255 => out.push(n),
            Component::CurDir if allow_cur_dir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Writes a file map (`{"files": {...}}`): names relative, without `..`, within the limits.
pub(crate) fn write_files(
    files: &BTreeMap<String, String>,
    dir: &Path,
    budget: &mut Budget,
) -> Result<(), RegistryError> {
    for (rel, content) in files {
        let path = safe_relative(rel, false)
            .filter(|p| !p.as_os_str().is_empty() && !rel.ends_with('/'))
            .ok_or_else(|| {
                RegistryError::BadCode(format!(
                    "file name {rel:?} must be a relative path of names, without `.`, `..` or \
                     a trailing `/`"
                ))
            })?;
        budget.entry()?;
        budget.bytes(content.len() as u64)?;
        let target = dir.join(&path);
        if let Some(parent) = target.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| write_error(rel, e))?;
        }
        new_file(&target)
            .and_then(|mut f| f.write_all(content.as_bytes()))
            .map_err(|e| write_error(rel, e))?;
    }
    Ok(())
}

/// A new file for code (never an existing one, never through a symlink).
pub(crate) fn new_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
}

/// Headers, long names and PAX records one archive entry may take before its content: generous
/// for real archives, and a bound on what the tar reader holds in memory for one entry.
const MAX_HEADER_BYTES: u64 = 1 << 20;

/// The decompressed archive stream, cut off at a moving limit so that nothing (content, headers,
/// or data the reader skips) is read past what the budget allows.
pub(crate) struct Capped<R> {
    inner: R,
    read: Arc<AtomicU64>,
    cap: Arc<AtomicU64>,
    hit: Arc<AtomicBool>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.read.load(Ordering::Relaxed);
        let left = self.cap.load(Ordering::Relaxed).saturating_sub(read);
        if left == 0 {
            self.hit.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other("archive limit reached"));
        }
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let got = self.inner.read(&mut buf[..n])?;
        self.read.fetch_add(got as u64, Ordering::Relaxed);
        Ok(got)
    }
}

/// Unpacks a base64 tar.gz: only regular files and directories with relative names, each
/// limit enforced before the bytes that would cross it are read.
pub(crate) fn unpack_archive(
    b64: &str,
    dir: &Path,
    budget: &mut Budget,
) -> Result<(), RegistryError> {
    let bad = |m: String| RegistryError::BadCode(m);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| bad(format!("archive is not valid base64: {e}")))?;
    let read = Arc::new(AtomicU64::new(0));
    let cap = Arc::new(AtomicU64::new(MAX_HEADER_BYTES));
    let hit = Arc::new(AtomicBool::new(false));
    let stream = Capped {
        inner: flate2::read::GzDecoder::new(&bytes[..]),
        read: Arc::clone(&read),
        cap: Arc::clone(&cap),
        hit: Arc::clone(&hit),
    };
    let mut ar = tar::Archive::new(stream);
    let unreadable = |e: std::io::Error, hit: &AtomicBool| {
        if hit.load(Ordering::Relaxed) {
            bad(format!(
                "archive has an entry with over {MAX_HEADER_BYTES} bytes of headers"
            ))
        } else {
            bad(format!("archive is not a tar.gz: {e}"))
        }
    };
    let entries = ar.entries().map_err(|e| unreadable(e, &hit))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| unreadable(e, &hit))?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let rel = safe_relative(&name, true).ok_or_else(|| {
            bad(format!(
                "archive entry {name:?} must be a relative path without `..`"
            ))
        })?;
        let kind = entry.header().entry_type();
        let size = entry.size();
        if !(kind.is_file() || kind.is_dir()) {
            return Err(bad(format!(
                "archive entry {name:?} is a {}: code may hold only regular files and \
                 directories (no links or devices)",
                kind_name(kind)
            )));
        }
        budget.entry()?;
        // Declared sizes count before a byte of content is read, so a bomb costs nothing.
        budget.bytes(size)?;
        if kind.is_dir() {
            if size != 0 {
                return Err(bad(format!("archive directory {name:?} has content")));
            }
            if !rel.as_os_str().is_empty() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(dir.join(&rel))
                    .map_err(|e| write_error(&name, e))?;
            }
        } else {
            if rel.as_os_str().is_empty() {
                return Err(bad(format!("archive entry {name:?} is not a file name")));
            }
            let target = dir.join(&rel);
            if let Some(parent) = target.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .map_err(|e| write_error(&name, e))?;
            }
            // A later entry with the same name replaces the earlier one, as tar does.
            match std::fs::symlink_metadata(&target) {
                Ok(m) if m.is_file() => {
                    std::fs::remove_file(&target).map_err(|e| write_error(&name, e))?
                }
                _ => {}
            }
            let mut out = new_file(&target).map_err(|e| write_error(&name, e))?;
            cap.store(
                read.load(Ordering::Relaxed)
                    .saturating_add(size.saturating_add(512)),
                Ordering::Relaxed,
            );
            let copied = std::io::copy(&mut entry, &mut out).map_err(|e| unreadable(e, &hit))?;
            if copied != size {
                return Err(bad(format!("archive entry {name:?} is truncated")));
            }
        }
        // The next entry's headers, and the padding before them.
        cap.store(
            read.load(Ordering::Relaxed)
                .saturating_add(MAX_HEADER_BYTES),
            Ordering::Relaxed,
        );
    }
    Ok(())
}

pub(crate) fn kind_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Symlink => "symbolic link",
        tar::EntryType::Link => "hard link",
        tar::EntryType::Char | tar::EntryType::Block => "device",
        tar::EntryType::Fifo => "named pipe",
        _ => "special entry",
    }
}

const PATH_TURNED_OFF: &str = "`code.path` is turned off on this server (it has no \
    code_path_roots): upload the code instead, as {\"archive\": base64 tar.gz} or \
    {\"files\": {...}}; `hearth fn register NAME --code DIR` sends an archive";

const PATH_OUTSIDE: &str = "`code.path` must be an existing directory or file inside one of \
    the server's code_path_roots";

/// Copies `code.path` from inside the operator's roots: only world-readable regular files and
/// directories, no symlinks below the path itself, never the data directory.
pub(crate) fn copy_from_roots(
    path: &Path,
    intake: &CodeIntake,
    data_dir: &Path,
    dest: &Path,
    budget: &mut Budget,
) -> Result<(), RegistryError> {
    let bad = |m: &str| RegistryError::BadCode(m.to_string());
    if intake.path_roots.is_empty() {
        return Err(bad(PATH_TURNED_OFF));
    }
    if !path.is_absolute() {
        return Err(bad("`code.path` must be an absolute path"));
    }
    // Not existing and outside the roots answer alike: nothing to learn about the host.
    let real = std::fs::canonicalize(path).map_err(|_| bad(PATH_OUTSIDE))?;
    let inside = intake
        .path_roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .any(|r| real.starts_with(&r));
    if !inside {
        return Err(bad(PATH_OUTSIDE));
    }
    if real.starts_with(data_dir) || data_dir.starts_with(&real) {
        return Err(bad(
            "`code.path` may not be, or hold, the server's own data directory",
        ));
    }
    // Readable by others only if every directory above lets others through.
    for above in real.ancestors().skip(1) {
        let m = std::fs::metadata(above).map_err(|_| bad(PATH_OUTSIDE))?;
        if m.mode() & 0o001 == 0 {
            return Err(bad(
                "`code.path` is inside a directory other users of the host cannot enter; only \
                 code every user may read is copied",
            ));
        }
    }
    let meta = std::fs::symlink_metadata(&real).map_err(|_| bad(PATH_OUTSIDE))?;
    let source = Source {
        root: &real,
        data_dir,
    };
    if meta.is_dir() {
        check_public(&meta, ".")?;
        source.copy_dir(&real, Path::new(""), dest, budget)
    } else {
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.is_empty() {
            return Err(bad(PATH_OUTSIDE));
        }
        budget.entry()?;
        source.copy_file(&real, &name, &dest.join(&name), budget)
    }
}

/// Refuses what other users of the host could not read (a 0600 secret must not become readable
/// by every sandbox); `rel` is the name inside the tree.
pub(crate) fn check_public(meta: &std::fs::Metadata, rel: &str) -> Result<(), RegistryError> {
    let need = if meta.is_dir() { 0o005 } else { 0o004 };
    if meta.mode() & need != need {
        return Err(RegistryError::BadCode(format!(
            "{rel:?} in `code.path` is not readable by other users of the host; only code every \
             user may read is copied (make it world-readable, or upload the code)"
        )));
    }
    Ok(())
}

/// The tree `code.path` names, resolved.
pub(crate) struct Source<'a> {
    root: &'a Path,
    data_dir: &'a Path,
}

impl Source<'_> {
    fn copy_dir(
        &self,
        from: &Path,
        rel: &Path,
        to: &Path,
        budget: &mut Budget,
    ) -> Result<(), RegistryError> {
        let unreadable = |rel: &Path| {
            RegistryError::BadCode(format!(
                "{:?} in `code.path` cannot be read",
                rel.display().to_string()
            ))
        };
        let mut entries: Vec<_> = std::fs::read_dir(from)
            .map_err(|_| unreadable(rel))?
            .collect::<Result<_, _>>()
            .map_err(|_| unreadable(rel))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name();
            if name == "__pycache__" || name == ".git" {
                continue;
            }
            let child_rel = rel.join(&name);
            let shown = child_rel.display().to_string();
            let meta =
                std::fs::symlink_metadata(entry.path()).map_err(|_| unreadable(&child_rel))?;
            let kind = meta.file_type();
            if kind.is_symlink() {
                return Err(RegistryError::BadCode(format!(
                    "{shown:?} in `code.path` is a symbolic link: links are not followed (copy \
                     what it points to into the directory, or upload the code)"
                )));
            }
            check_public(&meta, &shown)?;
            budget.entry()?;
            if kind.is_dir() {
                create_dir(&to.join(&name)).map_err(|e| write_error(&shown, e))?;
                self.copy_dir(&entry.path(), &child_rel, &to.join(&name), budget)?;
            } else if kind.is_file() {
                self.copy_file(&entry.path(), &shown, &to.join(&name), budget)?;
            } else {
                return Err(RegistryError::BadCode(format!(
                    "{shown:?} in `code.path` is not a regular file or directory"
                )));
            }
        }
        Ok(())
    }

    /// Copies one file, checked again on the open descriptor: a file swapped for a link or moved
    /// out of the tree after the directory was listed is refused.
    fn copy_file(
        &self,
        from: &Path,
        rel: &str,
        to: &Path,
        budget: &mut Budget,
    ) -> Result<(), RegistryError> {
        let unreadable =
            || RegistryError::BadCode(format!("{rel:?} in `code.path` cannot be read"));
        let mut src = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(from)
            .map_err(|_| unreadable())?;
        let meta = src.metadata().map_err(|_| unreadable())?;
        if !meta.is_file() {
            return Err(RegistryError::BadCode(format!(
                "{rel:?} in `code.path` is not a regular file"
            )));
        }
        check_public(&meta, rel)?;
        let real = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&src)
        ))
        .map_err(|_| unreadable())?;
        if !real.starts_with(self.root) || real.starts_with(self.data_dir) {
            return Err(RegistryError::BadCode(format!(
                "{rel:?} moved out of `code.path` while it was being copied"
            )));
        }
        let mut out = new_file(to).map_err(|e| write_error(rel, e))?;
        budget
            .copy(&mut src, &mut out)
            .map_err(|e| copy_error(rel, e))
    }
}

/// Directories 0755 and files 0644, so uid `nobody` in the sandbox can read but not write.
pub(crate) fn make_readable(dir: &Path) -> std::io::Result<()> {
    set_mode(dir, 0o755)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            make_readable(&entry.path())?;
        } else if kind.is_file() {
            set_mode(&entry.path(), 0o644)?;
        }
    }
    Ok(())
}

/// The handler's module must exist in the code, or every invocation would fail at import.
pub(crate) fn check_module(spec: &FunctionSpec, dir: &Path) -> Result<(), RegistryError> {
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
