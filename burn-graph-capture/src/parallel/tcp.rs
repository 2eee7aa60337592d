//! The meeting point of ranks that are processes, on one machine or several: a star over
//! TCP with rank 0 as its hub.
//!
//! Rank 0 listens; every other rank connects to it and says which rank it is. A round of
//! [`Meeting::all_gather`] sends each rank's payload to the hub, which answers every rank
//! with all of them once it has them. One reader thread per connection turns what
//! arrives into events:
//! - a payload or the hub's answer goes to the waiting round;
//! - a failure a peer reports fails this rank's group too (the hub passes it on);
//! - a connection that closes without a goodbye is a lost rank: its process died or its
//!   machine went away. That fails the group at once, even while this rank's thread waits
//!   on the GPU rather than in a round, so its communicators are aborted;
//! - a goodbye marks a rank that left cleanly: the next round that needs it fails with
//!   `RankLeft`, and nothing is aborted.
//!
//! A rank joins only after a handshake (`handshake`) in which it proves it knows the
//! job's secret and rank 0 proves it too; every frame is bounded by what its kind may
//! carry (`frame`). Rank 0 shakes hands with each connection on a thread of its own, so
//! a stranger (a port scanner, a health probe, a rank of another job, a silent
//! connection) is logged and closed without taking a rank, delaying the real ranks or
//! failing the group.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::error::{Disagreement, DistError, GroupMisuse, LinkStep, Refusal};
use super::frame::{
    ALL, BYE, FAILURE, FrameError, MAX_REPORT, PAYLOAD, decode_all, encode_all, read_frame,
    write_frame,
};
use super::handshake::{self, Admitted, HANDSHAKE_TIMEOUT, NotJoined};
use super::rendezvous::{FailureHook, Meeting};
use super::secret::{self, JobSecret};

/// What a frame carries, once its handshake is done.
#[derive(Debug)]
enum Frame {
    /// A rank's payload of the current round (to the hub).
    Payload(Vec<u8>),
    /// Every rank's payload of the round (from the hub).
    All(Vec<Vec<u8>>),
    /// The group failed, and why.
    Failure(DistError),
    /// The sender left cleanly.
    Bye,
}

/// What the reader threads hand the waiting round.
#[derive(Debug)]
enum Event {
    Payload(usize, Vec<u8>),
    All(Vec<Vec<u8>>),
    /// Something changed the group's state (a failure, a rank leaving): look again.
    Wake,
}

/// Handshakes rank 0 runs at once; a connection beyond them is closed at once (a rank
/// turned away so retries).
const MAX_HANDSHAKES: usize = 64;

/// How a process's rank meets the others.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The longest wait at one meeting point, and for the group to form.
    pub(crate) timeout: Duration,
    /// The job's secret; `None` only on loopback.
    pub(crate) secret: Option<JobSecret>,
    /// The longest payload of one rank in one round.
    pub(crate) max_payload: u64,
}

impl Settings {
    /// The longest frame of each kind that may come on a member's connection: what a
    /// rank sends the hub, or (`from_hub`) what the hub answers (every rank's payload).
    fn limit(&self, world: usize, from_hub: bool) -> impl Fn(u8) -> Option<u64> + use<> {
        let payload = self.max_payload;
        let all = (4 + world as u64 * (4 + payload)).min(u64::from(u32::MAX));
        move |kind| match kind {
            PAYLOAD if !from_hub => Some(payload),
            ALL if from_hub => Some(all),
            FAILURE => Some(MAX_REPORT),
            BYE => Some(0),
            _ => None,
        }
    }
}

fn decode(kind: u8, bytes: Vec<u8>) -> Option<Frame> {
    Some(match kind {
        PAYLOAD => Frame::Payload(bytes),
        ALL => Frame::All(decode_all(&bytes)?),
        FAILURE => Frame::Failure(serde_json::from_slice(&bytes).ok()?),
        BYE => Frame::Bye,
        _ => return None,
    })
}

