//! Typed errors of the runtime, and their mapping onto CubeCL's error types.
//!
//! CubeCL's traits return `ServerError`/`IoError`/`LaunchError`; every driver failure is
//! turned into one of those with the failing call named, so nothing on the launch path
//! needs to panic. Init failures have their own type because they name the missing piece
//! of the CUDA installation rather than a failing call.

use cubecl_common::backtrace::BackTrace;
use cubecl_core::server::{IoError, LaunchError, ServerError};
use cudarc::cublas::result::CublasError;
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
    Driver {
        /// The driver function.
        call: &'static str,
        /// The driver's error.
        #[source]
        error: DriverError,
    },
    /// The requested device index does not exist.
    #[error(
        "CudaGraphRuntime: device index {index} requested but only {count} CUDA device(s) found"
    )]
    NoSuchDevice {
        /// The index asked for.
        index: usize,
        /// Devices present.
        count: usize,
    },
}

impl InitError {
    pub(crate) fn driver(call: &'static str, error: DriverError) -> Self {
        Self::Driver { call, error }
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

/// A capture error reported through a CubeCL entry point (a refused sync, a failed held
/// replay or copy).
pub(crate) fn capture_as_server_err(error: CaptureError) -> ServerError {
    ServerError::Generic {
        reason: error.to_string(),
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

/// Why a capture window, a replay or an arena call failed.
///
/// A window that fails is always closed: the stream has left capture mode, nothing the
/// window recorded has run, and the stream is usable for eager work (I5).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CaptureError {
    /// `capture_begin` while this thread's own window is open (nested capture).
    #[error("a capture window is already open on this device")]
    AlreadyCapturing,
    /// `capture_begin` while another thread's window is open: it closes when that thread's
    /// step ends, so the caller may wait and try again.
    #[error("another thread's capture window is open on this device")]
    WindowBusy,
    /// `capture_end` (or a replay that needs none) without an open window.
    #[error("no capture window is open on this device")]
    NotCapturing,
    /// The window asked for memory that the pages reserved before it could not serve.
    #[error(
        "the capture window needed a new device page ({bytes} bytes); run an eager warmup \
         step first so the pools hold the step's working set"
    )]
    NeedsAllocation {
        /// Size of the page the pool asked for.
        bytes: u64,
    },
    /// Pinned staging ran out inside the window (a new pinned page would be an allocation).
    #[error("the capture window ran out of pinned staging ({bytes} bytes asked)")]
    StagingExhausted {
        /// Staging bytes asked for.
        bytes: u64,
    },
    /// A host synchronisation (read, sync, profile, dynamic cube count) inside the window.
    #[error("host synchronisation inside a capture window: {0}")]
    HostSync(&'static str),
    /// A kernel that was never compiled was launched inside the window.
    #[error("first-time kernel compile inside a capture window: {0}")]
    FirstCompile(String),
    /// The operation cannot be recorded or done while capturing.
    #[error("not supported inside a capture window: {0}")]
    Unsupported(&'static str),
    /// The stream had errors from earlier asynchronous work; no window was opened.
    #[error("the stream has pending errors from earlier work")]
    StreamUnhealthy(#[source] ServerError),
    /// A CubeCL server call inside the window failed.
    #[error("server error inside the capture window")]
    Server(#[source] ServerError),
    /// A copy, GEMM or collective would reach past the end of a buffer it was given.
    #[error("{what} reaches {reach} bytes of a buffer of {size}")]
    OutOfBounds {
        /// The operation and operand.
        what: &'static str,
        /// Bytes it would reach.
        reach: u64,
        /// Bytes the buffer holds.
        size: u64,
    },
    /// A driver call failed.
    #[error("CUDA driver call `{call}` failed: {error}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The driver's error.
        #[source]
        error: DriverError,
    },
    /// NCCL could not be loaded, or is too old for collectives in graphs.
    #[error("NCCL is unavailable: {0}")]
    NcclUnavailable(NcclMissing),
    /// An NCCL call failed, or a communicator was aborted.
    #[error("NCCL call `{call}` failed: {failure}")]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// NCCL's result, or why the call could not be made.
        #[source]
        failure: NcclFailure,
    },
    /// cuBLAS could not be loaded (no libcublas on the library path): matmuls run
    /// CubeCL's kernels instead.
    #[error("cuBLAS (libcublas) could not be loaded; matmuls use CubeCL's kernels")]
    BlasUnavailable,
    /// A cuBLAS call failed.
    #[error("cuBLAS call `{call}` failed: {error}")]
    Blas {
        /// The cuBLAS function.
        call: &'static str,
        /// cuBLAS's status.
        #[source]
        error: CublasError,
    },
    /// The graph id is not (or no longer) known to the server.
    #[error("unknown graph {0}")]
    UnknownGraph(u64),
    /// The device worker thread could not be reached.
    #[error("the device worker thread could not be reached")]
    Unreachable,
}

impl CaptureError {
    pub(crate) fn driver(call: &'static str, error: DriverError) -> Self {
        Self::Driver { call, error }
    }

    pub(crate) fn blas(call: &'static str, error: CublasError) -> Self {
        Self::Blas { call, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;
    use std::error::Error;

    // Formatting a `DriverError` asks the driver for its text, so these tests compare the
    // typed source instead (they run without a GPU or a driver).
    #[test]
    fn driver_errors_keep_the_driver_error_as_their_source() {
        let driver = DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        let capture = CaptureError::driver("cuGraphLaunch", driver);
        let source = capture
            .source()
            .and_then(|s| s.downcast_ref::<DriverError>());
        assert_eq!(source, Some(&driver));
        let init = InitError::driver("cuInit", driver);
        let source = init.source().and_then(|s| s.downcast_ref::<DriverError>());
        assert_eq!(source, Some(&driver));
        assert!(matches!(init, InitError::Driver { call: "cuInit", .. }));
    }
}

/// Why NCCL cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NcclMissing {
    /// No `libnccl.so` on the library path.
    #[error(
        "libnccl.so was not found on the library path (pip's nvidia-nccl ships only \
         libnccl.so.2: link libnccl.so to it in a directory of LD_LIBRARY_PATH)"
    )]
    NotFound,
    /// An NCCL older than 2.10, which cannot average or be captured into graphs.
    #[error("NCCL {version} is older than 2.10 (graph capture and averaging)")]
    TooOld {
        /// NCCL's version code (e.g. 21903 for 2.19.3).
        version: i32,
    },
}

/// How an NCCL call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NcclFailure {
    /// NCCL returned an error.
    #[error("NCCL returned {0:?}")]
    Status(cudarc::nccl::sys::ncclResult_t),
    /// A communicator's unique id of another size than NCCL's.
    #[error("a unique id of {len} bytes, not 128")]
    IdLength {
        /// The id's length.
        len: usize,
    },
    /// The communicator was aborted or closed, for this reason.
    #[error("the communicator is gone: {reason}")]
    Gone {
        /// Why it was aborted (the group's failure) or closed.
        reason: String,
    },
    /// A broadcast from a rank the communicator does not have.
    #[error("root {root} of {world} ranks")]
    RootOutOfRange {
        /// The root asked for.
        root: usize,
        /// The communicator's ranks.
        world: usize,
    },
    /// No communicator under this key on the device: the rank did not join.
    #[error("no communicator {key} on this device (the rank did not join)")]
    NoCommunicator {
        /// The group's key.
        key: u64,
    },
}
