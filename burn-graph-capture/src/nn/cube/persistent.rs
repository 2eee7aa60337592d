//! What the persistent recurrences share (`strategy.rs` chooses them): the time loop of
//! each direction in one cooperative launch of a CUDA C kernel, on this crate's runtime
//! only. CubeCL 0.10 cannot express their grid barrier (no `__threadfence`, no acquire
//! load), so the kernels are [`SourceKernel`]s: NVRTC compiles them on first use and they
//! launch on the runtime's stream like any kernel, so windows record them.
//!
//! Each kernel is generated per configuration: shapes, grid and every tensor's strides
//! become `#define`s ([`Prelude`]), so views and pitched allocations need no copy and the
//! loops unroll. `common.cuh` holds the barrier and the warp sums.

use burn_backend::DType;
use burn_cubecl::cubecl::prelude::CubeCount;
use burn_cubecl::ops::numeric::zeros;
use burn_cubecl::tensor::CubeTensor;
use cubecl_runtime::server::KernelArguments;
use std::fmt::Write as _;

use crate::nn::strategy::PersistentGrid;
use crate::runtime::{CudaGraphRuntime, SourceKernel};

/// A tensor of this crate's runtime, the only one the persistent kernels launch on.
pub(crate) type Tensor = CubeTensor<CudaGraphRuntime>;

const COMMON: &str = include_str!("common.cuh");

/// The `#define`s one kernel is compiled with.
#[derive(Default)]
pub(crate) struct Prelude(String);

impl Prelude {
    pub(crate) fn define(mut self, name: &str, value: usize) -> Self {
        // Writing to a String cannot fail.
        let _ = writeln!(self.0, "#define {name} {value}");
        self
    }

    /// `PREFIX_S0`, `PREFIX_S1`, ...: the strides of `tensor`, in elements.
    pub(crate) fn strides(self, prefix: &str, tensor: &Tensor) -> Self {
        tensor
            .meta
            .strides()
            .iter()
            .enumerate()
            .fold(self, |prelude, (dim, stride)| {
                prelude.define(&format!("{prefix}_S{dim}"), *stride)
            })
    }

    /// The problem and the launch: `BATCH`, `TIME`, `HIDDEN`, `UNITS`, `BLOCKS`, `WARPS`,
    /// `ROWS`.
    pub(crate) fn grid(
        self,
        batch: usize,
        time: usize,
        hidden: usize,
        grid: PersistentGrid,
    ) -> Self {
        self.define("BATCH", batch)
            .define("TIME", time)
            .define("HIDDEN", hidden)
            .define("UNITS", grid.units)
            .define("BLOCKS", grid.blocks)
            .define("WARPS", grid.warps)
            .define("ROWS", grid.rows)
    }
}

/// Launches `entry` of `body` (compiled after `prelude` and `common.cuh`) cooperatively
/// over `grid`, reading and writing `buffers` in order, then a zeroed barrier counter.
/// `name` must start with `cooperative::` (how the runtime knows to launch it so).
pub(crate) fn launch(
    name: &'static str,
    entry: &'static str,
    body: &str,
    prelude: Prelude,
    grid: PersistentGrid,
    buffers: &[&Tensor],
) {
    debug_assert!(name.starts_with("cooperative::"));
    let first = buffers[0];
    let counter = zeros::<CudaGraphRuntime>(first.device, [1].into(), DType::U32);
    let key = prelude.0.clone();
    let source = format!("{}{COMMON}\n{body}", prelude.0);
    let threads = (32 * grid.warps) as u32;
    let kernel = SourceKernel::new(name, entry, source, threads, key);
    let bindings = buffers
        .iter()
        .copied()
        .chain([&counter])
        .map(|tensor| tensor.handle.clone().binding())
        .collect();
    first.client.launch(
        Box::new(kernel),
        CubeCount::Static(grid.blocks as u32, 1, 1),
        KernelArguments::new().with_buffers(bindings),
    );
    crate::nn::strategy::count_persistent_launch();
}

/// Checks that every stride `body` reads is one its prelude defines: a tensor of
/// `tensors` (prefix, rank) and a dimension that tensor has. NVRTC would refuse the
/// kernel only on the GPU.
#[cfg(test)]
pub(crate) fn assert_reads_only_given_strides(body: &str, tensors: &[(&str, usize)]) {
    let words = body.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    let mut strides = 0;
    for word in words {
        let Some((prefix, dim)) = word.split_once("_S") else {
            continue;
        };
        let Ok(dim) = dim.parse::<usize>() else {
            continue;
        };
        let rank = tensors
            .iter()
            .find(|(name, _)| *name == prefix)
            .map(|t| t.1);
        assert!(
            rank.is_some_and(|rank| dim < rank),
            "{word}: no such stride"
        );
        strides += 1;
    }
    assert!(strides >= 10, "the kernel reads strides from the prelude");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prelude_defines_the_configuration() {
        let grid = PersistentGrid {
            units: 4,
            blocks: 2,
            warps: 3,
            rows: 2,
        };
        let prelude = Prelude::default().grid(3, 5, 8, grid).define("XP_S0", 160);
        assert_eq!(
            prelude.0,
            "#define BATCH 3\n#define TIME 5\n#define HIDDEN 8\n#define UNITS 4\n\
             #define BLOCKS 2\n#define WARPS 3\n#define ROWS 2\n#define XP_S0 160\n"
        );
    }

    #[test]
    #[should_panic(expected = "no such stride")]
    fn a_stride_of_no_given_tensor_is_found() {
        assert_reads_only_given_strides("x[XP_S0] y[ZZ_S1]", &[("XP", 1)]);
    }
}
