//! `requirements.txt`: checked (only plain requirement lines), normalized, and hashed into the
//! layer digest. Normalizing first makes two files that ask for the same set (other comments,
//! order or name spelling) share one layer.

use sha2::{Digest, Sha256};

/// Where a function's requirements are: at the top of its code.
pub const REQUIREMENTS_FILE: &str = "requirements.txt";
/// Most bytes a `requirements.txt` may hold.
pub const MAX_REQUIREMENTS_BYTES: usize = 64 * 1024;
/// Most lines a `requirements.txt` may hold (comments and blank lines included).
pub const MAX_REQUIREMENTS_LINES: usize = 200;

/// Why a `requirements.txt` was refused: a 400 at registration. Never quotes the line (it is
/// the client's own text) beyond its number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementsError {
    #[error("requirements.txt is larger than {MAX_REQUIREMENTS_BYTES} bytes")]
    TooLarge,
    #[error("requirements.txt has more than {MAX_REQUIREMENTS_LINES} lines")]
    TooManyLines,
    #[error("requirements.txt is not UTF-8 text")]
    NotText,
    #[error(
        "requirements.txt line {line}: {what}; only `name[extras] specifier ; marker` lines \
         and comments are allowed (the package index is the server's setting)"
    )]
    BadLine { line: usize, what: &'static str },
}

/// Checks `text` and returns its normalized form: one requirement per line, names lowercased
/// with runs of `-_.` made one `-` (PEP 503), whitespace outside markers removed, sorted and
/// deduplicated, comments and blank lines dropped. Empty when there is no requirement.
pub fn normalize(text: &[u8]) -> Result<String, RequirementsError> {
    if text.len() > MAX_REQUIREMENTS_BYTES {
        return Err(RequirementsError::TooLarge);
    }
    let text = std::str::from_utf8(text).map_err(|_| RequirementsError::NotText)?;
    if text.lines().count() > MAX_REQUIREMENTS_LINES {
        return Err(RequirementsError::TooManyLines);
    }
    let mut out: Vec<String> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let bad = |what| RequirementsError::BadLine { line, what };
        // pip's comment rule: `#` at the start or after whitespace.
        let content = strip_comment(raw).trim();
        if content.is_empty() {
            continue;
        }
        if content.ends_with('\\') {
            return Err(bad("line continuations are not allowed"));
        }
        if content.starts_with('-') {
            return Err(bad(
                "pip options (-e, -r, --index-url, -f, ...) are not allowed",
            ));
        }
        out.push(requirement(content).map_err(bad)?);
    }
    out.sort();
    out.dedup();
    let mut s = out.join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    Ok(s)
}

fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// One requirement line, normalized: `name[extras]specifier;marker`.
fn requirement(s: &str) -> Result<String, &'static str> {
    let (req, marker) = match s.split_once(';') {
        Some((r, m)) => (r.trim(), Some(m.trim())),
        None => (s, None),
    };
    if req.contains("://") || req.contains('@') {
        return Err("URLs and direct references are not allowed");
    }
    if req.starts_with('.') || req.starts_with('/') || req.starts_with('~') {
        return Err("paths are not allowed");
    }
    let name_end = req
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(req.len());
    let name = &req[..name_end];
    if name.is_empty()
        || !name.as_bytes()[0].is_ascii_alphanumeric()
        || !name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
    {
        return Err("a requirement must start with a package name");
    }
    let mut rest: String = req[name_end..]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let mut extras = String::new();
    if rest.starts_with('[') {
        let close = rest.find(']').ok_or("an extras list is not closed")?;
        let mut list: Vec<String> = rest[1..close]
            .split(',')
            .filter(|e| !e.is_empty())
            .map(pep503)
            .collect();
        if list
            .iter()
            .any(|e| e.is_empty() || !e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err("an extra's name is not valid");
        }
        list.sort();
        list.dedup();
        extras = format!("[{}]", list.join(","));
        rest = rest[close + 1..].to_string();
    }
    // What may follow: version specifiers only (`==1.0`, `>=1,<2`, `~=1.2`, `!=1.3.*`).
    if !rest.is_empty() {
        if !rest.starts_with(['=', '<', '>', '~', '!']) {
            return Err("only version specifiers may follow a package name");
        }
        if !rest.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'=' | b'<' | b'>' | b'~' | b'!' | b'.' | b'*' | b',' | b'+'
                )
        }) {
            return Err("a version specifier holds characters no version has");
        }
    }
    let mut out = format!("{}{extras}{rest}", pep503(name));
    if let Some(m) = marker {
        if m.is_empty() {
            return Err("an environment marker is empty");
        }
        if !valid_marker(m) {
            return Err("an environment marker is not one (PEP 508 variables, quoted strings, comparisons, and/or)");
        }
        out.push_str(" ; ");
        out.push_str(&m.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    Ok(out)
}

/// PEP 508 marker variables.
const MARKER_VARS: [&str; 12] = [
    "python_version",
    "python_full_version",
    "os_name",
    "sys_platform",
    "platform_release",
    "platform_system",
    "platform_version",
    "platform_machine",
    "platform_python_implementation",
    "implementation_name",
    "implementation_version",
    "extra",
];

/// Whether `m` is made only of PEP 508 marker tokens (variables, quoted strings, comparison
/// operators, `and`/`or`/`in`/`not`, parentheses): pip parses it properly; this only keeps
/// anything else out of the build.
fn valid_marker(m: &str) -> bool {
    let b = m.as_bytes();
    let mut i = 0;
    let mut tokens = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() || c == b'(' || c == b')' {
            i += 1;
            continue;
        }
        tokens += 1;
        if c == b'\'' || c == b'"' {
            let Some(end) = b[i + 1..].iter().position(|&x| x == c) else {
                return false;
            };
            let lit = &b[i + 1..i + 1 + end];
            if !lit
                .iter()
                .all(|x| x.is_ascii_alphanumeric() || b" ._-*+!=<>~".contains(x))
            {
                return false;
            }
            i += end + 2;
        } else if b"=<>!~".contains(&c) {
            while i < b.len() && b"=<>!~".contains(&b[i]) {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &m[start..i];
            if !(MARKER_VARS.contains(&word) || matches!(word, "and" | "or" | "in" | "not")) {
                return false;
            }
        } else {
            return false;
        }
    }
    tokens > 0
}

/// PEP 503 name normalization: lowercase, each run of `-`, `_`, `.` becomes one `-`.
pub fn pep503(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The layer digest: `sha256:` of the runtime digest, a newline and the normalized
/// requirements. Packages built for one runtime (its Python ABI) are never used by another.
pub fn layer_digest(runtime_digest: &str, normalized: &str) -> String {
    let mut h = Sha256::new();
    h.update(runtime_digest.as_bytes());
    h.update(b"\n");
    h.update(normalized.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizing_sorts_names_and_drops_comments() {
        let a = normalize(
            b"# deps\nNumPy==2.0.0  # pinned\n\nzope.Interface >= 5 , <7\nPillow[TIFF,jpeg]~=10.1 ; python_version >= '3.8'\nnumpy==2.0.0\n",
        )
        .unwrap();
        assert_eq!(
            a,
            "numpy==2.0.0\npillow[jpeg,tiff]~=10.1 ; python_version >= '3.8'\nzope-interface>=5,<7\n"
        );
        let b = normalize(
            b"zope_interface>=5,<7\npillow[jpeg,tiff]~=10.1;python_version >= '3.8'\nnumpy==2.0.0",
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(normalize(b"# nothing\n\n").unwrap(), "");
        let rt = format!("sha256:{}", "ab".repeat(32));
        let other = format!("sha256:{}", "cd".repeat(32));
        assert_eq!(layer_digest(&rt, &a), layer_digest(&rt, &b));
        assert_ne!(layer_digest(&rt, &a), layer_digest(&other, &a));
        assert!(crate::runtimes::digest_hex(&layer_digest(&rt, &a)).is_some());
    }

    #[test]
    fn options_urls_and_paths_are_refused_with_their_line() {
        for (text, line) in [
            (&b"numpy\n-e .\n"[..], 2),
            (b"--index-url https://evil.example/simple\n", 1),
            (b"ok\n\n-f /tmp/wheels\n", 3),
            (b"-r other.txt\n", 1),
            (b"--extra-index-url=http://x\n", 1),
            (b"pkg @ https://example.com/pkg.whl\n", 1),
            (b"https://example.com/pkg.whl\n", 1),
            (b"./local_pkg\n", 1),
            (b"/abs/path\n", 1),
            (b"numpy; import os\n", 1),
            (b"numpy $(reboot)\n", 1),
            (b"numpy \\\n", 1),
            (b"a\nb\nnumpy[x\n", 3),
        ] {
            match normalize(text) {
                Err(RequirementsError::BadLine { line: l, .. }) => {
                    assert_eq!(l, line, "{}", String::from_utf8_lossy(text))
                }
                other => panic!("{}: {other:?}", String::from_utf8_lossy(text)),
            }
        }
        let e = normalize(b"--index-url https://secret@host/simple\n").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn size_and_line_bounds_hold() {
        let big = vec![b'a'; MAX_REQUIREMENTS_BYTES + 1];
        assert_eq!(normalize(&big), Err(RequirementsError::TooLarge));
        let many = "a\n".repeat(MAX_REQUIREMENTS_LINES + 1);
        assert_eq!(
            normalize(many.as_bytes()),
            Err(RequirementsError::TooManyLines)
        );
        assert_eq!(normalize(b"\xff\xfe"), Err(RequirementsError::NotText));
        let ok = "a\n".repeat(MAX_REQUIREMENTS_LINES);
        assert_eq!(normalize(ok.as_bytes()).unwrap(), "a\n");
    }
}
