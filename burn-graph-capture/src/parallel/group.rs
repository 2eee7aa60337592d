//! A data-parallel group of this process: one rank per device, each on its own thread,
//! each with its own [`GraphTrainer`](crate::GraphTrainer).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{DistError, GroupMisuse};
use super::rendezvous::{FailureHook, Meeting, Rendezvous};
use super::secret::JobSecret;
use super::tcp::{Settings, TcpMeeting};

/// How a [`DataParallel`] group waits, and how ranks that are processes prove they
/// belong to it. Serializing it leaves the secret out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataParallelConfig {
    /// Longest a rank waits for the others at one meeting point (the agreement before
    /// each step, a CPU collective), in seconds. A rank that dies (its thread unwinds) is
    /// noticed at once; this bounds the wait for a rank that is stuck or far behind
    /// (compiling, or evaluating while the others train). Default 60.
    pub timeout_secs: f64,
    /// The job's secret, for ranks that are processes ([`DataParallel::connect`]): each
    /// proves it knows it before rank 0 lets it in, and rank 0 proves it too. `None`:
    /// read from `BURN_GRAPH_CAPTURE_SECRET`; a group without one may only meet on
    /// loopback. Never serialized.
    #[serde(skip)]
    pub secret: Option<JobSecret>,
    /// The longest payload one rank sends in one round of the meeting (the step's
    /// agreement, the NCCL id, a CPU collective's tensors), in bytes: what rank 0 reads
    /// at most from one rank at a time. Default 64 MiB.
    pub max_payload_bytes: u64,
}

impl Default for DataParallelConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl DataParallelConfig {
    /// A 60 s timeout, no secret (read from the environment when connecting), payloads
    /// of at most 64 MiB.
    pub fn new() -> Self {
        Self {
            timeout_secs: 60.0,
            secret: None,
            max_payload_bytes: 64 << 20,
        }
    }

    /// With this timeout, in seconds.
    pub fn with_timeout_secs(mut self, timeout_secs: f64) -> Self {
        self.timeout_secs = timeout_secs;
        self
    }

    /// With this job secret.
    pub fn with_secret(mut self, secret: JobSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// With this largest payload, in bytes.
    pub fn with_max_payload_bytes(mut self, max_payload_bytes: u64) -> Self {
        self.max_payload_bytes = max_payload_bytes;
        self
    }
}

/// A group of `world` ranks training one model together in this process: each rank a
/// thread with its own device and [`GraphTrainer`](crate::GraphTrainer), gradients
/// averaged over the ranks every step (NCCL on GPUs). Hand one [`RankMember`] to each
/// rank's thread ([`members`](Self::members)). Ranks that are processes (one per GPU, or
/// several machines) each get theirs from [`connect`](Self::connect) instead.
///
/// Every rank must run the same steps: the same number, on batches of the same shapes.
/// The ranks agree before each step whether it replays, captures or runs eagerly, so one
/// rank's fallback makes every rank fall back together, and a rank that fails, is lost
/// or stays away longer than the timeout turns into a [`DistError`] on the others.
#[derive(Clone)]
pub struct DataParallel {
    group: Arc<Group>,
}

impl std::fmt::Debug for DataParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("id", &self.group.id)
            .field("world", &self.group.rendezvous.world())
            .finish()
    }
}

pub(crate) struct Group {
    id: u64,
    rendezvous: Box<dyn Meeting>,
    /// Ranks handed out.
    taken: Mutex<Vec<bool>>,
    /// What each rank runs when it leaves (freeing its communicator), by rank.
    leave_hooks: Mutex<Vec<Vec<LeaveHook>>>,
}

/// What a rank runs when it leaves its group.
type LeaveHook = Box<dyn FnOnce() + Send>;

impl DataParallel {
    /// A group of `world` ranks.
    pub fn new(world: usize, config: &DataParallelConfig) -> Result<Self, DistError> {
        if world == 0 {
            return Err(DistError::InvalidUse(GroupMisuse::NoRanks));
        }
        let timeout = timeout(config)?;
        Ok(Self {
            group: Group::new(world, Box::new(Rendezvous::new(world, timeout))),
        })
    }