struct State {
    failure: Option<DistError>,
    /// Peers that said goodbye.
    gone: Vec<bool>,
    /// This rank is leaving: connections closing are expected.
    closing: bool,
}

struct Shared {
    rank: usize,
    world: usize,
    settings: Settings,
    /// Writers by peer rank: the hub has one per other rank, the others only `[0]`.
    peers: Vec<Option<Mutex<TcpStream>>>,
    state: Mutex<State>,
    hooks: Mutex<Vec<FailureHook>>,
    events: Sender<Event>,
}

/// This process's rank of a group whose ranks are processes.
pub(crate) struct TcpMeeting {
    shared: Arc<Shared>,
    events: Mutex<Receiver<Event>>,
}

impl TcpMeeting {
    /// Joins the group: rank 0 listens on `address` and waits for every other rank;
    /// the others connect to it, retrying until the timeout. An address other machines
    /// can reach needs a secret.
    pub(crate) fn connect(
        address: impl ToSocketAddrs,
        rank: usize,
        world: usize,
        settings: Settings,
    ) -> Result<Self, DistError> {
        if rank >= world {
            return Err(DistError::InvalidUse(GroupMisuse::RankOutOfRange {
                rank,
                world,
            }));
        }
        let step = if rank == 0 {
            LinkStep::Listen
        } else {
            LinkStep::Connect
        };
        let addresses: Vec<SocketAddr> = address
            .to_socket_addrs()
            .map_err(|e| DistError::link(step, e))?
            .collect();
        secret::check_needed(&addresses, settings.secret.as_ref())?;
        let deadline = Instant::now() + settings.timeout;
        let streams = if rank == 0 {
            let listener = TcpListener::bind(&addresses[..])
                .map_err(|e| DistError::link(LinkStep::Listen, e))?;
            accept_all(listener, world, settings.secret.as_ref(), deadline)?.streams
        } else {
            let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
            let hub = connect_to_hub(&addresses, rank, world, settings.secret.as_ref(), deadline)?;
            streams[0] = Some(hub);
            streams
        };
        let (send, receive) = mpsc::channel();
        let mut readers = Vec::new();
        let mut peers = Vec::with_capacity(world);
        for (peer, stream) in streams.into_iter().enumerate() {
            match stream {
                Some(stream) => {
                    stream
                        .set_nodelay(true)
                        .map_err(|e| DistError::link(LinkStep::Configure, e))?;
                    let reader = stream
                        .try_clone()
                        .map_err(|e| DistError::link(LinkStep::Configure, e))?;
                    readers.push((peer, reader));
                    peers.push(Some(Mutex::new(stream)));
                }
                None => peers.push(None),
            }
        }
        let shared = Arc::new(Shared {
            rank,
            world,
            settings,
            peers,
            state: Mutex::new(State {
                failure: None,
                gone: vec![false; world],
                closing: false,
            }),
            hooks: Mutex::new(Vec::new()),
            events: send,
        });
        for (peer, stream) in readers {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("dist-rank{rank}-peer{peer}"))
                .spawn(move || shared.read_from(peer, stream))
                .map_err(|e| DistError::link(LinkStep::SpawnReader, e))?;
        }
        Ok(Self {
            shared,
            events: Mutex::new(receive),
        })
    }
}

/// What rank 0's wait for its ranks came to.
struct Hub {
    /// Every other rank's connection, by rank.
    streams: Vec<Option<TcpStream>>,
    /// The connections it turned away, in the order it did.
    #[cfg_attr(not(test), allow(dead_code))]
    refused: Vec<Refusal>,
}

/// What rank 0's acceptor hands its wait.
enum Arrival {
    /// A handshake ended: a rank to seat, or why the connection was turned away (logged).
    Shaken(Result<Admitted, Refusal>),
    /// A connection turned away unshaken: too many handshakes at once.
    Busy,
    /// The acceptor could not go on (no nonce from the operating system).
    Failed(DistError),
}

