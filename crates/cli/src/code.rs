//! Packs function code for registration.

use base64::Engine;
use serde_json::{json, Value};
use std::path::Path;

/// The `code` field for a directory or a single `.py` file, and the handler module a single file
/// implies (its stem).
pub fn pack(path: &Path) -> Result<(Value, Option<String>), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("--code {}: {e}", path.display()))?;
    if meta.is_file() {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("--code {}: not a file name", path.display()))?;
        let stem = name.strip_suffix(".py").ok_or_else(|| {
            format!(
                "--code {}: a single file must be a .py file",
                path.display()
            )
        })?;
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("--code {}: {e}", path.display()))?;
        return Ok((json!({"files": {name: text}}), Some(stem.to_string())));
    }
    let mut tarball = Vec::new();
    {
        let gz = flate2::write::GzEncoder::new(&mut tarball, flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        b.follow_symlinks(true);
        add_dir(&mut b, path, Path::new(""))
            .map_err(|e| format!("--code {}: {e}", path.display()))?;
        b.into_inner()
            .and_then(|gz| gz.finish())
            .map_err(|e| format!("--code {}: {e}", path.display()))?;
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(&tarball);
    Ok((json!({ "archive": b64 }), None))
}

fn add_dir<W: std::io::Write>(
    b: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "__pycache__" || name == ".git" {
            continue;
        }
        let path = entry.path();
        let rel = rel.join(&name);
        if path.is_dir() {
            add_dir(b, &path, &rel)?;
        } else if path.is_file() {
            b.append_path_with_name(&path, &rel)?;
        }
    }
    Ok(())
}
