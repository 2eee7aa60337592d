//! Device memory pages for the pools, allocated stream-ordered on the server's stream.

use crate::runtime::error::io_err;
use cubecl_common::backtrace::BackTrace;
use cubecl_core::{MemoryConfiguration, ir::MemoryDeviceProperties, server::IoError};
use cubecl_runtime::{
    logging::ServerLogger,
    memory_management::{MemoryManagement, MemoryManagementOptions},
    storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization},
};
use cudarc::driver::sys::{self, CUstreamCaptureMode};
use cudarc::driver::{
    CudaStream, DriverError, result,
    sys::{CUdeviceptr, CUresult},
};
use std::{collections::HashMap, sync::Arc};

/// How a page was allocated, which decides how it is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AllocKind {
    /// `cuMemAllocAsync` on the server stream: freed with `cuMemFreeAsync` on that stream.
    StreamOrdered,
    /// `cuMemAlloc` fallback (no memory-pool support): freed with `cuMemFree`.
    Plain,
}

/// A slice of device memory handed to a kernel or a copy.
#[derive(Debug, Clone)]
pub struct GpuResource {
    /// Device address of the first byte of the slice.
    pub ptr: CUdeviceptr,
    /// Length of the slice in bytes.
    pub size: u64,
}

/// Device pages of one server.
pub struct GpuStorage {
    stream: Arc<CudaStream>,
    alignment: usize,
    pages: HashMap<StorageId, (CUdeviceptr, AllocKind)>,
    /// Pages released by the pools, freed on the next [`ComputeStorage::flush`].
    pending_frees: Vec<StorageId>,
    /// While set, `flush` keeps `pending_frees` (a capture window must not free).
    frees_held: bool,
    /// While set, a capture window is open: `alloc` uses a capture-safe allocation.
    capturing: bool,
    /// Size of the first page that could not be allocated inside the window.
    refused_bytes: Option<u64>,
}

impl core::fmt::Debug for GpuStorage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GpuStorage")
            .field("pages", &self.pages.len())
            .field("pending_frees", &self.pending_frees.len())
            .field("frees_held", &self.frees_held)
            .finish()
    }
}

impl GpuStorage {
    /// Storage allocating on `stream` with pages aligned to `alignment` bytes.
    pub fn new(stream: Arc<CudaStream>, alignment: usize) -> Self {
        Self {
            stream,
            alignment,
            pages: HashMap::new(),
            pending_frees: Vec::new(),
            frees_held: false,
            capturing: false,
            refused_bytes: None,
        }
    }

    /// Set to give every device buffer a page of its own (for compute-sanitizer runs).
    pub const EXCLUSIVE_PAGES_VAR: &str = "BURN_GRAPH_CAPTURE_EXCLUSIVE_PAGES";

    /// A CubeCL pool over device pages of `stream`, laid out as `props` says. The server's
    /// normal pools, the arena and the graph pools differ only in their `options`.
    pub fn pool(
        stream: Arc<CudaStream>,
        props: &MemoryDeviceProperties,
        logger: Arc<ServerLogger>,
        options: MemoryManagementOptions,
    ) -> MemoryManagement<Self> {
        // Diagnostics: one device allocation per buffer, so that compute-sanitizer sees
        // each buffer's bounds (sub-allocated pages hide overruns into a neighbour).
        let configuration = if std::env::var_os(Self::EXCLUSIVE_PAGES_VAR).is_some() {
            MemoryConfiguration::ExclusivePages
        } else {
            MemoryConfiguration::default()
        };
        MemoryManagement::from_configuration(
            Self::new(stream, props.alignment as usize),
            props,
            configuration,
            logger,
            options,
        )
    }

    /// Holds (or releases) page frees. While held, `flush` frees nothing; the queue is
    /// applied by the first `flush` after release. Meant for capture windows.
    pub fn hold_frees(&mut self, hold: bool) {
        self.frees_held = hold;
    }

