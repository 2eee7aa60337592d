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
    /// Rank 0 turned this rank's connection away.
    #[error("rank 0 turned this rank away: {0}")]
    Refused(#[source] Refusal),
    /// What answered at rank 0's address did not prove it is this job's rank 0 (another
    /// job, another secret, or an impostor): this rank sent it nothing.
    #[error("the process at rank 0's address is not this job's rank 0: {0}")]
    HubUnproven(#[source] Refusal),
    /// A member of the group broke the rendezvous protocol (a frame of a kind or length
    /// that cannot come at that point).
    #[error("rank {rank} broke the group's protocol: {why}; the group was aborted")]
    Protocol {
        /// The rank whose connection it came on (rank 0, for a rank's link to the hub).
        rank: usize,
        /// What it did.
        #[source]
        why: Refusal,
    },
}

/// Why one end of a rendezvous connection turned the other away. Rank 0 logs each
/// connection it refuses and keeps waiting for its ranks; a rank that is refused gets
/// [`DistError::Refused`], one that refuses rank 0 [`DistError::HubUnproven`].
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum Refusal {
    /// It does not speak this group's protocol (another service, a port scanner, a
    /// frame of the wrong kind or size).
    #[error("it does not speak the rendezvous protocol")]
    Malformed,
    /// A frame longer than its kind may be at that point; refused before it was read.
    #[error("it announced a frame of {len} bytes where at most {max} may come")]
    Oversized {
        /// The frame's kind byte.
        kind: u8,
        /// The length it announced.
        len: u64,
        /// The longest allowed there.
        max: u64,
    },
    /// It said nothing whole within the handshake's deadline.
    #[error("it stayed silent past the handshake's deadline")]
    Silent,
    /// It closed the connection during the handshake.
    #[error("it closed the connection during the handshake")]
    Closed,
    /// Its proof does not match this end's secret: another secret, or a handshake
    /// recorded earlier and replayed (each proof covers a fresh nonce of each side).
    #[error("its proof does not match the job's secret (another secret, or a replayed handshake)")]
    BadProof,
    /// It has no job secret, and this end has one.
    #[error("it has no job secret, and this group has one")]
    NoSecret,
    /// It has a job secret, and this end has none.
    #[error("it has a job secret, and this group has none")]
    UnexpectedSecret,
    /// It named a rank that another connection holds.
    #[error("rank {rank} was taken already")]
    RankTaken {
        /// The rank it named.
        rank: usize,
    },
    /// It named a rank the group does not have (or rank 0, which listens).
    #[error("rank {rank} cannot join a group of {world}")]
    RankOutOfRange {
        /// The rank it named.
        rank: usize,
        /// The group's size.
        world: usize,
    },
    /// It joins a group of another size.
    #[error("rank {rank} joins a group of {theirs}, rank 0 one of {ours}")]
    WorldSize {
        /// The rank it named.
        rank: usize,
        /// Its world size.
        theirs: usize,
        /// Rank 0's.
        ours: usize,
    },
    /// Rank 0 was in the middle of as many handshakes as it takes at once.
    #[error("rank 0 had too many handshakes in progress")]
    Busy,
}

/// How the ranks of a group disagree.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
pub enum Disagreement {
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
    /// A rank connecting to rank 0.
    Connect,
    /// A rank proving itself to rank 0, or rank 0 answering it.
    Handshake,
    /// Drawing a handshake's nonce from the operating system.
    Nonce,
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
            LinkStep::Connect => "connecting to rank 0",
            LinkStep::Handshake => "shaking hands",
            LinkStep::Nonce => "drawing a nonce",
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
    /// A group on an address other machines can reach, without a job secret: anyone
    /// reaching the port could join it.
    #[error(
        "{address} is not a loopback address: a group other machines can reach needs a job \
         secret (DataParallelConfig::with_secret, or BURN_GRAPH_CAPTURE_SECRET)"
    )]
    SecretNeeded {
        /// The address.
        address: String,
    },
    /// A job secret too short to resist guessing.
    #[error("a job secret of {len} bytes; it needs at least {min}")]
    ShortSecret {
        /// Its length.
        len: usize,
        /// The shortest taken.
        min: usize,
    },
    /// A payload longer than the group's largest (`max_payload_bytes`).
    #[error("a payload of {len} bytes; the group takes at most {max}")]
    PayloadTooLarge {
        /// Its length.
        len: usize,
        /// The group's limit.
        max: u64,
    },
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
    /// The group's TCP link failed at `step`, for the operating system's reason.
    pub(crate) fn link(step: LinkStep, error: std::io::Error) -> Self {
        DistError::Collective(CollectiveFailure::Link(step, Cause::new(error)))
    }

    /// Whether peers may be stuck in collectives this failure leaves unfinished, so that
    /// the group's communicators must be aborted. A rank that left after a finished step
    /// leaves no collective unfinished: aborting then would cut the others' last one.
    pub fn aborts(&self) -> bool {
        !matches!(
            self,
            DistError::RankLeft { .. }
                | DistError::Mismatch(_)
                | DistError::InvalidUse(_)
                | DistError::Refused(_)
                | DistError::HubUnproven(_)
        )
    }
}
