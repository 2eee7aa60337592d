//! Kernel compilation: CubeCL IR → CUDA C++ (cubecl-cpp) → PTX (NVRTC) → loaded function.
//!
//! Compiled functions are cached in memory by `KernelId`, so each kernel is compiled once
//! per server (a capture window must never compile, I5; warmup fills this cache).
//! The NVRTC option list is assembled by a pure function so it can be unit tested.

use super::error::launch_err;
use super::ptx_cache::{PtxCache, compile_input};
use cubecl_common::backtrace::BackTrace;
use cubecl_core::{
    ir::DeviceProperties,
    server::{CubeDim, ExecutionMode, LaunchError, ResourceLimitError},
};
use cubecl_cpp::{
    cuda::{CudaDialect, mma::CudaWmmaCompiler},
    shared::{CompilationOptions, CppCompiler},
};
use cubecl_runtime::{
    compiler::{CompilationError, CubeTask},
    id::KernelId,
    logging::ServerLogger,
    validation::{validate_cube_dim, validate_units},
};
use cudarc::{
    driver::{CudaContext, CudaFunction, sys::CUfunction_attribute},
    nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts},
};
use std::{collections::HashMap, path::Path, sync::Arc};

/// Names of source kernels that must run as cooperative launches (all blocks resident at
/// once), which `launch_on` looks for.
const COOPERATIVE_PREFIX: &str = "cooperative::";

/// Environment variable that turns cooperative launches off (`off`): the kernels then go
/// through `cuLaunchKernel`, whose grid the driver does not promise to start together (a
/// workaround for a driver that refuses to capture cooperative launches; the grids are
/// sized to one block per SM, which an idle device holds).
const COOPERATIVE_VAR: &str = "BURN_GRAPH_CAPTURE_COOPERATIVE";

/// Whether the kernel named `name` is launched cooperatively.
pub(crate) fn is_cooperative(name: &str) -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled = *ENABLED
        .get_or_init(|| std::env::var(COOPERATIVE_VAR).map_or(true, |value| value.trim() != "off"));
    enabled && name.starts_with(COOPERATIVE_PREFIX)
}

/// The CubeCL compiler of this runtime: cubecl-cpp's CUDA dialect with WMMA intrinsics.
pub type CudaGraphCompiler = CppCompiler<CudaDialect<CudaWmmaCompiler>>;

/// NVRTC options for a device of compute capability `arch_version`.
///
/// Hopper and later compile for the architecture-specific target (`sm_90a`), which the
/// CUDA dialect's `wgmma`/`setmaxnreg` paths need. `-lineinfo` keeps compute-sanitizer
/// and ncu reports readable at no runtime cost.
pub fn nvrtc_options(
    arch_version: u32,
    include: &Path,
    cccl_include: Option<&Path>,
) -> Vec<String> {
    let suffix = if arch_version >= 90 { "a" } else { "" };
    let mut options = vec![
        format!("--gpu-architecture=sm_{arch_version}{suffix}"),
        format!("--include-path={}", include.display()),
        "-lineinfo".to_string(),
    ];
    if let Some(cccl) = cccl_include {
        options.push(format!("--include-path={}", cccl.display()));
    }
    options
}

/// A kernel ready to launch.
#[derive(Debug)]
pub struct LoadedKernel {
    pub function: CudaFunction,
    pub cube_dim: CubeDim,
    /// Dynamic shared memory per block (all of the kernel's shared memories, packed).
    pub shared_mem_bytes: u32,
    /// Launched with `cuLaunchCooperativeKernel` (a `SourceKernel` with a grid barrier).
    pub cooperative: bool,
}

/// Compiles kernels and keeps the loaded functions.
#[derive(Debug)]
pub struct KernelCache {
    ctx: Arc<CudaContext>,
    compilation_options: CompilationOptions,
    properties: DeviceProperties,
    nvrtc_options: Vec<String>,
    kernels: HashMap<KernelId, LoadedKernel>,
    /// NVRTC output from earlier processes (see `ptx_cache`).
    ptx_cache: PtxCache,
    /// NVRTC's version, part of every cache key.
    nvrtc_version: (i32, i32),
}

impl KernelCache {
    pub fn new(
        ctx: Arc<CudaContext>,
        compilation_options: CompilationOptions,
        properties: DeviceProperties,
        nvrtc_options: Vec<String>,
    ) -> Self {
        Self {
            ctx,
            compilation_options,
            properties,
            nvrtc_options,
            kernels: HashMap::new(),
            ptx_cache: PtxCache::from_env(),
            nvrtc_version: nvrtc_version(),
        }
    }

