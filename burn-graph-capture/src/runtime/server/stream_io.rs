//! The stream's host side: staging buffers, reads and metadata uploads, and how a
//! binding resolves to device memory. Methods of [`ServerStream`], which owns the pools.

use super::*;

/// Host transfers above this size skip pinned staging unless asked (as stock does).
const PINNED_STAGING_LIMIT: usize = 100 * 1024 * 1024;

impl ServerStream {
    /// Resolves a binding to its device slice, in the pool its handle's stream names (the
    /// arena, a graph's private pool, or the normal pools).
    pub(super) fn resource(&mut self, binding: Binding) -> Result<GpuResource, IoError> {
        self.pool_for(&binding.stream).get_resource(
            binding.memory,
            binding.offset_start,
            binding.offset_end,
        )
    }

    /// Pinned staging for a copy the stream will read later. Inside a window it must come from
    /// pinned pages that already exist (pageable copies cannot be captured, and a new pinned
    /// page is an allocation); a miss breaks the window.
    pub(super) fn staging_buffer(&mut self, size: usize) -> Result<Bytes, ServerError> {
        if !self.capturing() {
            return Ok(self.host_buffer(size, true));
        }
        match self.reserve_pinned(size) {
            Some(bytes) => Ok(bytes),
            None => {
                let error = CaptureError::StagingExhausted { bytes: size as u64 };
                self.window.break_with(error.clone());
                Err(capture_as_server_err(error))
            }
        }
    }

    /// Reserves pinned staging for `size` bytes, or `None` when the pinned pool can't.
    pub(super) fn reserve_pinned(&mut self, size: usize) -> Option<Bytes> {
        let handle = self.pinned.reserve(size as u64).ok()?;
        let binding = handle.binding();
        let resource = self.pinned.get_resource(binding.clone(), None, None).ok()?;
        let controller = PinnedStagingController::new(binding, resource);
        // SAFETY: the controller's memory covers at least `size` bytes (the pool reserved it).
        Some(unsafe { Bytes::from_controller(Box::new(controller), size) })
    }

    /// Host buffer for a transfer: pinned when small enough (or asked), else plain memory.
    pub(super) fn host_buffer(&mut self, size: usize, force_pinned: bool) -> Bytes {
        if size == 0 || (!force_pinned && size > PINNED_STAGING_LIMIT) {
            return Bytes::from_bytes_vec(vec![0; size]);
        }
        self.reserve_pinned(size)
            .unwrap_or_else(|| Bytes::from_bytes_vec(vec![0; size]))
    }

    /// Queues the device→host copy of one tensor; returns the (not yet valid) bytes.
    pub(super) fn read_one(
        &mut self,
        descriptor: CopyDescriptor,
    ) -> Result<(Bytes, Binding), IoError> {
        let plan = plan_copy(&descriptor.shape, &descriptor.strides, descriptor.elem_size)?;
        let source = self.resource(descriptor.handle.clone())?;
        let mut bytes = self.host_buffer(plan.host_bytes(), true);
        // SAFETY: `source` is a live pool slice covering the tensor; `bytes` is returned only
        // after the fence recorded behind this copy has been waited on.
        unsafe { copy_to_host(plan, source.ptr, &mut bytes, self.stream.cu_stream())? };
        Ok((bytes, descriptor.handle))
    }

    /// Uploads per-launch metadata into a fresh device slice, through pinned staging.
    pub(super) fn upload_metadata(&mut self, words: &[u64]) -> Result<Handle, ServerError> {
        // SAFETY: u64 words viewed as their bytes.
        let data = unsafe {
            std::slice::from_raw_parts(words.as_ptr() as *const u8, std::mem::size_of_val(words))
        };
        // Pinned when the pool can serve it; plain memory otherwise (the copy then stages
        // synchronously in the driver, still correct).
        let mut staging = self.staging_buffer(data.len())?;
        staging.copy_from_slice(data);

        let owner = StreamId::current();
        let handle = Handle::new(owner, data.len() as u64);
        let cursor = self.tick();
        let pool = self.pool_for(&owner);
        let reserved = pool.reserve(data.len() as u64)?;
        pool.bind(reserved, handle.memory.clone(), cursor)
            .map_err(ServerError::from)?;
        let target = self.resource(handle.clone().binding())?;
        // SAFETY: `target` is a fresh slice of `data.len()` bytes; `staging` is pinned and
        // kept alive by the drop queue until a fence after this copy (inside a window: by the
        // graph's retention, since every replay reads it again).
        unsafe {
            copy_to_device(
                CopyPlan::Linear { bytes: data.len() },
                &staging,
                target.ptr,
                self.stream.cu_stream(),
            )?
        };
        self.release_staging(staging);
        Ok(handle)
    }
}
