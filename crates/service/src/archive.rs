//! Packs a code directory into the gzip-compressed tar archive that registration accepts
//! (`{"code": {"archive": base64}}`): the CLI sends local code this way, and the controller
//! forwards its stored code to workers.

use base64::Engine;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// A packed directory, and the symbolic links left out of it.
pub struct Packed {
    /// The tar.gz.
    pub tarball: Vec<u8>,
    /// Links (relative names) that lead outside the directory, or back into a directory being
    /// packed: they are not packed.
    pub skipped: Vec<String>,
}

/// A tar.gz of `dir`'s files (without `__pycache__` and `.git`). Symbolic links that stay
/// inside `dir` are packed as what they point to; links that lead outside it are left out (the
/// server takes only regular files and directories, and code should not carry the packer's
/// other files).
pub fn pack_dir(dir: &Path) -> std::io::Result<Vec<u8>> {
    Ok(pack_dir_reporting(dir)?.tarball)
}

/// [`pack_dir`], saying which links were left out.
pub fn pack_dir_reporting(dir: &Path) -> std::io::Result<Packed> {
    let root = std::fs::canonicalize(dir)?;
    let mut tarball = Vec::new();
    let mut packer = Packer {
        root: root.clone(),
        skipped: Vec::new(),
        open_dirs: HashSet::from([root.clone()]),
    };
    {
        let gz = flate2::write::GzEncoder::new(&mut tarball, flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        b.follow_symlinks(true);
        packer.add_dir(&mut b, &root, Path::new(""))?;
        b.into_inner()?.finish()?;
    }
    Ok(Packed {
        tarball,
        skipped: packer.skipped,
    })
}

/// [`pack_dir`], base64-encoded for JSON.
pub fn pack_dir_base64(dir: &Path) -> std::io::Result<String> {
    Ok(base64::engine::general_purpose::STANDARD.encode(pack_dir(dir)?))
}

struct Packer {
    /// The packed directory, canonical.
    root: PathBuf,
    skipped: Vec<String>,
    /// Directories being packed (canonical): a link back into one would loop forever.
    open_dirs: HashSet<PathBuf>,
}

impl Packer {
    fn add_dir<W: std::io::Write>(
        &mut self,
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
            let rel = rel.join(&name);
            let mut path = entry.path();
            if entry.file_type()?.is_symlink() {
                match std::fs::canonicalize(&path) {
                    Ok(target) if target.starts_with(&self.root) => path = target,
                    // Outside the directory, or dangling.
                    _ => {
                        self.skipped.push(rel.display().to_string());
                        continue;
                    }
                }
            }
            if path.is_dir() {
                let real = std::fs::canonicalize(&path)?;
                if !self.open_dirs.insert(real.clone()) {
                    self.skipped.push(rel.display().to_string());
                    continue;
                }
                self.add_dir(b, &path, &rel)?;
                self.open_dirs.remove(&real);
            } else if path.is_file() {
                b.append_path_with_name(&path, &rel)?;
            }
        }
        Ok(())
    }
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

    #[test]
    fn links_out_of_the_directory_are_left_out_and_links_inside_are_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "s3cret").unwrap();
        let src = tempfile::tempdir().unwrap();
        let src = src.path();
        std::fs::write(src.join("main.py"), "def main(a):\n    return a\n").unwrap();
        std::fs::create_dir(src.join("pkg")).unwrap();
        std::fs::write(src.join("pkg/util.py"), "X = 1\n").unwrap();
        let link = std::os::unix::fs::symlink;
        link(outside.path().join("secret.txt"), src.join("secret.txt")).unwrap();
        link(outside.path().to_path_buf(), src.join("elsewhere")).unwrap();
        link(src.join("pkg/util.py"), src.join("util.py")).unwrap();
        link(src.to_path_buf(), src.join("pkg/loop")).unwrap();
        link(src.join("missing"), src.join("dangling")).unwrap();
        let packed = pack_dir_reporting(src).unwrap();
        let mut skipped = packed.skipped.clone();
        skipped.sort();
        assert_eq!(skipped, ["dangling", "elsewhere", "pkg/loop", "secret.txt"]);
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(&packed.tarball[..]));
        let mut names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["main.py", "pkg/util.py", "util.py"]);
    }
}
