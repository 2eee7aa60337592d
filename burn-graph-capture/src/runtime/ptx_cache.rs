//! A disk cache of NVRTC's output, so that a process compiling a kernel this machine
//! compiled before loads its PTX instead. NVRTC compiles are most of a cold start (the
//! example's 30 steps took 29 s on the H200, nearly all of it compiling and tuning).
//!
//! An entry is keyed by everything NVRTC's output depends on: the kernel's CUDA source,
//! the NVRTC options (the target architecture among them) and NVRTC's version. The key
//! text is stored beside the PTX and compared in full on every hit, so a hash collision
//! or a changed hash function can only cause a miss. Entries are written to a temporary
//! file and renamed, so a reader never sees half an entry; any I/O failure is a miss.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

/// Environment variable naming the cache directory; `off` disables the cache.
pub const CACHE_VAR: &str = "BURN_GRAPH_CAPTURE_KERNEL_CACHE";

/// Compiled PTX on disk, by compile input.
#[derive(Debug, Clone)]
pub struct PtxCache {
    dir: Option<PathBuf>,
}

impl PtxCache {
    /// A cache in `dir`, or none.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }

    /// The cache `CACHE_VAR` names; by default under the user's cache directory
    /// (`~/.cache/burn-graph-capture/ptx` on Linux); none when it is `off` or no
    /// cache directory is known.
    pub fn from_env() -> Self {
        let dir = match std::env::var_os(CACHE_VAR) {
            Some(value) if value == "off" => None,
            Some(value) => Some(PathBuf::from(value)),
            None => dirs::cache_dir().map(|d| d.join("burn-graph-capture").join("ptx")),
        };
        Self::new(dir)
    }

    /// The PTX compiled before from `input`, if any.
    pub fn get(&self, input: &str) -> Option<String> {
        let (key_path, ptx_path) = self.paths(input)?;
        let stored = std::fs::read_to_string(key_path).ok()?;
        if stored != input {
            return None;
        }
        std::fs::read_to_string(ptx_path).ok()
    }

    /// Stores `ptx`, compiled from `input`. Failures are logged and ignored.
    pub fn put(&self, input: &str, ptx: &str) {
        let Some((key_path, ptx_path)) = self.paths(input) else {
            return;
        };
        // The PTX first: an entry counts once its key file exists.
        let written =
            write_atomically(&ptx_path, ptx).and_then(|()| write_atomically(&key_path, input));
        if let Err(error) = written {
            tracing::debug!(%error, path = %ptx_path.display(), "kernel cache: entry not written");
        }
    }

    fn paths(&self, input: &str) -> Option<(PathBuf, PathBuf)> {
        let dir = self.dir.as_ref()?;
        let mut hasher = DefaultHasher::new();
        input.hash(&mut hasher);
        let name = format!("{:016x}", hasher.finish());
        Some((
            dir.join(format!("{name}.key")),
            dir.join(format!("{name}.ptx")),
        ))
    }
}

/// The cache key text of one compile: source, options and NVRTC's version.
pub fn compile_input(source: &str, options: &[String], nvrtc_version: (i32, i32)) -> String {
    format!(
        "nvrtc {}.{}\n{}\n{source}",
        nvrtc_version.0,
        nvrtc_version.1,
        options.join(" ")
    )
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    std::fs::write(&temp, text)?;
    std::fs::rename(&temp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_cache(name: &str) -> (PtxCache, PathBuf) {
        let dir = std::env::temp_dir().join(format!("ptx-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (PtxCache::new(Some(dir.clone())), dir)
    }

    #[test]
    fn a_stored_entry_is_found_by_its_whole_input() {
        let (cache, dir) = temp_cache("hit");
        let input = compile_input("kernel A", &["--gpu-architecture=sm_90a".into()], (13, 0));
        assert_eq!(cache.get(&input), None);
        cache.put(&input, ".version 8.8\nptx of A");
        assert_eq!(cache.get(&input).as_deref(), Some(".version 8.8\nptx of A"));
        let other_arch = compile_input("kernel A", &["--gpu-architecture=sm_80".into()], (13, 0));
        let other_nvrtc = compile_input("kernel A", &["--gpu-architecture=sm_90a".into()], (12, 8));
        assert_eq!(cache.get(&other_arch), None);
        assert_eq!(cache.get(&other_nvrtc), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_key_file_that_holds_another_input_is_a_miss() {
        let (cache, dir) = temp_cache("collision");
        let input = compile_input("kernel B", &[], (13, 0));
        cache.put(&input, "ptx of B");
        let (key_path, _) = cache.paths(&input).unwrap();
        std::fs::write(key_path, "a different input with the same hash").unwrap();
        assert_eq!(cache.get(&input), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn without_a_directory_nothing_is_stored() {
        let cache = PtxCache::new(None);
        cache.put("input", "ptx");
        assert_eq!(cache.get("input"), None);
    }
}
