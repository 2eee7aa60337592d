//! The persistent recurrence (`strategy.rs` chooses it): the time loop of each direction
//! in one cooperative launch of CUDA C kernels (`forward.cu`, `backward.cu`), on this
//! crate's runtime only. CubeCL 0.10 cannot express its grid barrier (no `__threadfence`,
//! no acquire load), so the kernels are [`SourceKernel`]s: NVRTC compiles them on first use
//! and they launch on the runtime's stream like any kernel, so windows record them.
//!
//! Each kernel is generated per configuration: shapes, grid and every tensor's strides
//! become `#define`s, so views and pitched allocations need no copy and the loops unroll.
//! What the forward writes is what the stepwise forward writes (states and activated
//! gates, the same layouts), so either backward reads either forward's output.

use burn_backend::{DType, TensorMetadata};
use burn_cubecl::cubecl::prelude::CubeCount;
use burn_cubecl::ops::numeric::zeros;
use burn_cubecl::tensor::CubeTensor;
use cubecl_runtime::server::KernelArguments;
use std::fmt::Write as _;

use super::empty;
use crate::nn::lstm::strategy::PersistentGrid;
use crate::runtime::{CudaGraphRuntime, SourceKernel};

type Tensor = CubeTensor<CudaGraphRuntime>;

const COMMON: &str = include_str!("common.cuh");
const FORWARD: &str = include_str!("forward.cu");
const BACKWARD: &str = include_str!("backward.cu");

/// The `#define`s one kernel is compiled with.
#[derive(Default)]
struct Prelude(String);

impl Prelude {
    fn define(mut self, name: &str, value: usize) -> Self {
        // Writing to a String cannot fail.
        let _ = writeln!(self.0, "#define {name} {value}");
        self
    }

    /// `PREFIX_S0`, `PREFIX_S1`, ...: the strides of `tensor`, in elements.
    fn strides(self, prefix: &str, tensor: &Tensor) -> Self {
        tensor
            .meta
            .strides()
            .iter()
            .enumerate()
            .fold(self, |prelude, (dim, stride)| {
                prelude.define(&format!("{prefix}_S{dim}"), *stride)
            })
    }

    fn grid(self, batch: usize, time: usize, hidden: usize, grid: PersistentGrid) -> Self {
        self.define("BATCH", batch)
            .define("TIME", time)
            .define("HIDDEN", hidden)
            .define("UNITS", grid.units)
            .define("BLOCKS", grid.blocks)
            .define("WARPS", grid.warps)
    }
}

/// Launches `entry` of `body` over `grid`, reading and writing `buffers` in order, then
/// a zeroed barrier counter.
fn launch(
    name: &'static str,
    entry: &'static str,
    body: &str,
    prelude: Prelude,
    grid: PersistentGrid,
    buffers: &[&Tensor],
) {
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
    crate::nn::lstm::strategy::count_persistent_launch();
}

/// The forward: states `[2, T + 1, B, H]` and activated gates `[T, B, 4H]` from the input
/// projection `xp` `[B, T, 4H]`, `wh` `[H, 4H]` and the initial state (all fp32).
pub(super) fn forward(
    xp: &Tensor,
    wh: &Tensor,
    h0: &Tensor,
    c0: &Tensor,
    grid: PersistentGrid,
) -> (Tensor, Tensor) {
    let [batch, time, four_h] = xp.shape().dims();
    let hidden = four_h / 4;
    let states = empty(xp, [2, time + 1, batch, hidden]);
    let gates = empty(xp, [time, batch, four_h]);
    let prelude = Prelude::default()
        .grid(batch, time, hidden, grid)
        .strides("XP", xp)
        .strides("WH", wh)
        .strides("H0", h0)
        .strides("C0", c0)
        .strides("ST", &states)
        .strides("GA", &gates);
    launch(
        "cooperative::lstm_persistent_forward",
        "lstm_persistent_forward",
        FORWARD,
        prelude,
        grid,
        &[xp, wh, h0, c0, &states, &gates],
    );
    (states, gates)
}

/// The backward's recurrent part: the pre-activation gate gradients `dz` `[T, B, 4H]` and
/// the initial state's gradients `[B, H]` (hidden, cell), from the states' gradient and
/// what the forward saved.
pub(super) fn backward(
    d_states: &Tensor,
    states: &Tensor,
    gates: &Tensor,
    wh: &Tensor,
    grid: PersistentGrid,
) -> (Tensor, Tensor, Tensor) {
    let [_, steps, batch, hidden] = states.shape().dims();
    let time = steps - 1;
    let dz = empty(states, [time, batch, 4 * hidden]);
    let d_h0 = empty(states, [batch, hidden]);
    let d_c0 = empty(states, [batch, hidden]);
    let prelude = Prelude::default()
        .grid(batch, time, hidden, grid)
        .strides("DS", d_states)
        .strides("ST", states)
        .strides("GA", gates)
        .strides("WH", wh)
        .strides("DZ", &dz)
        .strides("DH", &d_h0)
        .strides("DC", &d_c0);
    launch(
        "cooperative::lstm_persistent_backward",
        "lstm_persistent_backward",
        BACKWARD,
        prelude,
        grid,
        &[d_states, states, gates, wh, &dz, &d_h0, &d_c0],
    );
    (dz, d_h0, d_c0)
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
        };
        let prelude = Prelude::default().grid(3, 5, 8, grid).define("XP_S0", 160);
        assert_eq!(
            prelude.0,
            "#define BATCH 3\n#define TIME 5\n#define HIDDEN 8\n#define UNITS 4\n\
             #define BLOCKS 2\n#define WARPS 3\n#define XP_S0 160\n"
        );
    }

    /// Every stride the kernels read is one the prelude defines for that kernel: a tensor
    /// it is given, and a dimension that tensor has (NVRTC would refuse the kernel only on
    /// the GPU).
    #[test]
    fn the_kernels_read_only_strides_they_are_given() {
        let forward = [
            ("XP", 3),
            ("WH", 2),
            ("H0", 2),
            ("C0", 2),
            ("ST", 4),
            ("GA", 3),
        ];
        let backward = [
            ("DS", 4),
            ("ST", 4),
            ("GA", 3),
            ("WH", 2),
            ("DZ", 3),
            ("DH", 2),
            ("DC", 2),
        ];
        for (body, tensors) in [(FORWARD, &forward[..]), (BACKWARD, &backward[..])] {
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
            assert!(strides >= 10, "the kernels read strides from the prelude");
        }
    }
}
