//! How a rank and rank 0 prove to each other that they belong to one job, before the
//! rank may name itself or rank 0 may hear a payload.
//!
//! 1. rank → hub `HELLO`: the protocol's magic, whether it has a secret, a fresh nonce;
//! 2. hub → rank `CHALLENGE`: a fresh nonce of its own;
//! 3. rank → hub `JOIN`: its rank, its world size, and HMAC-SHA256 keyed by the secret
//!    over both nonces, the rank and the world size;
//! 4. hub → rank `WELCOME` with its own HMAC over the same (another label), or `REFUSED`
//!    with the reason.
//!
//! The rank proves first, so a stranger who connects to rank 0 learns nothing keyed by
//! the secret; rank 0 proves before the rank sends it anything else. A recorded
//! handshake cannot be replayed: each proof covers the other side's fresh nonce. The
//! secret authenticates the ranks; it does not encrypt what they send afterwards.
//! Without a secret (loopback only, `secret::check_needed`) the same exchange runs with
//! an empty key, which proves nothing but keeps one protocol.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::{DistError, LinkStep, Refusal};
use super::frame::{
    CHALLENGE, FrameError, HELLO, JOIN, MAX_REPORT, REFUSED, Until, WELCOME, read_frame,
    write_frame,
};
use super::secret::JobSecret;

/// The first bytes of every hello: this protocol, version 1.
const MAGIC: [u8; 4] = *b"bgc\x01";
const NONCE: usize = 32;
const PROOF: usize = 32;
const HELLO_LEN: usize = MAGIC.len() + 1 + NONCE;
const JOIN_LEN: usize = 4 + 4 + PROOF;
const RANK_LABEL: &[u8] = b"burn-graph-capture rendezvous: rank";
const HUB_LABEL: &[u8] = b"burn-graph-capture rendezvous: hub";

/// Longest a handshake may take, from either side: a connection that says nothing
/// holds no rank and is dropped after this.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) type Nonce = [u8; NONCE];

/// A fresh nonce from the operating system.
pub(crate) fn nonce() -> Result<Nonce, DistError> {
    let mut nonce = [0u8; NONCE];
    getrandom::fill(&mut nonce)
        .map_err(|error| DistError::link(LinkStep::Nonce, std::io::Error::other(error)))?;
    Ok(nonce)
}

/// What both ends of one handshake prove they can key: the nonces, the rank, the world.
struct Transcript {
    rank_nonce: Nonce,
    hub_nonce: Nonce,
    rank: u32,
    world: u32,
}

impl Transcript {
    fn mac(&self, secret: Option<&JobSecret>, label: &[u8]) -> Hmac<Sha256> {
        let key = secret.map_or(&[][..], JobSecret::bytes);
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(&self.rank_nonce);
        mac.update(&self.hub_nonce);
        mac.update(&self.rank.to_le_bytes());
        mac.update(&self.world.to_le_bytes());
        mac
    }

    fn prove(&self, secret: Option<&JobSecret>, label: &[u8]) -> [u8; PROOF] {
        self.mac(secret, label).finalize().into_bytes().into()
    }

    /// A rank's `JOIN`: its rank, its world size and its proof.
    fn join(&self, secret: Option<&JobSecret>) -> Vec<u8> {
        let mut join = self.rank.to_le_bytes().to_vec();
        join.extend_from_slice(&self.world.to_le_bytes());
        join.extend_from_slice(&self.prove(secret, RANK_LABEL));
        join
    }

    /// Whether `proof` is this transcript's under `label` (compared in constant time).
    fn check(&self, secret: Option<&JobSecret>, label: &[u8], proof: &[u8]) -> bool {
        self.mac(secret, label).verify_slice(proof).is_ok()
    }
}

/// A rank's `HELLO`: the protocol, whether it has a secret, its nonce.
fn hello(secret: Option<&JobSecret>, rank_nonce: &Nonce) -> Vec<u8> {
    let mut hello = MAGIC.to_vec();
    hello.push(u8::from(secret.is_some()));
    hello.extend_from_slice(rank_nonce);
    hello
}