    /// Marks a capture window open (or closed). Inside a window a capture can need more
    /// pages than eager steps (the graph retains every buffer it touches, so nothing is
    /// reused within the step). `cuMemAllocAsync` would record a memory node that the
    /// graph then owns, so new pages come from plain `cuMemAlloc` in relaxed capture mode
    /// (as PyTorch's caching allocator does): they are ordinary pool pages. If even that
    /// fails, `alloc` fails and remembers the size, so the window reports
    /// [`CaptureError::NeedsAllocation`].
    ///
    /// [`CaptureError::NeedsAllocation`]: crate::runtime::error::CaptureError::NeedsAllocation
    pub fn set_capturing(&mut self, capturing: bool) {
        self.capturing = capturing;
        self.refused_bytes = None;
    }

    /// The size of the first page that failed inside the window.
    pub fn refused_bytes(&self) -> Option<u64> {
        self.refused_bytes
    }

    /// Number of pages currently allocated.
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    fn free_pending(&mut self) {
        let stream = self.stream.cu_stream();
        for id in self.pending_frees.drain(..) {
            let Some((ptr, kind)) = self.pages.remove(&id) else {
                continue;
            };
            // SAFETY: `ptr` came from the matching allocation call below and is removed from
            // `pages` here, so it is freed exactly once. Stream-ordered frees run after all
            // work already queued on the stream that might still read the page.
            let freed = unsafe {
                match kind {
                    AllocKind::StreamOrdered => result::free_async(ptr, stream),
                    AllocKind::Plain => result::free_sync(ptr),
                }
            };
            if let Err(err) = freed {
                tracing::warn!("CudaGraphRuntime: freeing a device page failed: {err:?}");
            }
        }
    }
}

/// `cuMemAlloc` on a thread that is capturing in THREAD_LOCAL mode.
///
/// "CU_STREAM_CAPTURE_MODE_RELAXED: the local thread is not prohibited from potentially
/// unsafe API calls" (cuThreadExchangeStreamCaptureMode); the previous mode is restored.
///
/// # Safety
/// The returned pointer must be freed exactly once.
unsafe fn malloc_while_capturing(bytes: usize) -> Result<CUdeviceptr, DriverError> {
    let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges this thread's capture mode; `mode` receives the previous one.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()?;
    // SAFETY: a plain allocation.
    let allocated = unsafe { result::malloc_sync(bytes) };
    // SAFETY: puts the previous mode back.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()?;
    allocated
}

impl ComputeStorage for GpuStorage {
    type Resource = GpuResource;

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn get(&mut self, handle: &StorageHandle) -> GpuResource {
        // The pools only ask for pages they allocated and have not released, so a miss is a
        // bookkeeping bug in this crate, not a recoverable driver condition.
        let (base, _) = self
            .pages
            .get(&handle.id)
            .expect("CudaGraphRuntime: storage page looked up after release");
        GpuResource {
            ptr: base + handle.offset(),
            size: handle.size(),
        }
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let bytes = size as usize;
        let allocated = if self.capturing {
            // SAFETY: a plain allocation, recorded and freed once.
            match unsafe { malloc_while_capturing(bytes) } {
                Ok(ptr) => Ok((ptr, AllocKind::Plain)),
                Err(err) => {
                    self.refused_bytes.get_or_insert(size);
                    return Err(io_err("cuMemAlloc inside a capture window", err));
                }
            }
        } else {
            // SAFETY: plain allocation calls; the pointer is recorded and freed once.
            unsafe { result::malloc_async(self.stream.cu_stream(), bytes) }
                .map(|ptr| (ptr, AllocKind::StreamOrdered))
                .or_else(|_| {
                    unsafe { result::malloc_sync(bytes) }.map(|ptr| (ptr, AllocKind::Plain))
                })
        };
        let (ptr, kind) = match allocated {
            Ok(page) => page,
            Err(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                return Err(IoError::BufferTooBig {
                    size,
                    backtrace: BackTrace::capture(),
                });
            }
            Err(err) => return Err(io_err("cuMemAlloc", err)),
        };
        let id = StorageId::new();
        self.pages.insert(id, (ptr, kind));
        Ok(StorageHandle::new(
            id,
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, id: StorageId) {
        self.pending_frees.push(id);
    }

    fn flush(&mut self) {
        if !self.frees_held {
            self.free_pending();
        }
    }
}

impl Drop for GpuStorage {
    fn drop(&mut self) {
        self.frees_held = false;
        self.pending_frees.extend(self.pages.keys().copied());
        self.free_pending();
    }
}