    /// Whether kernels get their static metadata as a by-value `__grid_constant__` struct.
    pub fn grid_constants(&self) -> bool {
        self.compilation_options.supports_features.grid_constants
    }

    /// Whether `id` is compiled already (a capture window may launch only those).
    pub fn contains(&self, id: &KernelId) -> bool {
        self.kernels.contains_key(id)
    }

    /// Returns the loaded kernel for `id`, compiling it on first use.
    pub fn get_or_compile(
        &mut self,
        id: &KernelId,
        kernel: &dyn CubeTask<CudaGraphCompiler>,
        mode: ExecutionMode,
        logger: &ServerLogger,
    ) -> Result<&LoadedKernel, LaunchError> {
        if !self.kernels.contains_key(id) {
            let loaded = self.compile(id, kernel, mode, logger)?;
            self.kernels.insert(id.clone(), loaded);
        }
        // Present: inserted above when missing.
        self.kernels.get(id).ok_or_else(|| LaunchError::Unknown {
            reason: "kernel cache lost an entry".into(),
            backtrace: BackTrace::capture(),
        })
    }

    fn compile(
        &self,
        id: &KernelId,
        kernel: &dyn CubeTask<CudaGraphCompiler>,
        mode: ExecutionMode,
        logger: &ServerLogger,
    ) -> Result<LoadedKernel, LaunchError> {
        validate_cube_dim(&self.properties, id)?;
        validate_units(&self.properties, id)?;

        let compiled = kernel.compile(
            &mut Default::default(),
            &self.compilation_options,
            mode,
            kernel.address_type(),
        )?;
        let shared = compiled
            .repr
            .as_ref()
            .map(|repr| repr.shared_memory_size())
            .unwrap_or(0);
        let max_shared = self.properties.hardware.max_shared_memory_size;
        if shared > max_shared {
            return Err(ResourceLimitError::SharedMemory {
                requested: shared,
                max: max_shared,
                backtrace: BackTrace::capture(),
            }
            .into());
        }
        logger.log_compilation(&compiled);

        let input = compile_input(&compiled.source, &self.nvrtc_options, self.nvrtc_version);
        let ptx = match self.ptx_cache.get(&input) {
            Some(cached) => Ptx::from_src(cached),
            None => {
                let options = CompileOptions {
                    options: self.nvrtc_options.clone(),
                    ..Default::default()
                };
                let ptx = compile_ptx_with_opts(&compiled.source, options).map_err(|err| {
                    LaunchError::from(CompilationError::Generic {
                        reason: describe_nvrtc_error(&err, &compiled.source),
                        backtrace: BackTrace::capture(),
                    })
                })?;
                self.ptx_cache.put(&input, &ptx.to_src());
                ptx
            }
        };

        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|err| launch_err("cuModuleLoadData", err))?;
        let function = module
            .load_function(&compiled.entrypoint_name)
            .map_err(|err| launch_err("cuModuleGetFunction", err))?;
        function
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared as i32,
            )
            .map_err(|err| launch_err("cuFuncSetAttribute", err))?;

        Ok(LoadedKernel {
            function,
            cube_dim: compiled.cube_dim,
            shared_mem_bytes: shared as u32,
            cooperative: is_cooperative(kernel.name()),
        })
    }
}

/// NVRTC's (major, minor) version; (0, 0) if it cannot say (the cache then keys on that).
fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers; it needs no state.
    let result = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if result == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        (major, minor)
    } else {
        (0, 0)
    }
}

fn describe_nvrtc_error(err: &CompileError, source: &str) -> String {
    match err {
        CompileError::CompileError { log, options, .. } => format!(
            "NVRTC rejected the kernel (options {options:?}):\n{}\n[Source]\n{source}",
            log.to_string_lossy()
        ),
        other => format!("NVRTC failed: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn hopper_targets_the_arch_specific_sm90a() {
        let opts = nvrtc_options(90, &PathBuf::from("/cuda/include"), None);
        assert_eq!(
            opts,
            vec![
                "--gpu-architecture=sm_90a".to_string(),
                "--include-path=/cuda/include".to_string(),
                "-lineinfo".to_string(),
            ]
        );
    }

    #[test]
    fn ampere_targets_plain_sm80_and_cccl_is_appended() {
        let opts = nvrtc_options(
            80,
            &PathBuf::from("/cuda/include"),
            Some(&PathBuf::from("/cuda/include/cccl")),
        );
        assert_eq!(opts[0], "--gpu-architecture=sm_80");
        assert_eq!(opts.last().unwrap(), "--include-path=/cuda/include/cccl");
    }
}
