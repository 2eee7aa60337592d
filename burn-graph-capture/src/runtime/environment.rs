//! Finding the pieces of a CUDA installation before the first driver call.
//!
//! cudarc loads libcuda and libnvrtc lazily and panics if they are missing, and NVRTC
//! fails late (at the first kernel) when the toolkit headers are missing. Checking all
//! three up front turns those into one [`InitError`] naming the missing piece.

use super::error::InitError;
use std::path::{Path, PathBuf};

/// Header that every kernel emitted by the CUDA dialect may include; its presence marks a
/// usable toolkit include directory.
const MARKER_HEADER: &str = "cuda_fp16.h";

/// Toolkit roots tried, in order, when `CUDA_PATH` is not set.
const DEFAULT_ROOTS: &[&str] = &["/usr/local/cuda", "/opt/cuda", "/usr"];

/// Where NVRTC should look for headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolkitPaths {
    /// `<root>/include`.
    pub include: PathBuf,
    /// `<root>/include/cccl`, when it exists (CUDA 13 moved libcu++ there).
    pub cccl_include: Option<PathBuf>,
}

/// Resolves the toolkit from an optional `CUDA_PATH` value, with `exists` standing in for
/// the file system (so this is testable without a toolkit).
pub fn resolve_toolkit(
    cuda_path: Option<&str>,
    exists: impl Fn(&Path) -> bool,
) -> Result<ToolkitPaths, InitError> {
    let candidates: Vec<PathBuf> = match cuda_path {
        Some(path) if !path.is_empty() => vec![PathBuf::from(path)],
        _ => DEFAULT_ROOTS.iter().map(PathBuf::from).collect(),
    };

    for root in &candidates {
        let include = root.join("include");
        if exists(&include.join(MARKER_HEADER)) {
            let cccl = include.join("cccl");
            let cccl_include = exists(&cccl).then_some(cccl);
            return Ok(ToolkitPaths {
                include,
                cccl_include,
            });
        }
    }

    let reason = match cuda_path {
        Some(path) if !path.is_empty() => {
            format!("CUDA_PATH={path} has no include/{MARKER_HEADER}")
        }
        _ => format!(
            "CUDA_PATH is not set and none of {DEFAULT_ROOTS:?} holds include/{MARKER_HEADER}"
        ),
    };
    Err(InitError::HeadersMissing(reason))
}

/// Checks libcuda, libnvrtc and the toolkit headers, in that order, and returns the header
/// paths for NVRTC.
pub fn check_environment() -> Result<ToolkitPaths, InitError> {
    // SAFETY: these only try `dlopen` on the candidate names; nothing is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(InitError::DriverLibraryMissing);
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(InitError::NvrtcLibraryMissing);
    }
    let cuda_path = std::env::var("CUDA_PATH").ok();
    resolve_toolkit(cuda_path.as_deref(), |p| p.exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_path_wins_and_finds_cccl() {
        let paths = resolve_toolkit(Some("/tk"), |p| {
            p == Path::new("/tk/include/cuda_fp16.h") || p == Path::new("/tk/include/cccl")
        })
        .unwrap();
        assert_eq!(paths.include, PathBuf::from("/tk/include"));
        assert_eq!(paths.cccl_include, Some(PathBuf::from("/tk/include/cccl")));
    }

    #[test]
    fn defaults_are_searched_in_order_without_cuda_path() {
        let paths =
            resolve_toolkit(None, |p| p == Path::new("/opt/cuda/include/cuda_fp16.h")).unwrap();
        assert_eq!(paths.include, PathBuf::from("/opt/cuda/include"));
        assert_eq!(paths.cccl_include, None);
    }

    #[test]
    fn missing_headers_name_cuda_path() {
        let err = resolve_toolkit(Some("/nowhere"), |_| false).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("CUDA_PATH=/nowhere"), "{text}");
        assert!(text.contains("cuda_fp16.h"), "{text}");
    }

    #[test]
    fn missing_headers_without_cuda_path_lists_defaults() {
        let err = resolve_toolkit(None, |_| false).unwrap_err();
        assert!(err.to_string().contains("/usr/local/cuda"));
    }
}
