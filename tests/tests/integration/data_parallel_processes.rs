//! Data-parallel ranks that are processes (`DataParallel::connect`, over TCP on
//! loopback, with a job secret from the environment), on the CPU: they train as ranks on
//! threads do, bit for bit, even with strangers connecting to rank 0 before and between
//! them (each turned away with its reason, rank 0's memory no bigger for them); and
//! killing one rank's process (SIGKILL, mid-training) is a typed error on the others at
//! once.
//!
//! Each rank is this test binary run again with only `rank_process` (ignored, so it runs
//! only when started here), told what to do through the environment; it prints one JSON
//! line per step and one at the end.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn_graph_capture::parallel::Refusal;
use burn_graph_capture::{
    DataParallel, DataParallelConfig, DistError, GraphTrainer, GraphTrainerConfig, JobSecret,
};
use lstm_example::train::parameter_bits;
use lstm_example::{Batch, SineTask};
use serde_json::{Value, json};

use crate::common::{B, adam, loss, model, model_bytes};

const BATCH: usize = 4;
const TIME: usize = 6;
/// The job secret every rank process reads from `BURN_GRAPH_CAPTURE_SECRET`.
const SECRET: &str = "the processes' job secret, 32 by";

/// Rank `rank`'s share of step `step`'s combined batch.
fn shard(step: usize, rank: usize, world: usize) -> Batch<B> {
    let device = Default::default();
    let combined = SineTask::new(step as u64, 32).next_batch::<B>(world * BATCH, TIME, &device);
    let rows = rank * BATCH..(rank + 1) * BATCH;
    Batch {
        x: combined.x.slice([rows.clone(), 0..TIME]),
        y: combined.y.slice([rows, 0..TIME]),
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set by the parent test"))
}

/// One rank, when this binary is started by the tests below (else it does nothing).
#[test]
#[ignore = "a rank process, started by the other tests of this file"]
fn rank_process() {
    let _rng = crate::common::rng::exclusive();
    if std::env::var_os("DDP_RANK").is_none() {
        return;
    }
    // The harness writes this test's name without a line break: the JSON starts below.
    println!();
    let rank: usize = env("DDP_RANK").parse().unwrap();
    let world: usize = env("DDP_WORLD").parse().unwrap();
    let steps: usize = env("DDP_STEPS").parse().unwrap();
    let config = DataParallelConfig::new().with_timeout_secs(240.0);
    let peak_before = peak_resident_kib();
    let member = DataParallel::connect(env("DDP_ADDRESS"), rank, world, &config).unwrap();
    println!(
        "{}",
        json!({"rank": rank, "joined": true, "peak_kib_before": peak_before,
               "peak_kib_after": peak_resident_kib()})
    );
    // Every rank builds its own model; rank 0's is broadcast.
    let bytes = seeded_model_bytes();
    let mut trainer = GraphTrainer::data_parallel(
        model(&bytes),
        adam(),
        loss,
        GraphTrainerConfig::new(),
        member,
    )
    .unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        match trainer.step(shard(step, rank, world)) {
            Ok(outcome) => {
                let loss: f32 = outcome.output.into_scalar();
                losses.push(loss.to_bits());
                println!("{}", json!({"rank": rank, "step": step}));
            }
            Err(error) => {
                println!(
                    "{}",
                    json!({"rank": rank, "step": step, "error": format!("{error:?}")})
                );
                return;
            }
        }
    }
    let bits = parameter_bits(trainer.model().unwrap());
    println!(
        "{}",
        json!({"rank": rank, "done": true, "losses": losses, "bits": bits})
    );
}

