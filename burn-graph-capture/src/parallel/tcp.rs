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
//! Frames are a kind byte, a little-endian `u32` length and the bytes.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::error::{CollectiveFailure, Disagreement, DistError, GroupMisuse, LinkStep};
use super::rendezvous::{FailureHook, Meeting};
use crate::cause::Cause;

/// What a frame carries.
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

const PAYLOAD: u8 = 1;
const ALL: u8 = 2;
const FAILURE: u8 = 3;
const BYE: u8 = 4;
const HELLO: u8 = 5;

fn io_err(step: LinkStep, err: std::io::Error) -> DistError {
    DistError::Collective(CollectiveFailure::Link(step, Cause::new(err)))
}

fn write_frame(stream: &mut TcpStream, kind: u8, bytes: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(5 + bytes.len());
    frame.push(kind);
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
    stream.write_all(&frame)
}

fn read_frame(stream: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut bytes = vec![0; len];
    stream.read_exact(&mut bytes)?;
    Ok((head[0], bytes))
}

fn encode_all(all: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = (all.len() as u32).to_le_bytes().to_vec();
    for payload in all {
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(payload);
    }
    bytes
}

fn decode_all(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let word = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let count = word(0)?;
    let mut at = 4;
    let mut all = Vec::with_capacity(count);
    for _ in 0..count {
        let len = word(at)?;
        all.push(bytes.get(at + 4..at + 4 + len)?.to_vec());
        at += 4 + len;
    }
    Some(all)
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
    timeout: Duration,
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
    /// the others connect to it, retrying until `timeout`.
    pub(crate) fn connect(
        address: impl ToSocketAddrs,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Self, DistError> {
        if rank >= world {
            return Err(DistError::InvalidUse(GroupMisuse::RankOutOfRange {
                rank,
                world,
            }));
        }
        let deadline = Instant::now() + timeout;
        let streams = if rank == 0 {
            let listener = TcpListener::bind(address).map_err(|e| io_err(LinkStep::Listen, e))?;
            accept_all(&listener, world, deadline)?
        } else {
            let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
            streams[0] = Some(connect_to_hub(address, rank, world, deadline)?);
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
                        .map_err(|e| io_err(LinkStep::Configure, e))?;
                    let reader = stream
                        .try_clone()
                        .map_err(|e| io_err(LinkStep::Configure, e))?;
                    readers.push((peer, reader));
                    peers.push(Some(Mutex::new(stream)));
                }
                None => peers.push(None),
            }
        }
        let shared = Arc::new(Shared {
            rank,
            world,
            timeout,
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
                .map_err(|e| io_err(LinkStep::SpawnReader, e))?;
        }
        Ok(Self {
            shared,
            events: Mutex::new(receive),
        })
    }
}

/// Rank 0: every other rank's connection, by rank.
fn accept_all(
    listener: &TcpListener,
    world: usize,
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>, DistError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err(LinkStep::Listen, e))?;
    let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    while streams.iter().skip(1).any(Option::is_none) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(|e| io_err(LinkStep::Accept, e))?;
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                stream
                    .set_read_timeout(Some(left))
                    .map_err(|e| io_err(LinkStep::Accept, e))?;
                let (kind, hello) =
                    read_frame(&mut stream).map_err(|e| io_err(LinkStep::ReadHello, e))?;
                stream
                    .set_read_timeout(None)
                    .map_err(|e| io_err(LinkStep::Accept, e))?;
                let (peer, theirs) = parse_hello(kind, &hello)?;
                if theirs != world {
                    return Err(DistError::Mismatch(Disagreement::WorldSize {
                        rank: peer,
                        theirs,
                        ours: world,
                    }));
                }
                match streams.get_mut(peer) {
                    Some(slot @ None) if peer > 0 => *slot = Some(stream),
                    Some(_) => {
                        return Err(DistError::InvalidUse(GroupMisuse::RankTaken { rank: peer }));
                    }
                    None => {
                        return Err(DistError::InvalidUse(GroupMisuse::RankOutOfRange {
                            rank: peer,
                            world,
                        }));
                    }
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = (1..world).filter(|r| streams[*r].is_none()).collect();
                    return Err(DistError::Timeout {
                        rank: 0,
                        missing,
                        waited_ms: 0,
                        timeout_ms: 0,
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(err) => return Err(io_err(LinkStep::Accept, err)),
        }
    }
    Ok(streams)
}

fn parse_hello(kind: u8, hello: &[u8]) -> Result<(usize, usize), DistError> {
    let word = |at: usize| {
        hello
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
    };
    match (kind, word(0), word(4)) {
        (HELLO, Some(rank), Some(world)) => Ok((rank, world)),
        _ => Err(DistError::InvalidUse(GroupMisuse::Stranger)),
    }
}