    /// This process's member of a group whose ranks are processes, on this machine or
    /// others: rank 0 listens on `address` (e.g. `0.0.0.0:29500`), and every other rank
    /// connects to it there (e.g. `node0:29500`), retrying until the timeout. Rank 0
    /// returns once every rank has joined, the others once rank 0 has let them in. A
    /// rank whose process dies is noticed by the others at once (its connection
    /// closes); see the guide's multi-GPU chapter for NCCL's environment across
    /// machines.
    ///
    /// Every rank proves it knows the job's secret (the config's, else
    /// `BURN_GRAPH_CAPTURE_SECRET`) before rank 0 lets it in, and rank 0 proves it
    /// before a rank sends it anything; an address that is not loopback without a
    /// secret is [`GroupMisuse::SecretNeeded`]. Rank 0 logs and closes every other
    /// connection (a wrong secret, a stranger, a rank already taken) and goes on
    /// waiting; a rank it turns away gets [`DistError::Refused`].
    pub fn connect(
        address: impl std::net::ToSocketAddrs,
        rank: usize,
        world: usize,
        config: &DataParallelConfig,
    ) -> Result<RankMember, DistError> {
        let secret = match &config.secret {
            Some(secret) => Some(secret.clone()),
            None => JobSecret::from_env()?,
        };
        let settings = Settings {
            timeout: timeout(config)?,
            secret,
            max_payload: config.max_payload_bytes,
        };
        let meeting = TcpMeeting::connect(address, rank, world, settings)?;
        let group = Group::new(world, Box::new(meeting));
        group.taken.lock().unwrap_or_else(PoisonError::into_inner)[rank] = true;
        Ok(RankMember {
            link: RankLink { group, rank },
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.group.rendezvous.world()
    }

    /// The member for `rank`; each rank can be taken once.
    pub fn member(&self, rank: usize) -> Result<RankMember, DistError> {
        let mut taken = self
            .group
            .taken
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match taken.get_mut(rank) {
            None => Err(DistError::InvalidUse(GroupMisuse::RankOutOfRange {
                rank,
                world: self.world(),
            })),
            Some(true) => Err(DistError::InvalidUse(GroupMisuse::RankTaken { rank })),
            Some(slot) => {
                *slot = true;
                Ok(RankMember {
                    link: RankLink {
                        group: self.group.clone(),
                        rank,
                    },
                })
            }
        }
    }

    /// Every rank's member, in rank order (fails if one was taken already).
    pub fn members(&self) -> Result<Vec<RankMember>, DistError> {
        (0..self.world()).map(|rank| self.member(rank)).collect()
    }

    /// Aborts the group: every rank's next step (or the one waiting) returns
    /// [`DistError::Aborted`], and its communicators are aborted.
    pub fn abort(&self, why: &str) -> DistError {
        self.group
            .rendezvous
            .fail(DistError::Aborted(why.to_string()))
    }

    /// Why the group failed, if it did.
    pub fn failure(&self) -> Option<DistError> {
        self.group.rendezvous.failure()
    }
}

/// The group's timeout, checked.
fn timeout(config: &DataParallelConfig) -> Result<Duration, DistError> {
    if config.timeout_secs.is_finite() && config.timeout_secs > 0.0 {
        Ok(Duration::from_secs_f64(config.timeout_secs))
    } else {
        Err(DistError::InvalidUse(GroupMisuse::BadTimeout {
            secs: config.timeout_secs,
        }))
    }
}

impl Group {
    fn new(world: usize, rendezvous: Box<dyn Meeting>) -> Arc<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(Group {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            rendezvous,
            taken: Mutex::new(vec![false; world]),
            leave_hooks: Mutex::new((0..world).map(|_| Vec::new()).collect()),
        })
    }
}

/// One rank's membership of a [`DataParallel`] group; its trainer holds it. Its
/// [`RankLink`] (through `Deref`) is what backends and collectives use.
///
/// Dropping it leaves the group: cleanly when its thread is not unwinding (peers that
/// step again get [`DistError::RankLeft`]), else as a lost rank, which aborts the group
/// at once so that no peer waits in a collective for it.
#[derive(Debug)]
pub struct RankMember {
    link: RankLink,
}

impl std::ops::Deref for RankMember {
    type Target = RankLink;

    fn deref(&self) -> &RankLink {
        &self.link
    }
}

impl Drop for RankMember {
    fn drop(&mut self) {
        let group = &self.link.group;
        group
            .rendezvous
            .leave(self.link.rank, std::thread::panicking());
        let hooks = std::mem::take(
            &mut group
                .leave_hooks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)[self.link.rank],
        );
        for hook in hooks {
            hook();
        }
    }
}

/// A rank's link to its group: its rank, the group's meeting point, and its failure.
/// Cloned into what runs collectives for the rank (a fused op, say); leaving is the
/// [`RankMember`]'s.
#[derive(Clone)]
pub struct RankLink {
    group: Arc<Group>,
    rank: usize,
}

impl std::fmt::Debug for RankLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankLink")
            .field("group", &self.group.id)
            .field("rank", &self.rank)
            .field("world", &self.world())
            .finish()
    }
}

impl RankLink {
    /// This rank, from 0.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in its group.
    pub fn world(&self) -> usize {
        self.group.rendezvous.world()
    }

    /// The group's identity in this process (what backends key communicators by).
    pub fn group_id(&self) -> u64 {
        self.group.id
    }