/// Rank 0: waits until every other rank has shaken hands, or the deadline. An acceptor
/// thread takes connections as they come and shakes hands with each on a thread of its
/// own (at most [`MAX_HANDSHAKES`] at once), so no connection can hold up another; one
/// that fails its handshake or names a rank already taken is logged and closed, and
/// rank 0 goes on waiting.
fn accept_all(
    listener: TcpListener,
    world: usize,
    secret: Option<&JobSecret>,
    deadline: Instant,
) -> Result<Hub, DistError> {
    let started = Instant::now();
    let (send, receive) = mpsc::channel();
    let acceptor = Acceptor::start(listener, world, secret.cloned(), deadline, send)?;
    let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut refused = Vec::new();
    while streams.iter().skip(1).any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        let arrival = match receive.recv_timeout(left) {
            Ok(arrival) => arrival,
            Err(_) => {
                let missing = (1..world).filter(|r| streams[*r].is_none()).collect();
                return Err(DistError::Timeout {
                    rank: 0,
                    missing,
                    waited_ms: started.elapsed().as_millis() as u64,
                    timeout_ms: deadline.saturating_duration_since(started).as_millis() as u64,
                });
            }
        };
        let admitted = match arrival {
            Arrival::Shaken(Ok(admitted)) => admitted,
            // Logged where it happened.
            Arrival::Shaken(Err(refusal)) => {
                refused.push(refusal);
                continue;
            }
            Arrival::Busy => {
                refused.push(Refusal::Busy);
                continue;
            }
            Arrival::Failed(error) => return Err(error),
        };
        let peer = admitted.stream.peer_addr().ok();
        let refusal = match &mut streams[admitted.rank] {
            Some(_) => Refusal::RankTaken {
                rank: admitted.rank,
            },
            slot @ None => match admitted.welcome() {
                Ok(()) => {
                    *slot = Some(admitted.stream);
                    continue;
                }
                Err(_) => Refusal::Closed,
            },
        };
        handshake::refuse(&admitted.stream, &refusal);
        log_refusal(&refusal, peer);
        refused.push(refusal);
    }
    drop(acceptor);
    Ok(Hub { streams, refused })
}

