//! Rank 0 among strangers: connections that do not belong to the job (a wrong secret,
//! none, a replayed handshake, frames that announce 4 GiB or hold less than they count,
//! random bytes, silence) and ranks that do not fit (a rank taken, another world size)
//! are each turned away with their reason, before and between the real ranks, and the
//! group still forms, without waiting for the silent one. A rank never talks to a hub
//! that cannot prove the secret, and a member that breaks the protocol fails the group.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::tests::{free_port, secret, settings};
use super::*;
use crate::parallel::frame::{ALL, CHALLENGE, HELLO, REFUSED, read_frame};
use crate::parallel::handshake::{forged_welcome, recorded_rank_frames};

/// Rank 0 of a group of `world` waiting on loopback, and its address.
fn hub(
    world: usize,
    secret: Option<JobSecret>,
) -> (SocketAddr, JoinHandle<Result<Hub, DistError>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let hub = std::thread::spawn(move || accept_all(listener, world, secret.as_ref(), deadline));
    (address, hub)
}

/// A rank's connection to rank 0 through the handshake.
fn rank(
    address: SocketAddr,
    rank: usize,
    world: usize,
    secret: Option<&JobSecret>,
) -> Result<TcpStream, DistError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    connect_to_hub(&[address], rank, world, secret, deadline)
}

/// Sends `bytes` on a fresh connection and closes its sending side.
fn stranger(address: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    // Rank 0 may close first (it refuses oversized frames unread).
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(Shutdown::Write);
    stream
}

