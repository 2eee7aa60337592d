//! CubeCL's own conformance suites, for this crate's runtime and for stock cubecl-cuda in
//! one binary (issue 3, GPU check 0: every test that passes on stock must pass on ours).
//!
//! The suites are instantiated the way cubecl-cuda 0.10 does in its own `lib.rs` tests:
//! `testgen_all!` over the same float/int/uint lists, `cubecl_std::testgen!`, the tensor
//! identity and quantized-view suites. Test names are `ours::…` and `stock::…`, identical
//! after the prefix, so a run can list what passes on stock only.
//!
//! Gating: the generated tests are plain `#[test]`s (they cannot be `#[ignore]`d) and fail
//! without a GPU, so they live in this package outside the main workspace (see its
//! Cargo.toml). Neither `cargo test --workspace` nor `cargo test --features cuda` builds
//! them: `cargo test --release --no-run` in this folder does (`xtask gpu` does not pack it),
//! and on the GPU machine every test starts a real client, which panics (the test fails)
//! when no GPU or driver is there. Run it there once per runtime, `gpu_conformance stock::`
//! and `gpu_conformance ours::`, and compare the tests each passes.
// cubecl-cuda allows this too: some generated tests test cfgs this package does not declare.
#![allow(unexpected_cfgs)]

/// Expands CubeCL's suites for one runtime, in the module the caller names.
macro_rules! conformance {
    ($module:ident, $runtime:ty) => {
        mod $module {
            pub type TestRuntime = $runtime;

            pub use half::{bf16, f16};

            cubecl_core::testgen_all!(
                f32: [f16, bf16, f32, f64],
                i32: [i8, i16, i32, i64],
                u32: [u8, u16, u32, u64]
            );
            cubecl_std::testgen!();
            cubecl_std::testgen_tensor_identity!([f16, bf16, f32, u32]);
            cubecl_std::testgen_quantized_view!(f16);
        }
    };
}

conformance!(ours, burn_graph_capture::runtime::CudaGraphRuntime);
conformance!(stock, cubecl_cuda::CudaRuntime);
