//! Kernels written in CUDA C, for what CubeCL cannot express (a grid-wide barrier needs
//! `__threadfence` and acquire loads, which CubeCL 0.10 does not emit).
//!
//! A [`SourceKernel`] is a `CubeTask` whose "compilation" hands over its source, so it takes
//! the path of every CubeCL kernel: NVRTC and the on-disk PTX cache on first use (outside
//! any window), the window rules at launch, retention of its buffers inside a window.
//! Its parameters are its buffers' device pointers, in order; everything else (shapes,
//! strides) is compiled into the source, so one kernel serves one configuration.

use cubecl_core::ir::AddressType;
use cubecl_core::ir::StorageType;
use cubecl_core::prelude::CubeDim;
use cubecl_core::server::ExecutionMode;
use cubecl_runtime::compiler::{CompilationError, CubeTask};
use cubecl_runtime::id::KernelId;
use cubecl_runtime::kernel::{CompiledKernel, KernelMetadata};

use super::compile::CudaGraphCompiler;

/// A CUDA C kernel with its launch shape.
#[derive(Debug)]
pub struct SourceKernel {
    /// `cooperative::<entry>` or `<entry>`: shown in traces and refusals.
    name: &'static str,
    /// The `extern "C"` function's name.
    entry: &'static str,
    source: String,
    id: KernelId,
}

impl SourceKernel {
    /// A kernel `entry` in `source`, run with `threads` threads per block. `key` names the
    /// configuration (whatever the source was generated from), so that two sources share
    /// a compiled function only when their keys are equal. A kernel whose `name` starts
    /// with `cooperative::` is launched with `cuLaunchCooperativeKernel`: it may only be
    /// given a grid the device can hold at once, and the driver starts its blocks together
    /// (what a grid-wide barrier needs).
    pub fn new(
        name: &'static str,
        entry: &'static str,
        source: String,
        threads: u32,
        key: String,
    ) -> Self {
        let mut id = KernelId::new::<Self>().info((name, key));
        id.cube_dim = CubeDim::new_1d(threads);
        Self {
            name,
            entry,
            source,
            id,
        }
    }
}

impl KernelMetadata for SourceKernel {
    fn name(&self) -> &'static str {
        self.name
    }

    fn id(&self) -> KernelId {
        self.id.clone()
    }

    fn address_type(&self) -> StorageType {
        AddressType::U64.unsigned_type()
    }
}

impl CubeTask<CudaGraphCompiler> for SourceKernel {
    fn compile(
        &self,
        _compiler: &mut CudaGraphCompiler,
        _options: &<CudaGraphCompiler as cubecl_runtime::compiler::Compiler>::CompilationOptions,
        _mode: ExecutionMode,
        _address_type: StorageType,
    ) -> Result<CompiledKernel<CudaGraphCompiler>, CompilationError> {
        Ok(CompiledKernel {
            entrypoint_name: self.entry.to_string(),
            debug_name: None,
            source: self.source.clone(),
            repr: None,
            cube_dim: self.id.cube_dim,
            debug_info: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooperative_kernels_are_known_by_name() {
        assert!(super::super::compile::is_cooperative(
            "cooperative::lstm_persistent_forward"
        ));
        assert!(!super::super::compile::is_cooperative(
            "lstm_persistent_forward"
        ));
    }

    #[test]
    fn configurations_are_told_apart_by_key() {
        let kernel = |key: &str| SourceKernel::new("k", "k", "src".into(), 64, key.into()).id();
        assert_eq!(kernel("a"), kernel("a"));
        assert_ne!(kernel("a"), kernel("b"));
        assert_eq!(kernel("a").cube_dim, CubeDim::new_1d(64));
    }
}