fn refusal_of(error: FrameError) -> Refusal {
    match error {
        FrameError::Closed => Refusal::Closed,
        FrameError::Silent => Refusal::Silent,
        FrameError::Unexpected => Refusal::Malformed,
        FrameError::Oversized { kind, len, max } => Refusal::Oversized { kind, len, max },
    }
}

/// Tells the peer why it is turned away, if it still listens (best effort).
pub(crate) fn refuse(mut stream: &TcpStream, refusal: &Refusal) {
    if let Ok(bytes) = serde_json::to_vec(refusal) {
        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = write_frame(&mut stream, REFUSED, &bytes);
    }
}

/// A connection that proved it knows the secret, named a rank of this group and the
/// group's world size; rank 0 still has to check that its rank is free.
pub(crate) struct Admitted {
    pub(crate) rank: usize,
    pub(crate) stream: TcpStream,
    welcome: [u8; PROOF],
}

impl Admitted {
    /// Lets the rank in: rank 0's proof.
    pub(crate) fn welcome(&self) -> std::io::Result<()> {
        let mut stream = &self.stream;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        write_frame(&mut stream, WELCOME, &self.welcome)?;
        stream.set_write_timeout(None)
    }
}

/// Rank 0's side of one connection's handshake, with `hub_nonce` drawn for it. Every
/// read is bounded in bytes and, through `deadline`, in time.
pub(crate) fn admit(
    stream: TcpStream,
    secret: Option<&JobSecret>,
    world: usize,
    hub_nonce: Nonce,
    deadline: Instant,
) -> Result<Admitted, Refusal> {
    let turn_away = |refusal: Refusal| {
        refuse(&stream, &refusal);
        refusal
    };
    let mut until = Until {
        stream: &stream,
        deadline,
    };
    let exactly = |want: usize| move |_| Some(want as u64);
    let (kind, hello) = read_frame(&mut until, exactly(HELLO_LEN)).map_err(refusal_of)?;
    if kind != HELLO || hello.len() != HELLO_LEN || hello[..MAGIC.len()] != MAGIC {
        return Err(Refusal::Malformed);
    }
    match (hello[MAGIC.len()], secret.is_some()) {
        (0, true) => return Err(turn_away(Refusal::NoSecret)),
        (1, false) => return Err(turn_away(Refusal::UnexpectedSecret)),
        (0 | 1, _) => {}
        _ => return Err(Refusal::Malformed),
    }
    let rank_nonce: Nonce = hello[MAGIC.len() + 1..].try_into().expect("checked length");
    let mut writer = &stream;
    writer
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| write_frame(&mut writer, CHALLENGE, &hub_nonce))
        .map_err(|_| Refusal::Closed)?;
    let (kind, join) = read_frame(&mut until, exactly(JOIN_LEN)).map_err(refusal_of)?;
    if kind != JOIN || join.len() != JOIN_LEN {
        return Err(Refusal::Malformed);
    }
    let word = |at: usize| u32::from_le_bytes(join[at..at + 4].try_into().expect("4 bytes"));
    let transcript = Transcript {
        rank_nonce,
        hub_nonce,
        rank: word(0),
        world: word(4),
    };
    if !transcript.check(secret, RANK_LABEL, &join[8..]) {
        return Err(turn_away(Refusal::BadProof));
    }
    let (rank, theirs) = (transcript.rank as usize, transcript.world as usize);
    if theirs != world {
        return Err(turn_away(Refusal::WorldSize {
            rank,
            theirs,
            ours: world,
        }));
    }
    if rank == 0 || rank >= world {
        return Err(turn_away(Refusal::RankOutOfRange { rank, world }));
    }
    let welcome = transcript.prove(secret, HUB_LABEL);
    stream.set_read_timeout(None).map_err(|_| Refusal::Closed)?;
    Ok(Admitted {
        rank,
        stream,
        welcome,
    })
}

/// How a rank's handshake ended, when it did not end in a welcome.
#[derive(Debug)]
pub(crate) enum NotJoined {
    /// The connection went away before rank 0 answered: try again (rank 0 may be busy,
    /// or not up yet).
    Retry,
    /// A final answer: refused, or rank 0 is not who it should be.
    Failed(DistError),
}