    /// Every rank's `payload`, in rank order: the meeting point of agreements and of
    /// CPU collectives. Every rank calls it in the same order.
    pub fn all_gather(&self, payload: Vec<u8>) -> Result<Arc<Vec<Vec<u8>>>, DistError> {
        self.group.rendezvous.all_gather(self.rank, payload)
    }

    /// Fails the group (see [`DistError::aborts`]); returns the group's failure.
    pub fn fail(&self, error: DistError) -> DistError {
        self.group.rendezvous.fail(error)
    }

    /// Why the group failed, if it did.
    pub fn failure(&self) -> Option<DistError> {
        self.group.rendezvous.failure()
    }

    /// Runs `hook` once the group fails in a way that may leave peers in a collective
    /// (a backend aborts its communicator there).
    pub fn on_failure(&self, hook: impl Fn(&DistError) + Send + Sync + 'static) {
        let hook: FailureHook = Box::new(hook);
        self.group.rendezvous.on_failure(hook);
    }

    /// Runs `hook` when this rank leaves the group (a backend frees its communicator
    /// there), after the group's failure hooks if it is lost.
    pub fn on_leave(&self, hook: impl FnOnce() + Send + 'static) {
        self.group
            .leave_hooks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[self.rank]
            .push(Box::new(hook));
    }

    /// The longest wait at one meeting point.
    pub fn timeout(&self) -> Duration {
        self.group.rendezvous.timeout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_handed_out_once_and_in_range() {
        let group = DataParallel::new(2, &DataParallelConfig::new()).unwrap();
        let first = group.member(1).unwrap();
        assert_eq!((first.rank(), first.world()), (1, 2));
        fn misuse<T>(result: Result<T, DistError>) -> GroupMisuse {
            match result {
                Err(DistError::InvalidUse(misuse)) => misuse,
                other => panic!("{:?}", other.map(|_| ())),
            }
        }
        assert_eq!(misuse(group.member(1)), GroupMisuse::RankTaken { rank: 1 });
        assert_eq!(
            misuse(group.member(2)),
            GroupMisuse::RankOutOfRange { rank: 2, world: 2 }
        );
        assert_eq!(misuse(group.members()), GroupMisuse::RankTaken { rank: 1 });
        assert_eq!(
            misuse(DataParallel::new(0, &DataParallelConfig::new())),
            GroupMisuse::NoRanks
        );
        assert_eq!(
            misuse(DataParallel::new(
                2,
                &DataParallelConfig::new().with_timeout_secs(0.0)
            )),
            GroupMisuse::BadTimeout { secs: 0.0 }
        );
    }

    #[test]
    fn a_configs_secret_shows_nowhere_and_is_not_serialized() {
        let words = "a secret that must stay in memory";
        let config = DataParallelConfig::new().with_secret(JobSecret::new(words).unwrap());
        assert!(!format!("{config:?}").contains(words));
        let json = serde_json::to_string(&config).unwrap();
        assert!(!json.contains(words), "{json}");
        let read: DataParallelConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(
            read,
            DataParallelConfig {
                secret: None,
                ..config
            }
        );
    }

    #[test]
    fn a_group_on_a_network_address_without_a_secret_is_refused() {
        assert!(
            std::env::var_os(crate::parallel::SECRET_ENV).is_none(),
            "run the tests without a job secret in the environment"
        );
        let error = DataParallel::connect("0.0.0.0:0", 0, 2, &DataParallelConfig::new());
        assert_eq!(
            error.map(|_| ()).unwrap_err(),
            DistError::InvalidUse(GroupMisuse::SecretNeeded {
                address: "0.0.0.0:0".into()
            })
        );
    }

    #[test]
    fn a_member_dropped_while_unwinding_aborts_the_group() {
        let group = DataParallel::new(2, &DataParallelConfig::new()).unwrap();
        let [zero, one]: [RankMember; 2] = group.members().unwrap().try_into().unwrap();
        let lost = std::thread::spawn(move || {
            let _member = one;
            panic!("rank 1 dies");
        });
        assert!(lost.join().is_err());
        assert_eq!(group.failure(), Some(DistError::RankLost { rank: 1 }));
        assert_eq!(
            zero.all_gather(vec![]).unwrap_err(),
            DistError::RankLost { rank: 1 }
        );
    }

    #[test]
    fn abort_reaches_every_member() {
        let group = DataParallel::new(1, &DataParallelConfig::new()).unwrap();
        let member = group.member(0).unwrap();
        assert_eq!(member.all_gather(vec![3]).unwrap().as_ref(), &vec![vec![3]]);
        group.abort("operator stop");
        assert_eq!(
            member.all_gather(vec![3]).unwrap_err(),
            DistError::Aborted("operator stop".into())
        );
    }
}