/// Another rank: its connection to rank 0, retried until `deadline`.
fn connect_to_hub(
    address: impl ToSocketAddrs,
    rank: usize,
    world: usize,
    deadline: Instant,
) -> Result<TcpStream, DistError> {
    loop {
        match TcpStream::connect(&address) {
            Ok(mut stream) => {
                let mut hello = (rank as u32).to_le_bytes().to_vec();
                hello.extend_from_slice(&(world as u32).to_le_bytes());
                write_frame(&mut stream, HELLO, &hello)
                    .map_err(|e| io_err(LinkStep::SayHello, e))?;
                return Ok(stream);
            }
            Err(err) if Instant::now() >= deadline => {
                return Err(io_err(LinkStep::Connect, err));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a frame to `peer`, if connected; a peer that is gone is the readers' news.
    fn send(&self, peer: usize, kind: u8, bytes: &[u8]) {
        if let Some(Some(stream)) = self.peers.get(peer) {
            let mut stream = stream.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = write_frame(&mut stream, kind, bytes);
        }
    }

    fn send_all(&self, kind: u8, bytes: &[u8]) {
        (0..self.world).for_each(|peer| self.send(peer, kind, bytes));
    }

    /// The reader of `peer`'s connection: events until it closes.
    fn read_from(&self, peer: usize, mut stream: TcpStream) {
        loop {
            let frame = read_frame(&mut stream)
                .ok()
                .and_then(|(kind, bytes)| decode(kind, bytes));
            match frame {
                Some(Frame::Payload(bytes)) => {
                    let _ = self.events.send(Event::Payload(peer, bytes));
                }
                Some(Frame::All(all)) => {
                    let _ = self.events.send(Event::All(all));
                }
                Some(Frame::Failure(error)) => {
                    self.fail(error);
                }
                Some(Frame::Bye) => {
                    self.state().gone[peer] = true;
                    let _ = self.events.send(Event::Wake);
                    return;
                }
                None => {
                    let closing = self.state().closing;
                    if !closing {
                        self.fail(DistError::RankLost { rank: peer });
                    }
                    return;
                }
            }
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
            timeout_ms: self.shared.timeout.as_millis() as u64,
        })
    }
}

impl Meeting for TcpMeeting {
    fn world(&self) -> usize {
        self.shared.world
    }

    fn timeout(&self) -> Duration {
        self.shared.timeout
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
        let started = Instant::now();
        let deadline = started + shared.timeout;
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
        shared.send_all(ALL, &encode_all(&all));
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
mod tests {
    use super::*;

    #[test]
    fn all_frames_round_trip() {
        let all = vec![vec![1, 2, 3], vec![], vec![9; 300]];
        assert_eq!(decode_all(&encode_all(&all)), Some(all));
        assert_eq!(decode_all(&[5, 0, 0, 0]), None);
    }

    /// A port nothing listens on now.
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Ranks on threads, over loopback.
    fn meetings(world: usize, timeout: Duration) -> Vec<TcpMeeting> {
        let port = free_port();
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                std::thread::spawn(move || {
                    TcpMeeting::connect(("127.0.0.1", port), rank, world, timeout).unwrap()
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
        let Err(error) = TcpMeeting::connect(address, 0, 2, Duration::from_secs(1)) else {
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

    /// Rank 0 of a group of 2 meets a rank that joins a group of 3, then a connection
    /// that never says hello as a rank: each is its typed error, not a hang.
    #[test]
    fn rank_0_refuses_another_world_size_and_a_stranger() {
        let port = free_port();
        let hub = std::thread::spawn(move || {
            TcpMeeting::connect(("127.0.0.1", port), 0, 2, Duration::from_secs(20))
        });
        let _other = connect_to_hub(
            ("127.0.0.1", port),
            1,
            3,
            Instant::now() + Duration::from_secs(20),
        )
        .unwrap();
        let Err(error) = hub.join().unwrap() else {
            panic!("rank 0 accepted a rank of a group of 3");
        };
        assert_eq!(
            error,
            DistError::Mismatch(Disagreement::WorldSize {
                rank: 1,
                theirs: 3,
                ours: 2
            })
        );

        let port = free_port();
        let hub = std::thread::spawn(move || {
            TcpMeeting::connect(("127.0.0.1", port), 0, 2, Duration::from_secs(20))
        });
        let mut stranger = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(stream) => break stream,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        write_frame(&mut stranger, PAYLOAD, b"GET / HTTP/1.1").unwrap();
        let Err(error) = hub.join().unwrap() else {
            panic!("rank 0 accepted a stranger");
        };
        assert_eq!(error, DistError::InvalidUse(GroupMisuse::Stranger));
    }

    #[test]
    fn a_rank_beyond_the_world_is_refused_before_connecting() {
        let Err(error) =
            TcpMeeting::connect(("127.0.0.1", free_port()), 2, 2, Duration::from_secs(1))
        else {
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
