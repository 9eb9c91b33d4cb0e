//! Packs function code for registration: always uploaded (an archive or files), never a
//! `code.path` on the server's host, which servers refuse unless their operator allows it.

use serde_json::{json, Value};
use std::path::Path;

/// The `code` field for a directory or a single `.py` file, and the handler module a single file
/// implies (its stem). Symbolic links in a directory that lead outside it are left out, with a
/// warning on stderr.
pub fn pack(path: &Path) -> Result<(Value, Option<String>), String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("--code {shown}: {e}"))?;
    if meta.is_file() {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("--code {shown}: not a file name"))?;
        let stem = name
            .strip_suffix(".py")
            .ok_or_else(|| format!("--code {shown}: a single file must be a .py file"))?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--code {shown}: cannot read it as UTF-8 text: {e}"))?;
        return Ok((json!({"files": {name: text}}), Some(stem.to_string())));
    }
    if !meta.is_dir() {
        return Err(format!("--code {shown}: must be a directory or a .py file"));
    }
    let packed = hearth_service::archive::pack_dir_reporting(path)
        .map_err(|e| format!("--code {shown}: packing the directory: {e}"))?;
    for link in &packed.skipped {
        eprintln!(
            "warning: --code {shown}: left out {link}: a symbolic link that leads outside the \
             directory (or back into it)"
        );
    }
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &packed.tarball);
    Ok((json!({ "archive": b64 }), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_always_uploaded_never_sent_as_a_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.py"), "def main(a):\n    return a\n").unwrap();
        let (code, module) = pack(dir.path()).unwrap();
        assert!(
            code.get("archive").is_some() && code.get("path").is_none(),
            "{code}"
        );
        assert_eq!(module, None);
        let (code, module) = pack(&dir.path().join("main.py")).unwrap();
        assert!(
            code.get("files").is_some() && code.get("path").is_none(),
            "{code}"
        );
        assert_eq!(module.as_deref(), Some("main"));
        let err = pack(&dir.path().join("nope")).unwrap_err();
        assert!(err.starts_with("--code "), "{err}");
    }
}