/// This process's peak resident memory so far (`VmHWM`), in KiB.
fn peak_resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The same weights in every process: drawn from a seeded generator (Flex's, which is
/// process-wide: the calling test holds `common::rng` exclusively).
fn seeded_model_bytes() -> Vec<u8> {
    Flex::seed(&Default::default(), 7);
    model_bytes()
}

/// Starts rank `rank` of `world` as a process of this binary, which runs `rank_process`
/// alone: its test path, without the crate's name (`data_parallel_processes::rank_process`).
fn spawn_rank(rank: usize, world: usize, address: &str, steps: usize) -> Child {
    let module = module_path!().split_once("::").map_or("", |(_, path)| path);
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            &format!("{module}::rank_process"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DDP_RANK", rank.to_string())
        .env("DDP_WORLD", world.to_string())
        .env("DDP_ADDRESS", address)
        .env("DDP_STEPS", steps.to_string())
        .env(burn_graph_capture::parallel::SECRET_ENV, SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn free_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// Every JSON line a rank printed, sent as it is printed: (rank, line, when).
fn follow(mut child: Child, rank: usize, lines: mpsc::Sender<(usize, Value, Instant)>) -> Child {
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(value) = serde_json::from_str::<Value>(&line) {
                let _ = lines.send((rank, value, Instant::now()));
            }
        }
    });
    child
}

/// Connections that are not ranks of the job, sent to rank 0 at `address` before its
/// first rank: the wrong secret and none (through `connect`: each turned away with its
/// reason), a hello announcing 4 GiB followed by 64 MiB, an answer counting more than
/// it holds, a silent connection (returned, kept open), and 10,000 random byte strings.
fn strangers_before(address: &str) -> std::net::TcpStream {
    use std::io::Write;
    use std::net::{Shutdown, TcpStream};

    let connect = |config: &DataParallelConfig| {
        let config = config.clone().with_timeout_secs(20.0);
        DataParallel::connect(address, 1, 3, &config).map(drop)
    };
    let other = JobSecret::new("another job's secret, long enough").unwrap();
    let with_other = DataParallelConfig::new().with_secret(other);
    assert_eq!(
        connect(&with_other),
        Err(DistError::Refused(Refusal::BadProof))
    );
    assert_eq!(
        connect(&DataParallelConfig::new()),
        Err(DistError::Refused(Refusal::NoSecret))
    );
    let send = |bytes: &[u8]| {
        let mut stream = TcpStream::connect(address).unwrap();
        let _ = stream.write_all(bytes);
        let _ = stream.shutdown(Shutdown::Write);
    };
    let mut huge = vec![5, 0xff, 0xff, 0xff, 0xff];
    huge.resize(5 + (64 << 20), 0);
    send(&huge);
    send(&[2, 4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    let silent = TcpStream::connect(address).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..2u64 {
            scope.spawn(move || {
                let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(thread);
                for _ in 0..10_000 / 2 {
                    let len = rand::RngExt::random_range(&mut rng, 0..64);
                    let bytes: Vec<u8> = (0..len).map(|_| rand::RngExt::random(&mut rng)).collect();
                    send(&bytes);
                }
            });
        }
    });
    silent
}

/// Ranks of the job that do not fit, sent once rank 1 is in: rank 1 again, and a rank
/// of a group of 4.
fn strangers_between(address: &str) {
    let secret = JobSecret::new(SECRET).unwrap();
    let config = DataParallelConfig::new()
        .with_secret(secret)
        .with_timeout_secs(20.0);
    let connect = |rank, world| DataParallel::connect(address, rank, world, &config).map(drop);
    assert_eq!(
        connect(1, 3),
        Err(DistError::Refused(Refusal::RankTaken { rank: 1 }))
    );
    assert_eq!(
        connect(2, 4),
        Err(DistError::Refused(Refusal::WorldSize {
            rank: 2,
            theirs: 4,
            ours: 3
        }))
    );
}

/// Waits until something listens at `address`.
fn wait_listening(address: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::net::TcpStream::connect(address).is_err() {
        assert!(Instant::now() < deadline, "rank 0 never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn rank_processes_train_as_ranks_on_threads_do_among_strangers() {
    let _rng = crate::common::rng::exclusive();
    const STEPS: usize = 12;
    let (world, address) = (3, free_address());
    let (send, receive) = mpsc::channel();
    let mut children = vec![follow(
        spawn_rank(0, world, &address, STEPS),
        0,
        send.clone(),
    )];
    wait_listening(&address);
    let _silent = strangers_before(&address);
    children.push(follow(
        spawn_rank(1, world, &address, STEPS),
        1,
        send.clone(),
    ));
    let mut lines = Vec::new();
    loop {
        let (rank, line, when) = receive
            .recv_timeout(Duration::from_secs(120))
            .expect("rank 1 joins");
        let joined = rank == 1 && line.get("joined").is_some();
        lines.push((rank, line, when));
        if joined {
            break;
        }
    }
    strangers_between(&address);
    children.push(follow(
        spawn_rank(2, world, &address, STEPS),
        2,
        send.clone(),
    ));
    drop(send);
    let mut done = vec![None; world];
    let mut peak = None;
    for (rank, line, _) in lines.into_iter().chain(receive.iter()) {
        assert!(line.get("error").is_none(), "rank {rank}: {line}");
        if line.get("done").is_some() {
            done[rank] = Some(line);
        } else if rank == 0 && line.get("joined").is_some() {
            let kib = |key: &str| line[key].as_u64().unwrap();
            peak = Some((kib("peak_kib_before"), kib("peak_kib_after")));
        }
    }
    let (before, after) = peak.expect("rank 0 joined");
    println!("rank 0's peak resident memory: {before} KiB before the group, {after} KiB after");
    assert!(
        after.saturating_sub(before) < 32 * 1024,
        "rank 0 grew by {} KiB among strangers",
        after - before
    );
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
    let done: Vec<Value> = done
        .into_iter()
        .map(|d| d.expect("a rank finished"))
        .collect();
    for rank in 1..world {
        assert_eq!(
            done[0]["bits"], done[rank]["bits"],
            "the processes' parameters differ"
        );
    }

    // The same training with ranks on threads.
    let group = DataParallel::new(world, &DataParallelConfig::new()).unwrap();
    let bytes = seeded_model_bytes();
    let threads: Vec<(Vec<u32>, Vec<Vec<u32>>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = group
            .members()
            .unwrap()
            .into_iter()
            .map(|member| {
                let bytes = &bytes;
                scope.spawn(move || {
                    let rank = member.rank();
                    let mut trainer = GraphTrainer::data_parallel(
                        model(bytes),
                        adam(),
                        loss,
                        GraphTrainerConfig::new(),
                        member,
                    )
                    .unwrap();
                    let losses = (0..STEPS)
                        .map(|step| {
                            let outcome = trainer.step(shard(step, rank, world)).unwrap();
                            outcome.output.into_scalar().to_bits()
                        })
                        .collect();
                    (losses, parameter_bits(trainer.model().unwrap()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (losses, bits)) in threads.iter().enumerate() {
        assert_eq!(done[rank]["losses"], json!(losses), "rank {rank}'s losses");
        assert_eq!(done[rank]["bits"], json!(bits), "rank {rank}'s parameters");
    }
}

#[test]
fn killing_a_rank_process_is_a_typed_error_on_the_others_at_once() {
    let _rng = crate::common::rng::shared();
    let (world, address) = (3, free_address());
    let (send, receive) = mpsc::channel();
    let mut children: Vec<Child> = (0..world)
        .map(|rank| {
            follow(
                spawn_rank(rank, world, &address, 100_000),
                rank,
                send.clone(),
            )
        })
        .collect();
    drop(send);
    // Rank 1 is killed mid-training, once it has stepped 20 times.
    let mut killed_at = None;
    let mut errors = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    while errors.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rank, line, when) = receive
            .recv_timeout(left)
            .expect("the survivors report in time");
        if rank == 1 && line["step"] == json!(20) && killed_at.is_none() {
            children[1].kill().unwrap();
            killed_at = Some(Instant::now());
        }
        if let Some(error) = line.get("error") {
            errors.push((rank, error.as_str().unwrap().to_string(), when));
        }
    }
    let killed_at = killed_at.expect("rank 1 was killed");
    for (rank, error, when) in &errors {
        let after = when.saturating_duration_since(killed_at);
        println!("rank {rank}, {after:?} after the kill: {error}");
        assert_ne!(*rank, 1);
        assert!(
            error.contains("RankLost { rank: 1 }"),
            "rank {rank}: {error}"
        );
        assert!(
            after < Duration::from_secs(30),
            "rank {rank} noticed after {after:?}"
        );
    }
    for (rank, child) in children.iter_mut().enumerate() {
        let status = child.wait().unwrap();
        if rank != 1 {
            assert!(status.success(), "rank {rank} exited with {status}");
        }
    }
}
