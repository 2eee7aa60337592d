//! Why a data-parallel group cannot go on: typed, so that a rank learns which peer failed
//! and how, instead of waiting forever in a collective.
//!
//! Each error's words are whole (they include what lies under them, as the runtime's
//! errors do), and what lies under them is also their `source()`, typed.

use std::fmt;

use burn_backend::DType;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cause::Cause;

/// A data-parallel failure. Once a group has failed, every rank's next step (or the one in
/// progress) returns it, and the group cannot be used again: build a new one.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
pub enum DistError {
    /// A rank's thread unwound (a panic) while it was a member: its peers may be waiting
    /// for collectives it will never join, so the group's communicators were aborted.
    #[error("rank {rank} was lost (its thread panicked); the group was aborted")]
    RankLost {
        /// The lost rank.
        rank: usize,
    },
    /// A rank left the group (its trainer was dropped) while others still stepped: the
    /// ranks ran different numbers of steps.
    #[error("rank {rank} left the group while other ranks still step")]
    RankLeft {
        /// The rank that left.
        rank: usize,
    },
    /// A rank waited longer than the group's timeout for the others.
    #[error(
        "rank {rank} waited {waited_ms} ms for rank(s) {missing:?}; the group was aborted \
         (timeout {timeout_ms} ms)"
    )]
    Timeout {
        /// The rank that gave up waiting.
        rank: usize,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
        /// How long it waited, in milliseconds.
        waited_ms: u64,
        /// The group's timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// A rank failed inside a step, where its peers may already have entered the step's
    /// collectives: the group was aborted. The rank's error is the source: whole where
    /// it was handed over in this process, as its text where it crossed between ranks.
    #[error("rank {rank} failed inside a step: {cause}; the group was aborted")]
    RankFailed {
        /// The failed rank.
        rank: usize,
        /// What failed.
        #[source]
        cause: Cause,
    },
    /// The group was aborted by its owner (`DataParallel::abort`), for the owner's reason.
    #[error("the group was aborted: {0}")]
    Aborted(String),
    /// The ranks do not train the same thing: other parameter shapes, another world size
    /// or other tensors in a collective.
    #[error("the ranks disagree: {0}")]
    Mismatch(#[source] Disagreement),
    /// A collective could not be set up or queued (NCCL missing or refusing, a tensor it
    /// cannot take, the group's connections failing).
    #[error("collective failed: {0}")]
    Collective(#[source] CollectiveFailure),
    /// Bad arguments to a group (a rank out of range, a rank taken twice, no ranks).
    #[error("invalid group use: {0}")]
    InvalidUse(#[source] GroupMisuse),
}

/// How the ranks of a group disagree.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
pub enum Disagreement {
    /// A rank joined with another world size than rank 0's.
    #[error("rank {rank} joins a group of {theirs}, rank 0 one of {ours}")]
    WorldSize {
        /// The joining rank.
        rank: usize,
        /// Its world size.
        theirs: usize,
        /// Rank 0's.
        ours: usize,
    },
    /// A round of the rendezvous brought another number of payloads than ranks.
    #[error("{given} payloads in a round of {world}")]
    RoundSize {
        /// Payloads received.
        given: usize,
        /// Ranks in the group.
        world: usize,
    },
    /// A rank gave tensors of another total size to a host collective.
    #[error("a rank gave {given} bytes of tensors where this rank gave {expected}")]
    TensorBytes {
        /// The other rank's bytes.
        given: usize,
        /// This rank's.
        expected: usize,
    },
    /// A rank's parameter list could not be read.
    #[error("rank {rank}'s parameter list could not be read: {cause}")]
    UnreadableParameters {
        /// The rank.
        rank: usize,
        /// Why.
        #[source]
        cause: Cause,
    },
    /// A rank trains parameters of other shapes (or in another order) than rank 0.
    #[error("rank {rank} trains parameters of other shapes (or in another order) than rank 0")]
    ParameterShapes {
        /// The first such rank.
        rank: usize,
    },
    /// A rank's optimizer state does not fit its model.
    #[error("rank {rank}'s optimizer state does not fit its model")]
    OptimizerState {
        /// The first such rank.
        rank: usize,
    },
}

/// Why a collective could not be set up or queued.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
pub enum CollectiveFailure {
    /// The GPU runtime refused it (NCCL not found, an NCCL call failed, the rank's
    /// communicator is gone); the runtime's error is the source.
    #[error("the GPU runtime refused it: {0}")]
    Runtime(#[source] Cause),
    /// Rank 0 could not make the group's NCCL id, so no rank can join.
    #[error("rank 0 could not make an NCCL id (is NCCL available there?)")]
    NoNcclId,
    /// Collectives average and broadcast fp32 tensors only.
    #[error("collectives take fp32 tensors, not {dtype:?}")]
    NotF32 {
        /// The tensor's element type.
        dtype: DType,
    },
    /// One collective's tensors lie on more than one device.
    #[error("a collective's tensors lie on more than one device")]
    MixedDevices,
    /// A tensor could not be laid out row-major, as NCCL reads it.
    #[error("a tensor of shape {shape:?} could not be packed (strides {strides:?})")]
    Unpackable {
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides after the attempt.
        strides: Vec<usize>,
    },
    /// Sums are not offered on the fused stacks (only means and broadcasts are).
    #[error("no sum on fused stacks")]
    NoFusedSum,
    /// A tensor's values could not be read to the host for a host collective.
    #[error("a tensor could not be read for a host collective: {0}")]
    TensorRead(#[source] Cause),
    /// The group's TCP connections failed.
    #[error("the group's TCP link failed while {0}: {1}")]
    Link(LinkStep, #[source] Cause),
}

/// What a group's TCP link was doing when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkStep {
    /// Rank 0 binding its address.
    Listen,
    /// Rank 0 taking a rank's connection.
    Accept,
    /// Rank 0 reading a rank's hello.
    ReadHello,
    /// A rank connecting to rank 0.
    Connect,
    /// A rank sending its hello.
    SayHello,
    /// Setting up a connection (no delay, a second handle for its reader).
    Configure,
    /// Starting a connection's reader thread.
    SpawnReader,
}

impl fmt::Display for LinkStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkStep::Listen => "listening",
            LinkStep::Accept => "accepting a rank",
            LinkStep::ReadHello => "reading a rank's hello",
            LinkStep::Connect => "connecting to rank 0",
            LinkStep::SayHello => "saying hello",
            LinkStep::Configure => "setting up a connection",
            LinkStep::SpawnReader => "starting a reader thread",
        })
    }
}

/// A group used in a way it cannot be.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
pub enum GroupMisuse {
    /// A group of no ranks.
    #[error("a group needs at least one rank")]
    NoRanks,
    /// A timeout that is not a positive, finite number of seconds.
    #[error("the timeout must be a positive number of seconds, not {secs}")]
    BadTimeout {
        /// The configured timeout.
        secs: f64,
    },
    /// A rank number the group does not have.
    #[error("rank {rank} of a group of {world}")]
    RankOutOfRange {
        /// The rank asked for.
        rank: usize,
        /// The group's size.
        world: usize,
    },
    /// A rank taken (or joined) twice.
    #[error("rank {rank} was taken already")]
    RankTaken {
        /// The rank.
        rank: usize,
    },
    /// A rank gathered in a process that holds another rank.
    #[error("rank {rank} gathers in rank {process_rank}'s process")]
    WrongProcess {
        /// The rank that gathered.
        rank: usize,
        /// The process's rank.
        process_rank: usize,
    },
    /// A rank gave two payloads in one round of the rendezvous.
    #[error("rank {rank} gave two payloads in one round")]
    TwoPayloads {
        /// The rank.
        rank: usize,
    },
    /// A connection to rank 0 that did not say hello as a rank of this group.
    #[error("a connection that is not a rank of this group")]
    Stranger,
    /// Two ranks on one GPU of one process: NCCL takes one rank per GPU.
    #[error(
        "ranks {first} and {second} are both on GPU {device} of one process: NCCL takes one rank per GPU"
    )]
    SharedGpu {
        /// The lower rank.
        first: usize,
        /// The higher rank.
        second: usize,
        /// The GPU's index.
        device: u32,
    },
}

impl DistError {
    /// Whether peers may be stuck in collectives this failure leaves unfinished, so that
    /// the group's communicators must be aborted. A rank that left after a finished step
    /// leaves no collective unfinished: aborting then would cut the others' last one.
    pub fn aborts(&self) -> bool {
        !matches!(
            self,
            DistError::RankLeft { .. } | DistError::Mismatch(_) | DistError::InvalidUse(_)
        )
    }
}
