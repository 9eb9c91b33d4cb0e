//! Packs a code directory into the gzip-compressed tar archive that registration accepts
//! (`{"code": {"archive": base64}}`): the CLI sends local code this way, and the controller
//! forwards its stored code to workers.

use base64::Engine;
use std::path::Path;

/// A tar.gz of `dir`'s files (without `__pycache__` and `.git`), following symlinks.
pub fn pack_dir(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut tarball = Vec::new();
    {
        let gz = flate2::write::GzEncoder::new(&mut tarball, flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        b.follow_symlinks(true);
        add_dir(&mut b, dir, Path::new(""))?;
        b.into_inner()?.finish()?;
    }
    Ok(tarball)
}

/// [`pack_dir`], base64-encoded for JSON.
pub fn pack_dir_base64(dir: &Path) -> std::io::Result<String> {
    Ok(base64::engine::general_purpose::STANDARD.encode(pack_dir(dir)?))
}

fn add_dir<W: std::io::Write>(
    b: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{CodeSource, Registry};
    use hearth_api::FunctionSpec;

    #[test]
    fn a_packed_directory_registers_with_the_same_files() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("pkg/__pycache__")).unwrap();
        std::fs::write(src.path().join("main.py"), "def main(a):\n    return a\n").unwrap();
        std::fs::write(src.path().join("pkg/util.py"), "X = 1\n").unwrap();
        std::fs::write(src.path().join("pkg/__pycache__/junk.pyc"), "x").unwrap();
        let b64 = pack_dir_base64(src.path()).unwrap();
        let data = tempfile::tempdir().unwrap();
        let reg = Registry::open(data.path()).unwrap();
        let (r, _) = reg
            .put(FunctionSpec::new("f"), Some(CodeSource::Archive(b64)), true)
            .unwrap();
        let dir = r.code_dir.unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("pkg/util.py")).unwrap(),
            "X = 1\n"
        );
        assert!(dir.join("main.py").is_file());
        assert!(!dir.join("pkg/__pycache__").exists());
    }
}
