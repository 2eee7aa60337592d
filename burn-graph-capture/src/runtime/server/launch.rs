//! Kernel launches: compile on first use, refuse what a window cannot record, upload the
//! launch's metadata, launch on the stream.

use super::*;
use crate::runtime::window::Window;

impl CudaGraphServer {
    pub(super) fn launch_checked(
        &mut self,
        kernel: Box<dyn CubeTask<CudaGraphCompiler>>,
        count: CubeCount,
        args: KernelArguments,
        mode: ExecutionMode,
    ) -> Result<(), ServerError> {
        self.bind_context()?;
        if !args.tensor_maps.is_empty() {
            return Err(LaunchError::Unknown {
                reason: "CudaGraphRuntime does not support TMA tensor maps".into(),
                backtrace: BackTrace::capture(),
            }
            .into());
        }
        let mut kernel_id = kernel.id();
        kernel_id.mode(mode);
        let grid_constants = self.kernels.grid_constants();

        let capturing = match &self.stream.window {
            // A broken window records nothing more; `capture_end` reports why.
            Window::Broken(..) => return Ok(()),
            Window::Recording(_) => true,
            Window::Closed => false,
        };
        if capturing {
            if !self.kernels.contains(&kernel_id) {
                let name = kernel.name().to_string();
                self.break_window(CaptureError::FirstCompile(name));
                return Ok(());
            }
            if matches!(count, CubeCount::Dynamic(_)) {
                self.break_window(CaptureError::HostSync("dynamic cube count"));
                return Ok(());
            }
        }

        let grid = match count {
            CubeCount::Static(x, y, z) => (x, y, z),
            CubeCount::Dynamic(binding) => self.read_cube_count(binding)?,
        };
        // Which kernel ran, for diffing two runs' launch sequences (autotune benchmarks
        // show as `profiling`).
        tracing::trace!(
            target: "burn_graph_capture::launch",
            kernel = kernel.name(),
            ?grid,
            buffers = args.buffers.len(),
            profiling = !self.timestamps.is_empty(),
            capturing,
        );

        let stream = &mut self.stream;
        let info = &args.info;
        // With grid constants, static metadata and scalars go by value and only the
        // dynamic tail is uploaded; otherwise the whole block is uploaded.
        let (by_value, upload): (Option<*mut c_void>, &[u64]) = if grid_constants {
            let tail = info.data.get(info.dynamic_metadata_offset..).unwrap_or(&[]);
            (Some(info.data.as_ptr() as *mut c_void), tail)
        } else {
            (None, &info.data)
        };
        let metadata = if upload.is_empty() {
            None
        } else {
            Some(stream.upload_metadata(upload)?)
        };

        let mut pointers = Vec::with_capacity(args.buffers.len() + 1);
        let metadata_binding = metadata.as_ref().map(|handle| handle.clone().binding());
        for binding in args.buffers.into_iter().chain(metadata_binding) {
            let slice = stream.resource(binding.clone())?;
            stream.keep_for_window(binding, &slice);
            pointers.push(slice.ptr);
        }
        let mut params: Vec<*mut c_void> = pointers
            .iter_mut()
            .map(|ptr| ptr as *mut u64 as *mut c_void)
            .collect();
        params.extend(by_value);

        let launched = launch_on(
            &mut self.kernels,
            stream,
            &kernel_id,
            kernel.as_ref(),
            mode,
            &self.logger,
            grid,
            &mut params,
        );
        // `metadata` may drop now: the pools reuse it only for later stream work (inside a
        // window the retention list above keeps it).
        drop(metadata);
        if launched.is_ok() {
            stream.window.count_launch();
        }
        stream.maybe_flush_drop_queue();

        if let Err(err) = launched {
            if self.timestamps.is_empty() {
                return Err(err.into());
            }
            self.timestamps.error(ProfileError::Launch(err));
        }
        Ok(())
    }

    /// `CubeCount::Dynamic`: reads the three counts back (a host sync, as in stock).
    pub(super) fn read_cube_count(
        &mut self,
        binding: Binding,
    ) -> Result<(u32, u32, u32), ServerError> {
        let descriptor = CopyDescriptor::new(binding, [3].into(), [1].into(), 4);
        let bytes = future::block_on(self.read_now(vec![descriptor]))?;
        // (never inside a window: `launch_checked` refuses dynamic counts there)
        let data = bytes.first().map(|b| &b[..]).unwrap_or(&[]);
        if data.len() < 12 {
            return Err(IoError::Unknown {
                description: "dynamic cube count holds fewer than 3 u32".into(),
                backtrace: BackTrace::capture(),
            }
            .into());
        }
        let word = |i: usize| u32::from_ne_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        Ok((word(0), word(4), word(8)))
    }
}

/// Compiles (first time) and launches one kernel on the stream.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_on(
    kernels: &mut KernelCache,
    stream: &mut ServerStream,
    kernel_id: &cubecl_runtime::id::KernelId,
    kernel: &dyn CubeTask<CudaGraphCompiler>,
    mode: ExecutionMode,
    logger: &ServerLogger,
    grid: (u32, u32, u32),
    params: &mut [*mut c_void],
) -> Result<(), LaunchError> {
    let loaded = kernels.get_or_compile(kernel_id, kernel, mode, logger)?;
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        // An empty grid is a no-op; the driver would reject it as invalid.
        return Ok(());
    }
    let block = (loaded.cube_dim.x, loaded.cube_dim.y, loaded.cube_dim.z);
    let (function, shared, cu_stream) = (
        loaded.function.cu_function(),
        loaded.shared_mem_bytes,
        stream.stream.cu_stream(),
    );
    if loaded.cooperative {
        // SAFETY: as below. A source kernel declares only its buffers, so the driver reads
        // no more of `params` than those; the caller sized the grid to what the device
        // holds at once (else the launch fails, it does not hang).
        return unsafe {
            result::launch_cooperative_kernel(function, grid, block, shared, cu_stream, params)
        }
        .map_err(|err| launch_err("cuLaunchCooperativeKernel", err));
    }
    // SAFETY: `params` holds one pointer per kernel parameter, in the order the CUDA
    // dialect declares them (buffers, metadata buffer, by-value info struct); each points
    // to a value that outlives this call (the driver copies them at launch).
    unsafe { result::launch_kernel(function, grid, block, shared, cu_stream, params) }
        .map_err(|err| launch_err("cuLaunchKernel", err))
}
