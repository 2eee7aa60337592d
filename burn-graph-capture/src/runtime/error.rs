//! Typed errors of the runtime, and their mapping onto CubeCL's error types.
//!
//! CubeCL's traits return `ServerError`/`IoError`/`LaunchError`; every driver failure is
//! turned into one of those with the failing call named, so nothing on the launch path
//! needs to panic. Init failures have their own type because they name the missing piece
//! of the CUDA installation rather than a failing call.

use cubecl_common::backtrace::BackTrace;
use cubecl_core::server::{IoError, LaunchError, ServerError};
use cudarc::driver::DriverError;

/// Why the runtime could not start on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitError {
    /// `libcuda.so` (the driver) could not be loaded.
    #[error(
        "CudaGraphRuntime: the CUDA driver library (libcuda) could not be loaded; \
         install the NVIDIA driver or put its directory on LD_LIBRARY_PATH"
    )]
    DriverLibraryMissing,
    /// `libnvrtc.so` could not be loaded.
    #[error(
        "CudaGraphRuntime: the NVRTC library (libnvrtc) could not be loaded; install the CUDA \
         toolkit and put its lib64 directory (e.g. /usr/local/cuda/lib64) on LD_LIBRARY_PATH"
    )]
    NvrtcLibraryMissing,
    /// No CUDA toolkit directory was found, or it has no headers.
    #[error(
        "CudaGraphRuntime: NVRTC needs the CUDA toolkit headers, but {0}; set CUDA_PATH to the \
         toolkit root (the folder holding include/cuda_fp16.h), e.g. CUDA_PATH=/usr/local/cuda"
    )]
    HeadersMissing(String),
    /// The driver loaded but reported an error (no device, bad driver version, ...).
    #[error("CudaGraphRuntime: CUDA driver call `{call}` failed: {error}")]
    Driver { call: &'static str, error: String },
    /// The requested device index does not exist.
    #[error(
        "CudaGraphRuntime: device index {index} requested but only {count} CUDA device(s) found"
    )]
    NoSuchDevice { index: usize, count: usize },
}

impl InitError {
    pub(crate) fn driver(call: &'static str, error: DriverError) -> Self {
        Self::Driver {
            call,
            error: format!("{error:?}"),
        }
    }
}

/// Human-readable form of a failed driver call.
pub(crate) fn describe(call: &str, error: &DriverError) -> String {
    format!("CUDA driver call `{call}` failed: {error:?}")
}

/// A failed driver call as a [`ServerError`].
pub(crate) fn server_err(call: &str, error: DriverError) -> ServerError {
    ServerError::Generic {
        reason: describe(call, &error),
        backtrace: BackTrace::capture(),
    }
}

/// A failed driver call as an [`IoError`].
pub(crate) fn io_err(call: &str, error: DriverError) -> IoError {
    IoError::Unknown {
        description: describe(call, &error),
        backtrace: BackTrace::capture(),
    }
}

/// A failed driver call as a [`LaunchError`].
pub(crate) fn launch_err(call: &str, error: DriverError) -> LaunchError {
    LaunchError::Unknown {
        reason: describe(call, &error),
        backtrace: BackTrace::capture(),
    }
}