fn frame(kind: u8, len: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

#[test]
fn strangers_before_and_between_the_ranks_are_turned_away_and_the_group_forms() {
    let (address, hub) = hub(3, Some(secret()));
    let other = JobSecret::new("another job's secret, long enough").unwrap();
    let refused = |result: Result<TcpStream, DistError>| match result {
        Err(DistError::Refused(refusal)) => refusal,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refused(rank(address, 1, 3, Some(&other))),
        Refusal::BadProof
    );
    assert_eq!(refused(rank(address, 1, 3, None)), Refusal::NoSecret);

    // A real rank's frames recorded from an earlier handshake, sent again: the proof
    // covers that handshake's hub nonce, not this one's.
    let recorded = recorded_rank_frames(Some(&secret()), 1, 3, [3; 32], [4; 32]);
    let mut replay = stranger(address, &recorded);
    let any = |_| Some(1024);
    assert_eq!(read_frame(&mut replay, any).unwrap().0, CHALLENGE);
    let (kind, reason) = read_frame(&mut replay, any).unwrap();
    assert_eq!(kind, REFUSED);
    assert_eq!(
        serde_json::from_slice::<Refusal>(&reason).unwrap(),
        Refusal::BadProof
    );

    // A hello announcing 4 GiB, followed by 8 MiB it never reads.
    let _huge = stranger(address, &frame(HELLO, u32::MAX, &vec![0; 8 << 20]));
    // An answer whose count exceeds its bytes (and is no frame a hello can be).
    let _counted = stranger(address, &frame(ALL, 4, &[0xff; 4]));
    let _silent = TcpStream::connect(address).unwrap();
    let mut generator = StdRng::seed_from_u64(5);
    let _random: Vec<TcpStream> = (0..300)
        .map(|_| {
            let len = generator.random_range(0..80);
            let bytes: Vec<u8> = (0..len).map(|_| generator.random()).collect();
            stranger(address, &bytes)
        })
        .collect();

    let one = rank(address, 1, 3, Some(&secret())).expect("rank 1 joins");
    assert_eq!(
        refused(rank(address, 1, 3, Some(&secret()))),
        Refusal::RankTaken { rank: 1 }
    );
    assert_eq!(
        refused(rank(address, 2, 4, Some(&secret()))),
        Refusal::WorldSize {
            rank: 2,
            theirs: 4,
            ours: 3
        }
    );
    let two = rank(address, 2, 3, Some(&secret())).expect("rank 2 joins");
    let joined = Instant::now();
    let hub = hub.join().unwrap().expect("the group forms");
    assert!(
        joined.elapsed() < Duration::from_secs(2),
        "rank 0 waited {:?} after its last rank (for the silent connection?)",
        joined.elapsed()
    );
    let peer = |stream: &Option<TcpStream>| stream.as_ref().map(|s| s.peer_addr().unwrap());
    assert_eq!(peer(&hub.streams[1]), Some(one.local_addr().unwrap()));
    assert_eq!(peer(&hub.streams[2]), Some(two.local_addr().unwrap()));
    let count = |want: &dyn Fn(&Refusal) -> bool| hub.refused.iter().filter(|r| want(r)).count();
    assert_eq!(count(&|r| *r == Refusal::BadProof), 2, "{:?}", hub.refused);
    assert_eq!(count(&|r| *r == Refusal::NoSecret), 1);
    assert_eq!(count(&|r| *r == Refusal::RankTaken { rank: 1 }), 1);
    assert_eq!(count(&|r| matches!(r, Refusal::WorldSize { .. })), 1);
    assert_eq!(
        count(
            &|r| matches!(r, Refusal::Oversized { kind: HELLO, len, max: 37 } if *len == u64::from(u32::MAX))
        ),
        1
    );
    assert!(
        count(&|r| *r == Refusal::Malformed) >= 1,
        "{:?}",
        hub.refused
    );
}

#[test]
fn a_rank_sends_nothing_to_a_hub_that_cannot_prove_the_secret() {
    let impostor = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = impostor.local_addr().unwrap();
    let listened = std::thread::spawn(move || {
        let (mut stream, _) = impostor.accept().unwrap();
        forged_welcome(&stream).unwrap();
        let mut after = Vec::new();
        let _ = stream.read_to_end(&mut after);
        after
    });
    let error = rank(address, 1, 2, Some(&secret())).unwrap_err();
    assert_eq!(error, DistError::HubUnproven(Refusal::BadProof));
    assert!(!error.aborts());
    assert!(
        listened.join().unwrap().is_empty(),
        "the rank sent the impostor something after its handshake"
    );
}

#[test]
fn a_network_address_needs_a_secret_and_loopback_does_not() {
    let no_secret = Settings {
        secret: None,
        ..settings(Duration::from_secs(20))
    };
    for (rank, address) in [(0, "0.0.0.0:0"), (1, "10.255.255.1:29500")] {
        let Err(error) = TcpMeeting::connect(address, rank, 2, no_secret.clone()) else {
            panic!("rank {rank} met on {address} without a secret");
        };
        assert_eq!(
            error,
            DistError::InvalidUse(GroupMisuse::SecretNeeded {
                address: address.to_string()
            })
        );
    }
    // On loopback a group may go without; a rank with a secret does not join it.
    let (address, hub) = hub(2, None);
    assert_eq!(
        rank(address, 1, 2, Some(&secret())).unwrap_err(),
        DistError::Refused(Refusal::UnexpectedSecret)
    );
    rank(address, 1, 2, None).expect("loopback without a secret");
    assert!(hub.join().unwrap().is_ok());
}

/// Ranks 0 and 1 of a group whose payloads are at most 1 MiB.
fn pair() -> (TcpMeeting, TcpMeeting) {
    let port = free_port();
    let one = std::thread::spawn(move || {
        TcpMeeting::connect(("127.0.0.1", port), 1, 2, settings(Duration::from_secs(20)))
    });
    let zero = TcpMeeting::connect(("127.0.0.1", port), 0, 2, settings(Duration::from_secs(20)));
    (zero.unwrap(), one.join().unwrap().unwrap())
}

#[test]
fn a_member_that_breaks_the_protocol_fails_the_group() {
    let (zero, one) = pair();
    let mut link = one.shared.peers[0].as_ref().unwrap().lock().unwrap();
    link.write_all(&frame(PAYLOAD, 2 << 20, &[])).unwrap();
    drop(link);
    assert_eq!(
        zero.all_gather(0, vec![]).unwrap_err(),
        DistError::Protocol {
            rank: 1,
            why: Refusal::Oversized {
                kind: PAYLOAD,
                len: 2 << 20,
                max: 1 << 20
            }
        }
    );

    let (_zero, one) = pair();
    assert_eq!(
        one.all_gather(1, vec![0; (1 << 20) + 1]).unwrap_err(),
        DistError::InvalidUse(GroupMisuse::PayloadTooLarge {
            len: (1 << 20) + 1,
            max: 1 << 20
        })
    );
}
