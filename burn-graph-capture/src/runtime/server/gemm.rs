//! cuBLAS GEMMs on the stream (see `blas.rs`), under the window rules: the handle and its
//! workspace are made outside any window (at the first GEMM, or when a window opens), a
//! GEMM inside a window is recorded and retains its buffers, and another thread's GEMM
//! waits for the window to close.

use cudarc::driver::CudaEvent;
use cudarc::driver::sys::CUevent_flags;

use super::graphs::capture_server_err;
use super::*;

impl CudaGraphServer {
    /// Makes the cuBLAS handle if cuBLAS is enabled and none was tried yet. Never while a
    /// window is open: the worker thread is the one capturing, and `cublasCreate` and its
    /// workspace allocation are calls a capture forbids.
    pub(super) fn prepare_blas(&mut self) {
        if self.blas.is_some() || !super::super::blas::enabled() {
            return;
        }
        let stream = &mut self.stream;
        if stream.capturing() {
            return;
        }
        let made = Blas::new(&stream.stream.clone());
        if let Err(err) = &made {
            tracing::warn!("CudaGraphRuntime: {err}; matmuls use CubeCL's kernels");
        }
        self.blas = Some(made);
    }

    /// Whether GEMMs can be queued: cuBLAS is on, loaded, and its handle made. `None`
    /// while no handle was tried and a window is open (the handle cannot be made then).
    pub fn blas_ready(&mut self) -> Option<bool> {
        if let Err(err) = self.bind_context() {
            tracing::warn!("CudaGraphRuntime: {err}");
            return Some(false);
        }
        self.prepare_blas();
        match &self.blas {
            Some(made) => Some(made.is_ok()),
            None if super::super::blas::enabled() => None,
            None => Some(false),
        }
    }

    /// An event recorded on the stream after everything queued so far, with timing, for
    /// measuring GEMMs (`backend::gemm_route`); `None` while a window is open (a capture
    /// forbids the host waits that reading it takes).
    pub fn timing_event(&mut self) -> Result<Option<CudaEvent>, CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        let caller = StreamId::current();
        if self.holds(caller) || self.stream.capturing() {
            return Ok(None);
        }
        let stream = &self.stream.stream;
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map(Some)
            .map_err(|err| CaptureError::driver("cuEventRecord", err))
    }

    /// [`Self::gemm`] for a caller that does not wait: an error is parked on the
    /// caller's stream (the next sync or read returns it) and breaks an open window, as
    /// a failed launch does. Callers check [`Self::blas_ready`] first.
    pub fn queue_gemm(&mut self, gemm: Gemm, operands: [Binding; 3]) {
        if let Err(err) = self.gemm(gemm, operands) {
            self.park(StreamId::current(), capture_as_server_err(err));
        }
    }

    /// Queues `gemm` (fp32) reading `operands[0]` and `[1]` and writing `[2]`, in order
    /// with all work submitted before it.
    ///
    /// `Err` means nothing was queued: cuBLAS is off or missing (`BlasUnavailable`), an
    /// operand is smaller than the GEMM reaches, or cuBLAS refused the call; both callers
    /// ([`Self::queue_gemm`] and a held GEMM's turn after a window) park it on the stream.
    /// Inside a window that broke earlier, nothing is queued either, and the window
    /// reports why it broke.
    pub(super) fn gemm(&mut self, gemm: Gemm, operands: [Binding; 3]) -> Result<(), CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        self.prepare_blas();
        if !matches!(self.blas, Some(Ok(_))) {
            return Err(CaptureError::BlasUnavailable);
        }
        let caller = StreamId::current();
        if self.holds(caller) {
            // Another thread's window is open: the GEMM runs once it closes.
            self.deferred.push(Deferred::Gemm {
                gemm,
                operands,
                stream_id: caller,
            });
            return Ok(());
        }
        let stream = &mut self.stream;
        if stream.window.is_broken() {
            return Ok(());
        }
        let mut slices = Vec::with_capacity(3);
        for (binding, extent) in operands.iter().zip(gemm.extents()) {
            let slice = stream
                .resource(binding.clone())
                .map_err(|err| capture_server_err(err.into()))?;
            let bytes = extent * size_of::<f32>() as u64;
            if slice.size < bytes {
                return Err(CaptureError::OutOfBounds {
                    what: "a GEMM operand",
                    reach: bytes,
                    size: slice.size,
                });
            }
            slices.push(slice);
        }
        let Some(Ok(blas)) = &self.blas else {
            unreachable!("checked above");
        };
        let stream = &mut self.stream;
        // SAFETY: each pointer starts a live pool or arena slice holding at least the
        // elements the GEMM reaches (checked above); the slices stay alive until the stream
        // has run the GEMM (inside a window they are retained with the graph below).
        let queued = unsafe { blas.sgemm(&gemm, slices[0].ptr, slices[1].ptr, slices[2].ptr) };
        if let Err(err) = queued {
            stream.window.break_with(err.clone());
            return Err(err);
        }
        for (binding, slice) in operands.into_iter().zip(&slices) {
            stream.keep_for_window(binding, slice);
        }
        stream.window.count_launch();
        Ok(())
    }
}
