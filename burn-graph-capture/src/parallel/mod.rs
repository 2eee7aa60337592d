//! Data-parallel training: one rank per device, gradients averaged over the ranks inside
//! each step, the step still one CUDA graph per rank.
//!
//! - [`group`]: [`DataParallel`], the group of this process's ranks,
//!   [`RankMember`], what each rank's trainer holds, and its [`RankLink`], what
//!   collectives use;
//! - `rendezvous`: where ranks meet on the host (an all-gather with a timeout,
//!   liveness and a sticky failure), in memory for the threads of one process;
//! - `tcp`: the same over TCP, for ranks that are processes (rank 0 the hub), behind
//!   `handshake` (ranks and rank 0 prove they share the job's [`JobSecret`], from
//!   `secret`) and `frame` (every frame bounded by what its kind may carry);
//! - `host`: collectives on the host, for CPU backends;
//! - `error`: [`DistError`];
//! - `collectives`: [`Collectives`], what a backend does for a group.
//!
//! Backends provide the collectives themselves ([`Collectives`]): NCCL on this crate's
//! CUDA runtime, recorded into the step's graph like any kernel. How a trainer's ranks
//! agree on each step (`step::parallel::agreement`), and what a step averages
//! (`step::parallel::collectives`), belong to the step layer. This layer knows nothing
//! above it.

mod collectives;
pub mod error;
mod frame;
pub mod group;
mod handshake;
pub(crate) mod host;
mod rendezvous;
mod secret;
mod tcp;

pub use collectives::Collectives;
pub use error::{CollectiveFailure, Disagreement, DistError, GroupMisuse, LinkStep, Refusal};
pub use group::{DataParallel, DataParallelConfig, RankLink, RankMember};
pub use secret::{JobSecret, MIN_SECRET_BYTES, SECRET_ENV};
