//! Raw memory for the CubeCL memory pools: device memory and pinned host memory.
//!
//! CubeCL's `MemoryManagement` slices pages out of a `ComputeStorage`; the two storages
//! here only allocate and free whole pages. Device frees are queued and applied on
//! `flush`, so a later capture window can hold them back (ARCHITECTURE.md, hazards).

pub mod gpu;
pub mod pinned;

pub use gpu::{GpuResource, GpuStorage};
pub use pinned::{PinnedStagingController, PinnedStorage};