/// Rank 0's acceptor thread; dropping it stops the thread (woken by a connection of
/// its own) and closes the listener.
struct Acceptor {
    stop: Arc<std::sync::atomic::AtomicBool>,
    wake: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Acceptor {
    fn start(
        listener: TcpListener,
        world: usize,
        secret: Option<JobSecret>,
        deadline: Instant,
        arrivals: Sender<Arrival>,
    ) -> Result<Self, DistError> {
        let mut wake = listener
            .local_addr()
            .map_err(|e| DistError::link(LinkStep::Listen, e))?;
        if wake.ip().is_unspecified() {
            let loopback: std::net::IpAddr = match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            };
            wake.set_ip(loopback);
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dist-accept".into())
            .spawn(move || {
                let shaking = Arc::new(AtomicUsize::new(0));
                for stream in listener.incoming() {
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(stream) = stream else {
                        // A connection reset before it was taken, or the process out of
                        // descriptors for a moment: the wait goes on, without spinning.
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    let arrival =
                        shake_hands(stream, world, &secret, deadline, &shaking, &arrivals);
                    if let Some(arrival) = arrival {
                        let failed = matches!(arrival, Arrival::Failed(_));
                        if arrivals.send(arrival).is_err() || failed {
                            return;
                        }
                    }
                }
            })
            .map_err(|e| DistError::link(LinkStep::SpawnReader, e))?;
        Ok(Self {
            stop,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the blocked accept; if even that fails, the thread ends at the next
        // connection instead of being waited for.
        if TcpStream::connect_timeout(&self.wake, Duration::from_secs(1)).is_ok()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

/// Starts the handshake of one accepted connection on a thread of its own, which sends
/// its outcome; or says why not at once.
fn shake_hands(
    stream: TcpStream,
    world: usize,
    secret: &Option<JobSecret>,
    deadline: Instant,
    shaking: &Arc<AtomicUsize>,
    arrivals: &Sender<Arrival>,
) -> Option<Arrival> {
    let peer = stream.peer_addr().ok();
    if shaking.load(Ordering::Acquire) >= MAX_HANDSHAKES {
        log_refusal(&Refusal::Busy, peer);
        return Some(Arrival::Busy);
    }
    let hub_nonce = match handshake::nonce() {
        Ok(nonce) => nonce,
        Err(error) => return Some(Arrival::Failed(error)),
    };
    let until = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
    let (arrivals, counter, secret) = (arrivals.clone(), shaking.clone(), secret.clone());
    shaking.fetch_add(1, Ordering::AcqRel);
    let spawned = std::thread::Builder::new()
        .name("dist-handshake".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            let outcome = handshake::admit(stream, secret.as_ref(), world, hub_nonce, until)
                .inspect_err(|refusal| log_refusal(refusal, peer));
            counter.fetch_sub(1, Ordering::AcqRel);
            let _ = arrivals.send(Arrival::Shaken(outcome));
        });
    if let Err(error) = spawned {
        shaking.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%error, "rank 0 could not start a handshake");
    }
    None
}

/// Rank 0's log of a connection it turned away: strangers that do not speak the
/// protocol at `info`, peers that speak it but do not belong (or do not fit) at `warn`.
fn log_refusal(refusal: &Refusal, peer: Option<SocketAddr>) {
    let peer = peer.map_or_else(|| "an unknown address".to_string(), |peer| peer.to_string());
    match refusal {
        Refusal::Malformed | Refusal::Closed | Refusal::Silent | Refusal::Busy => {
            tracing::info!(%refusal, %peer, "rank 0 turned a connection away")
        }
        _ => tracing::warn!(%refusal, %peer, "rank 0 turned a connection away"),
    }
}

/// Another rank: its connection to rank 0, handshake done, retried until `deadline`
/// while rank 0 is not there (or too busy to answer).
fn connect_to_hub(
    addresses: &[SocketAddr],
    rank: usize,
    world: usize,
    secret: Option<&JobSecret>,
    deadline: Instant,
) -> Result<TcpStream, DistError> {
    loop {
        let failed = match connect_by(addresses, deadline) {
            Ok(stream) => {
                let until = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
                match handshake::join(&stream, secret, rank, world, until) {
                    Ok(()) => return Ok(stream),
                    Err(NotJoined::Failed(error)) => return Err(error),
                    Err(NotJoined::Retry) => DistError::link(
                        LinkStep::Handshake,
                        std::io::Error::new(
                            ErrorKind::TimedOut,
                            "rank 0 accepted connections but never finished a handshake",
                        ),
                    ),
                }
            }
            Err(err) => DistError::link(LinkStep::Connect, err),
        };
        if Instant::now() >= deadline {
            return Err(failed);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection to the first of `addresses` that answers, each try bounded by
/// `deadline` (an unreachable host otherwise holds a connect for minutes).
fn connect_by(addresses: &[SocketAddr], deadline: Instant) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(ErrorKind::InvalidInput, "no address to connect to");
    for address in addresses {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        match TcpStream::connect_timeout(address, left) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a frame to `peer`, if connected; a peer that is gone is the readers' news.
    fn send(&self, peer: usize, kind: u8, bytes: &[u8]) {
        if let Some(Some(stream)) = self.peers.get(peer) {
            let mut stream = stream.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = write_frame(&mut *stream, kind, bytes);
        }
    }

    fn send_all(&self, kind: u8, bytes: &[u8]) {
        (0..self.world).for_each(|peer| self.send(peer, kind, bytes));
    }

    /// The reader of `peer`'s connection: events until it closes. A frame of a kind or
    /// length that cannot come on this connection fails the group (`Protocol`).
    fn read_from(&self, peer: usize, mut stream: TcpStream) {
        let limit = self.settings.limit(self.world, self.rank != 0);
        loop {
            let frame = read_frame(&mut stream, &limit).map(|(kind, bytes)| decode(kind, bytes));
            let why = match frame {
                Ok(Some(Frame::Payload(bytes))) => {
                    let _ = self.events.send(Event::Payload(peer, bytes));
                    continue;
                }
                Ok(Some(Frame::All(all))) => {
                    let _ = self.events.send(Event::All(all));
                    continue;
                }
                Ok(Some(Frame::Failure(error))) => {
                    self.fail(error);
                    continue;
                }
                Ok(Some(Frame::Bye)) => {
                    self.state().gone[peer] = true;
                    let _ = self.events.send(Event::Wake);
                    return;
                }
                Err(FrameError::Closed | FrameError::Silent) => {
                    let closing = self.state().closing;
                    if !closing {
                        self.fail(DistError::RankLost { rank: peer });
                    }
                    return;
                }
                Ok(None) | Err(FrameError::Unexpected) => Refusal::Malformed,
                Err(FrameError::Oversized { kind, len, max }) => {
                    Refusal::Oversized { kind, len, max }
                }
            };
            if !self.state().closing {
                self.fail(DistError::Protocol { rank: peer, why });
            }
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }

    /// Fails the group here and tells the peers (the hub passes it on to the others).
    fn fail(&self, error: DistError) -> DistError {
        {
            let mut state = self.state();
            if let Some(failure) = &state.failure {
                return failure.clone();
            }
            state.failure = Some(error.clone());
        }
        if let Ok(bytes) = serde_json::to_vec(&error) {
            self.send_all(FAILURE, &bytes);
        }
        let _ = self.events.send(Event::Wake);
        if error.aborts() {
            tracing::error!(%error, rank = self.rank, "data-parallel group failed; aborting its communicators");
            let hooks =
                std::mem::take(&mut *self.hooks.lock().unwrap_or_else(PoisonError::into_inner));
            for hook in hooks {
                hook(&error);
            }
        } else {
            tracing::warn!(%error, rank = self.rank, "data-parallel group failed");
        }
        error
    }

    /// The failure to report now, if any: the group's, or a rank that left.
    fn check(&self) -> Option<DistError> {
        let state = self.state();
        if let Some(failure) = &state.failure {
            return Some(failure.clone());
        }
        let left = state.gone.iter().position(|gone| *gone)?;
        drop(state);
        Some(self.fail(DistError::RankLeft { rank: left }))
    }
}

impl TcpMeeting {
    fn next_event(&self, deadline: Instant) -> Result<Event, RecvTimeoutError> {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        events.recv_timeout(deadline.saturating_duration_since(Instant::now()))
    }

    fn timed_out(&self, started: Instant, missing: Vec<usize>) -> DistError {
        self.shared.fail(DistError::Timeout {
            rank: self.shared.rank,
            missing,
            waited_ms: started.elapsed().as_millis() as u64,
            timeout_ms: self.shared.settings.timeout.as_millis() as u64,
        })
    }
}

impl Meeting for TcpMeeting {
    fn world(&self) -> usize {
        self.shared.world
    }

    fn timeout(&self) -> Duration {
        self.shared.settings.timeout
    }

    fn all_gather(&self, rank: usize, payload: Vec<u8>) -> Result<Arc<Vec<Vec<u8>>>, DistError> {
        let shared = &self.shared;
        if rank != shared.rank {
            return Err(DistError::InvalidUse(GroupMisuse::WrongProcess {
                rank,
                process_rank: shared.rank,
            }));
        }
        if let Some(error) = shared.check() {
            return Err(error);
        }
        let max = shared.settings.max_payload;
        if payload.len() as u64 > max {
            let len = payload.len();
            return Err(
                shared.fail(DistError::InvalidUse(GroupMisuse::PayloadTooLarge {
                    len,
                    max,
                })),
            );
        }
        let started = Instant::now();
        let deadline = started + shared.settings.timeout;
        if rank != 0 {
            shared.send(0, PAYLOAD, &payload);
            loop {
                match self.next_event(deadline) {
                    Ok(Event::All(all)) if all.len() == shared.world => return Ok(Arc::new(all)),
                    Ok(Event::All(all)) => {
                        let error = DistError::Mismatch(Disagreement::RoundSize {
                            given: all.len(),
                            world: shared.world,
                        });
                        return Err(shared.fail(error));
                    }
                    Ok(_) => {
                        if let Some(error) = shared.check() {
                            return Err(error);
                        }
                    }
                    Err(_) => return Err(self.timed_out(started, vec![0])),
                }
            }
        }
        let mut given: Vec<Option<Vec<u8>>> = (0..shared.world).map(|_| None).collect();
        given[0] = Some(payload);
        while given.iter().any(Option::is_none) {
            match self.next_event(deadline) {
                Ok(Event::Payload(peer, bytes)) if given[peer].is_none() => {
                    given[peer] = Some(bytes)
                }
                Ok(Event::Payload(peer, _)) => {
                    let error = DistError::InvalidUse(GroupMisuse::TwoPayloads { rank: peer });
                    return Err(shared.fail(error));
                }
                Ok(_) => {
                    if let Some(error) = shared.check() {
                        return Err(error);
                    }
                }
                Err(_) => {
                    let missing = (0..shared.world).filter(|r| given[*r].is_none()).collect();
                    return Err(self.timed_out(started, missing));
                }
            }
        }
        let all: Vec<Vec<u8>> = given.into_iter().map(Option::unwrap_or_default).collect();
        let answer = encode_all(&all);
        if u32::try_from(answer.len()).is_err() {
            let error = GroupMisuse::PayloadTooLarge {
                len: answer.len(),
                max: u64::from(u32::MAX),
            };
            return Err(shared.fail(DistError::InvalidUse(error)));
        }
        shared.send_all(ALL, &answer);
        Ok(Arc::new(all))
    }

    fn fail(&self, error: DistError) -> DistError {
        self.shared.fail(error)
    }

    fn failure(&self) -> Option<DistError> {
        self.shared.state().failure.clone()
    }

    fn leave(&self, rank: usize, lost: bool) {
        if lost {
            self.shared.fail(DistError::RankLost { rank });
        }
        self.shared.state().closing = true;
        if !lost {
            self.shared.send_all(BYE, &[]);
        }
        // Only this side is closed: what peers still send is read (and dropped) by the
        // readers until they close theirs, so that nothing unread resets a connection
        // before a peer has read this rank's goodbye.
        for stream in self.shared.peers.iter().flatten() {
            let stream = stream.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = stream.shutdown(Shutdown::Write);
        }
    }

    fn on_failure(&self, hook: FailureHook) {
        let failure = {
            let state = self.shared.state();
            let mut hooks = self
                .shared
                .hooks
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &state.failure {
                Some(failure) if failure.aborts() => failure.clone(),
                _ => {
                    hooks.push(hook);
                    return;
                }
            }
        };
        hook(&failure);
    }
}

#[cfg(test)]
#[path = "tcp_strangers.rs"]
mod strangers;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cause::Cause;
    use crate::parallel::CollectiveFailure;

    /// A port nothing listens on now.
    pub(super) fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// The secret the tests' groups share.
    pub(super) fn secret() -> JobSecret {
        JobSecret::new("the tests' job secret, 32 bytes.").unwrap()
    }

    /// A group's settings with the tests' secret.
    pub(super) fn settings(timeout: Duration) -> Settings {
        Settings {
            timeout,
            secret: Some(secret()),
            max_payload: 1 << 20,
        }
    }

    /// Ranks on threads, over loopback.
    fn meetings(world: usize, timeout: Duration) -> Vec<TcpMeeting> {
        let port = free_port();
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                std::thread::spawn(move || {
                    TcpMeeting::connect(("127.0.0.1", port), rank, world, settings(timeout))
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Rank 0 on an address already taken: the link's failure says where it was, and
    /// keeps the operating system's error as its source, whole in this process and as
    /// text once it crosses to another rank.
    #[test]
    fn a_taken_address_is_a_link_failure_with_the_os_error_as_source() {
        use std::error::Error as _;

        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap();
        let Err(error) = TcpMeeting::connect(address, 0, 2, settings(Duration::from_secs(1)))
        else {
            panic!("rank 0 listened on a taken address");
        };
        let DistError::Collective(CollectiveFailure::Link(LinkStep::Listen, cause)) = &error else {
            panic!("{error:?}");
        };
        let io = cause
            .downcast_ref::<std::io::Error>()
            .expect("the OS error");
        assert_eq!(io.kind(), ErrorKind::AddrInUse);
        let failure = error.source().expect("the collective's failure");
        assert_eq!(
            failure.to_string(),
            format!("the group's TCP link failed while listening: {io}")
        );
        assert_eq!(
            failure.source().map(ToString::to_string),
            Some(io.to_string())
        );
        let json = serde_json::to_vec(&error).unwrap();
        let crossed: DistError = serde_json::from_slice(&json).unwrap();
        assert_eq!(crossed, error, "the same failure, read the same");
    }

    #[test]
    fn a_rank_beyond_the_world_is_refused_before_connecting() {
        let Err(error) = TcpMeeting::connect(
            ("127.0.0.1", free_port()),
            2,
            2,
            settings(Duration::from_secs(1)),
        ) else {
            panic!("rank 2 of 2 joined");
        };
        assert_eq!(
            error,
            DistError::InvalidUse(GroupMisuse::RankOutOfRange { rank: 2, world: 2 })
        );
        assert!(!error.aborts());
    }

    #[test]
    fn ranks_gather_over_tcp_round_after_round() {
        let meetings = meetings(3, Duration::from_secs(20));
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = meetings
                .iter()
                .enumerate()
                .map(|(rank, meeting)| {
                    scope.spawn(move || {
                        (0..30u8)
                            .map(|round| meeting.all_gather(rank, vec![rank as u8, round]).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for rank_view in results {
            for (round, all) in rank_view.iter().enumerate() {
                let want: Vec<Vec<u8>> = (0..3).map(|r| vec![r as u8, round as u8]).collect();
                assert_eq!(all.as_ref(), &want);
            }
        }
    }

    #[test]
    fn a_closed_connection_is_a_lost_rank_on_every_other_rank() {
        let mut meetings = meetings(3, Duration::from_secs(20));
        let two = meetings.pop().unwrap();
        // Rank 2's process dies: its sockets close with no goodbye.
        for stream in two.shared.peers.iter().flatten() {
            let _ = stream.lock().unwrap().shutdown(Shutdown::Both);
        }
        for (rank, meeting) in meetings.iter().enumerate() {
            let started = Instant::now();
            let error = meeting.all_gather(rank, vec![]).unwrap_err();
            assert_eq!(error, DistError::RankLost { rank: 2 }, "rank {rank}");
            assert!(started.elapsed() < Duration::from_secs(5));
        }
    }

    #[test]
    fn a_goodbye_is_a_rank_that_left_without_aborting() {
        let meetings = meetings(2, Duration::from_secs(20));
        meetings[1].leave(1, false);
        let error = meetings[0].all_gather(0, vec![]).unwrap_err();
        assert_eq!(error, DistError::RankLeft { rank: 1 });
        assert!(!error.aborts());
    }

    #[test]
    fn a_failure_reaches_the_other_ranks_through_the_hub() {
        let meetings = meetings(3, Duration::from_secs(20));
        let failed = DistError::RankFailed {
            rank: 2,
            cause: Cause::new(std::io::Error::other("test")),
        };
        meetings[2].fail(failed.clone());
        for (rank, meeting) in meetings.iter().enumerate().take(2) {
            assert_eq!(meeting.all_gather(rank, vec![]).unwrap_err(), failed);
        }
    }

    #[test]
    fn a_silent_rank_times_out() {
        let meetings = meetings(2, Duration::from_millis(300));
        let error = meetings[0].all_gather(0, vec![]).unwrap_err();
        assert!(
            matches!(error, DistError::Timeout { rank: 0, ref missing, .. } if missing == &[1]),
            "{error:?}"
        );
    }
}