/// A rank's side of the handshake on a fresh connection to rank 0.
pub(crate) fn join(
    stream: &TcpStream,
    secret: Option<&JobSecret>,
    rank: usize,
    world: usize,
    deadline: Instant,
) -> Result<(), NotJoined> {
    let rank_nonce = nonce().map_err(NotJoined::Failed)?;
    let hello = hello(secret, &rank_nonce);
    let mut writer = stream;
    writer
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| write_frame(&mut writer, HELLO, &hello))
        .map_err(|_| NotJoined::Retry)?;
    let mut until = Until { stream, deadline };
    let answer = |expected: u8| {
        move |kind| match kind {
            REFUSED => Some(MAX_REPORT),
            kind if kind == expected => Some(PROOF as u64),
            _ => None,
        }
    };
    let (kind, challenge) = read_answer(&mut until, answer(CHALLENGE))?;
    let hub_nonce: Nonce = fixed(kind, CHALLENGE, &challenge)?;
    let transcript = Transcript {
        rank_nonce,
        hub_nonce,
        rank: rank as u32,
        world: world as u32,
    };
    write_frame(&mut writer, JOIN, &transcript.join(secret)).map_err(|_| NotJoined::Retry)?;
    let (kind, welcome) = read_answer(&mut until, answer(WELCOME))?;
    let welcome: [u8; PROOF] = fixed(kind, WELCOME, &welcome)?;
    if !transcript.check(secret, HUB_LABEL, &welcome) {
        return Err(NotJoined::Failed(DistError::HubUnproven(Refusal::BadProof)));
    }
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None))
        .map_err(|error| NotJoined::Failed(DistError::link(LinkStep::Handshake, error)))
}

/// Rank 0's answer: the frame, its refusal as this rank's error, or a retry when the
/// connection went away first.
fn read_answer(
    until: &mut Until<'_>,
    max: impl Fn(u8) -> Option<u64>,
) -> Result<(u8, Vec<u8>), NotJoined> {
    match read_frame(until, max) {
        Ok((REFUSED, bytes)) => Err(NotJoined::Failed(
            serde_json::from_slice::<Refusal>(&bytes).map_or(
                DistError::HubUnproven(Refusal::Malformed),
                DistError::Refused,
            ),
        )),
        Ok(frame) => Ok(frame),
        Err(FrameError::Closed | FrameError::Silent) => Err(NotJoined::Retry),
        Err(other) => Err(NotJoined::Failed(DistError::HubUnproven(refusal_of(other)))),
    }
}

/// A fixed-size answer of kind `expected`.
fn fixed<const N: usize>(kind: u8, expected: u8, bytes: &[u8]) -> Result<[u8; N], NotJoined> {
    match bytes.try_into() {
        Ok(array) if kind == expected => Ok(array),
        _ => Err(NotJoined::Failed(DistError::HubUnproven(
            Refusal::Malformed,
        ))),
    }
}

/// The frames a rank sends in a handshake, from its first byte: what a test replays.
#[cfg(test)]
pub(crate) fn recorded_rank_frames(
    secret: Option<&JobSecret>,
    rank: usize,
    world: usize,
    rank_nonce: Nonce,
    hub_nonce: Nonce,
) -> Vec<u8> {
    let transcript = Transcript {
        rank_nonce,
        hub_nonce,
        rank: rank as u32,
        world: world as u32,
    };
    let mut frames = Vec::new();
    write_frame(&mut frames, HELLO, &hello(secret, &rank_nonce)).expect("in memory");
    write_frame(&mut frames, JOIN, &transcript.join(secret)).expect("in memory");
    frames
}

/// An impostor's welcome: right shape, no knowledge of the secret.
#[cfg(test)]
pub(crate) fn forged_welcome(mut stream: &TcpStream) -> std::io::Result<()> {
    write_frame(&mut stream, CHALLENGE, &[1; NONCE])?;
    // Read the rank's hello and join before answering, as a hub would.
    let mut frames = [0u8; 5 + HELLO_LEN + 5 + JOIN_LEN];
    std::io::Read::read_exact(&mut stream, &mut frames)?;
    write_frame(&mut stream, WELCOME, &[0; PROOF])?;
    std::io::Write::flush(&mut stream)
}
