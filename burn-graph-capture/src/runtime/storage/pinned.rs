//! Page-locked host memory for staging host↔device copies.
//!
//! Copies from pageable memory are synchronous in the driver; staging through pinned pages
//! keeps `read`/`write` asynchronous. Pages are owned by cudarc's `PinnedHostSlice`
//! (freed with `cuMemFreeHost` on drop). Allocated without `WRITECOMBINED`, because the
//! host reads device-to-host results back from these pages.

use crate::runtime::error::io_err;
use cubecl_common::bytes::{AllocationController, AllocationProperty};
use cubecl_core::server::IoError;
use cubecl_runtime::{
    memory_management::ManagedMemoryBinding,
    storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization},
};
use cudarc::driver::{CudaContext, PinnedHostSlice};
use std::{collections::HashMap, mem::MaybeUninit, sync::Arc};

/// Alignment of pinned slices handed out by the pool.
pub const PINNED_ALIGNMENT: usize = core::mem::size_of::<u128>();

/// A slice of a pinned page.
#[derive(Debug)]
pub struct PinnedResource {
    pub ptr: *mut u8,
    pub size: usize,
}

// SAFETY: the pointer targets page-locked memory that stays valid while its page is
// allocated; the pools keep the page while any binding to it is alive.
unsafe impl Send for PinnedResource {}

struct PinnedPage {
    _owner: PinnedHostSlice<u8>,
    ptr: *mut u8,
}

/// Pinned host pages of one server.
pub struct PinnedStorage {
    ctx: Arc<CudaContext>,
    pages: HashMap<StorageId, PinnedPage>,
    /// While set, `alloc` refuses new pages (inside a capture window).
    allocs_refused: bool,
}

// SAFETY: pages are only touched by the server thread that owns this storage; the raw
// pointers target page-locked memory owned by the `PinnedHostSlice`s kept alongside.
unsafe impl Send for PinnedStorage {}

impl core::fmt::Debug for PinnedStorage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PinnedStorage")
            .field("pages", &self.pages.len())
            .finish()
    }
}

impl PinnedStorage {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Self {
            ctx,
            pages: HashMap::new(),
            allocs_refused: false,
        }
    }
}

impl PinnedStorage {
    /// Refuses (or allows again) new pinned pages; a capture window stages only from pages
    /// that exist before it opens.
    pub fn refuse_allocs(&mut self, refuse: bool) {
        self.allocs_refused = refuse;
    }
}

impl ComputeStorage for PinnedStorage {
    type Resource = PinnedResource;

    fn alignment(&self) -> usize {
        PINNED_ALIGNMENT
    }

    fn get(&mut self, handle: &StorageHandle) -> PinnedResource {
        let page = self
            .pages
            .get(&handle.id)
            .expect("CudaGraphRuntime: pinned page looked up after release");
        PinnedResource {
            // SAFETY: the pools hand out offsets inside the page.
            ptr: unsafe { page.ptr.add(handle.offset() as usize) },
            size: handle.size() as usize,
        }
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        if self.allocs_refused {
            return Err(IoError::Unknown {
                description: format!(
                    "capture window: a new pinned page of {size} bytes was refused"
                ),
                backtrace: cubecl_common::backtrace::BackTrace::capture(),
            });
        }
        // SAFETY: the memory is uninitialised; it is only exposed as `MaybeUninit` until the
        // staging code writes it.
        let mut owner = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(size as usize, 0) }
            .map_err(|err| io_err("cuMemHostAlloc", err))?;
        let ptr = owner
            .as_mut_ptr()
            .map_err(|err| io_err("cuEventSynchronize", err))?;
        let id = StorageId::new();
        self.pages.insert(id, PinnedPage { _owner: owner, ptr });
        Ok(StorageHandle::new(
            id,
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, id: StorageId) {
        // Dropping the `PinnedHostSlice` frees the page; no copy can still use it because
        // staging `Bytes` keep their slice (and so the page) reserved until fenced.
        self.pages.remove(&id);
    }

    fn flush(&mut self) {}
}

/// Backs a `Bytes` with a pinned slice; the slice returns to the pool when the `Bytes`
/// drops (the binding is what keeps it reserved).
pub struct PinnedStagingController {
    resource: PinnedResource,
    _binding: ManagedMemoryBinding,
}

impl PinnedStagingController {
    pub fn new(binding: ManagedMemoryBinding, resource: PinnedResource) -> Self {
        Self {
            resource,
            _binding: binding,
        }
    }
}

impl AllocationController for PinnedStagingController {
    fn alloc_align(&self) -> usize {
        PINNED_ALIGNMENT
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Pinned
    }

    unsafe fn memory_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: the slice is `size` bytes of a live pinned page (held by `_binding`).
        unsafe { std::slice::from_raw_parts_mut(self.resource.ptr.cast(), self.resource.size) }
    }

    fn memory(&self) -> &[MaybeUninit<u8>] {
        // SAFETY: as in `memory_mut`.
        unsafe { std::slice::from_raw_parts(self.resource.ptr.cast(), self.resource.size) }
    }
}
