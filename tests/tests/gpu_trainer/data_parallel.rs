//! Issue 16 on one GPU: NCCL collectives in `CudaGraphRuntime`, recorded into graphs,
//! and a data-parallel trainer of one rank. (Two ranks need two GPUs: two ranks on one
//! device are refused when they join, which a test here checks is a typed error.)
//!
//! - the collectives of one rank give back their inputs bit for bit, in any layout, and
//!   through Burn's own path (`ServerCommunication`, CubeCL's client);
//! - a collective recorded into a graph reads its input anew at every replay;
//! - one rank trains graphed as it trains with capture off, bit for bit (200 steps, an
//!   lr changed every step), and as a plain trainer does;
//! - an aborted group stops its trainer with a typed error, and groups built and
//!   dropped (aborted or not) leave no device memory behind.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_graph_capture::runtime::{CudaGraphRuntime, with_server};
use burn_graph_capture::{
    Captured, DataParallel, DataParallelConfig, DistError, GraphTrainer, GraphTrainerConfig,
    StepError, StepMode,
};
use cubecl_core::Runtime;
use cubecl_core::ir::{ElemType, FloatKind};
use cubecl_core::server::ReduceOperation;
use lstm_example::SineTask;
use lstm_example::train::parameter_values;

use crate::common::{
    D_INPUT, Diff, MEDIUM, SMALL, Sizes, Stack, WARMUP, adam, batch, device, device_bytes,
    expected_replays, loss, lr_at, model, model_bytes, run_length,
};

/// A group of one rank.
fn lone_rank() -> (DataParallel, burn_graph_capture::RankMember) {
    let group = DataParallel::new(1, &DataParallelConfig::new()).expect("group");
    let member = group.member(0).expect("member");
    (group, member)
}

/// Host values of `shape`, different for every `seed`.
fn values(seed: u64, shape: [usize; 2]) -> TensorData {
    let n = shape[0] * shape[1];
    let v: Vec<f32> = (0..n)
        .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    TensorData::new(v, shape)
}

fn floats<G: Stack>(tensor: burn::tensor::ops::FloatTensor<G>) -> Vec<f32> {
    Tensor::<G, 2>::from_primitive(TensorPrimitive::Float(tensor))
        .into_data()
        .to_vec()
        .expect("f32")
}

fn collectives_of_one_rank_return_their_inputs<G: Stack>() {
    let (_group, member) = lone_rank();
    G::join_group(&device(), &member).expect("join");
    let uploads = [values(1, [3, 5]), values(2, [64, 96]), values(3, [1, 7])];
    let tensors: Vec<Tensor<G, 2>> = uploads
        .iter()
        .map(|data| Tensor::from_data(data.clone(), &device()))
        .collect();
    // A transposed view: its values do not lie packed.
    let transposed = Tensor::<G, 2>::from_data(values(4, [6, 4]), &device()).swap_dims(0, 1);
    let mut inputs: Vec<_> = tensors.clone();
    inputs.push(transposed.clone());
    let expected: Vec<Vec<f32>> = inputs
        .iter()
        .map(|t| t.clone().into_data().to_vec().unwrap())
        .collect();
    let primitives = || {
        inputs
            .iter()
            .map(|t| t.clone().into_primitive().tensor())
            .collect::<Vec<_>>()
    };
    let mean = G::all_reduce_mean(primitives(), &member).expect("all-reduce");
    let sent = G::broadcast(primitives(), 0, &member).expect("broadcast");
    for (name, results) in [("mean", mean), ("broadcast", sent)] {
        assert_eq!(results.len(), expected.len());
        for (i, (result, want)) in results.into_iter().zip(&expected).enumerate() {
            let got = floats::<G>(result);
            let diff = Diff::of(&got, want);
            assert!(diff.bit_exact, "{name} of tensor {i}: {}", diff.describe());
        }
    }
}

/// A collective recorded into a graph: every replay reduces what its input holds then.
fn a_recorded_collective_reads_its_input_at_every_replay<G: Stack>() {
    let (_group, member) = lone_rank();
    G::join_group(&device(), &member).expect("join");
    let first = Tensor::<G, 2>::from_data(values(5, [16, 24]), &device());
    let pinned = G::pin(burn_graph_capture::AnyTensor::Float(
        first.into_primitive().tensor(),
    ))
    .expect("pin");
    let burn_graph_capture::AnyTensor::Float(input) = pinned.clone() else {
        unreachable!()
    };
    // Compiles whatever the collective launches (a packing copy) before the window.
    let _ = G::all_reduce_mean(vec![input.clone()], &member).expect("eager all-reduce");
    G::sync(&device()).expect("sync");
    let captured = G::capture(&device(), || {
        G::all_reduce_mean(vec![input.clone()], &member).expect("recorded all-reduce")
    });
    let (recorded, graph) = match captured {
        Captured::Recorded { output, graph } => (output, graph),
        Captured::Refused(error) | Captured::Broken { error, .. } => {
            panic!("the collective was not recorded: {error}")
        }
    };
    let output = recorded.into_iter().next().expect("one output");
    for seed in [6, 7, 8] {
        let next = Tensor::<G, 2>::from_data(values(seed, [16, 24]), &device());
        let next = burn_graph_capture::AnyTensor::Float(next.into_primitive().tensor());
        G::copy_into(&pinned, &next).expect("copy into the pin");
        G::replay(&graph).expect("replay");
        let got = floats::<G>(output.clone());
        let want: Vec<f32> = values(seed, [16, 24]).to_vec().unwrap();
        let diff = Diff::of(&got, &want);
        assert!(
            diff.bit_exact,
            "replay with input {seed}: {}",
            diff.describe()
        );
    }
}

/// Burn's `DistributedBackend` reaches this runtime through CubeCL's client:
/// `all_reduce` then `sync_collective`, on the devices' own communicator.
fn burns_collectives_run_on_this_runtime<G: Stack>() {
    let mut client = CudaGraphRuntime::client(&device());
    let data = values(9, [32, 33]);
    let want: Vec<f32> = data.to_vec().unwrap();
    let handle = client.create_from_slice(bytemuck_bytes(&want));
    let ids = vec![cubecl_core::device::Device::to_id(&device())];
    for op in [ReduceOperation::Mean, ReduceOperation::Sum] {
        client.all_reduce(
            handle.clone(),
            handle.clone(),
            ElemType::Float(FloatKind::F32),
            ids.clone(),
            op,
        );
        client.sync_collective();
    }
    let bytes = client.read_one(handle).expect("read");
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let diff = Diff::of(&got, &want);
    assert!(diff.bit_exact, "{}", diff.describe());
}

fn bytemuck_bytes(values: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// What a run of `steps` steps left: losses, final parameters, modes.
struct RankRun {
    losses: Vec<f32>,
    params: Vec<Vec<f32>>,
    modes: Vec<StepMode>,
}

fn run<G: Stack>(sizes: Sizes, steps: usize, capture: bool, data_parallel: bool) -> RankRun {
    let bytes = model_bytes(sizes);
    let config = GraphTrainerConfig::new().with_capture(capture);
    let step: fn(&crate::common::Model<G>, &crate::common::Batch<G>) -> _ = loss::<G>;
    let (_group, member) = lone_rank();
    let mut trainer = if data_parallel {
        GraphTrainer::data_parallel(model::<G>(sizes, &bytes), adam::<G>(), step, config, member)
            .expect("join")
    } else {
        GraphTrainer::new(model::<G>(sizes, &bytes), adam::<G>(), step, config)
    };
    let mut task = SineTask::new(61, D_INPUT);
    let mut out = RankRun {
        losses: Vec::new(),
        params: Vec::new(),
        modes: Vec::new(),
    };
    for step in 0..steps {
        trainer.set_lr(lr_at(1e-2, step));
        let outcome = trainer.step(batch(&mut task, sizes)).expect("step");
        out.modes.push(outcome.mode);
        out.losses.push(outcome.output.into_scalar().elem());
    }
    out.params = parameter_values(trainer.model().expect("model"));
    out
}

fn one_rank_graphed_equals_capture_off_and_a_plain_trainer<G: Stack>() {
    let steps = run_length(200);
    let graphed = run::<G>(MEDIUM, steps, true, true);
    let replays = graphed
        .modes
        .iter()
        .filter(|m| **m == StepMode::Replayed)
        .count();
    assert_eq!(
        graphed.modes[WARMUP],
        StepMode::Captured,
        "{:?}",
        graphed.modes
    );
    assert_eq!(replays, expected_replays(steps), "{:?}", graphed.modes);
    let eager = run::<G>(MEDIUM, steps, false, true);
    let losses = Diff::of(&graphed.losses, &eager.losses);
    let params = Diff::of(
        graphed.params.iter().flatten(),
        eager.params.iter().flatten(),
    );
    println!(
        "one rank, graphed against capture off over {steps} steps: losses {}, parameters {}",
        losses.describe(),
        params.describe()
    );
    assert!(losses.bit_exact && params.bit_exact);
    let plain = run::<G>(MEDIUM, steps, true, false);
    let losses = Diff::of(&graphed.losses, &plain.losses);
    let params = Diff::of(
        graphed.params.iter().flatten(),
        plain.params.iter().flatten(),
    );
    println!(
        "one rank against a plain trainer over {steps} steps: losses {}, parameters {}",
        losses.describe(),
        params.describe()
    );
    assert!(losses.max_rel < 1e-5 && params.max_rel < 1e-4);
}

/// One round: a group of one rank captures and replays, is aborted, and its trainer's
/// next step is a typed error; then a new group trains as usual. Everything is dropped.
fn abort_round<G: Stack>() -> Duration {
    let bytes = model_bytes(SMALL);
    let step: fn(&crate::common::Model<G>, &crate::common::Batch<G>) -> _ = loss::<G>;
    let mut task = SineTask::new(62, D_INPUT);
    let (group, member) = lone_rank();
    let mut trainer = GraphTrainer::data_parallel(
        model::<G>(SMALL, &bytes),
        adam::<G>(),
        step,
        GraphTrainerConfig::new(),
        member,
    )
    .expect("join");
    for _ in 0..WARMUP + 4 {
        trainer.step(batch(&mut task, SMALL)).expect("step");
    }
    let started = Instant::now();
    group.abort("the test stops it");
    let error = trainer.step(batch(&mut task, SMALL)).unwrap_err();
    let noticed = started.elapsed();
    assert_eq!(
        error,
        StepError::DataParallel(DistError::Aborted("the test stops it".into()))
    );
    drop(trainer);
    // A new group on the same device trains as usual.
    let (_group, member) = lone_rank();
    let mut trainer = GraphTrainer::data_parallel(
        model::<G>(SMALL, &bytes),
        adam::<G>(),
        step,
        GraphTrainerConfig::new(),
        member,
    )
    .expect("join again");
    for i in 0..WARMUP + 3 {
        let outcome = trainer.step(batch(&mut task, SMALL)).expect("step");
        if i > WARMUP {
            assert_eq!(outcome.mode, StepMode::Replayed);
        }
    }
    noticed
}

fn an_aborted_group_stops_its_trainer_and_groups_leave_nothing_behind<G: Stack>() {
    let rounds = run_length(10).max(3);
    let mut usage = Vec::new();
    // Burn's communicators (`burns_collectives_run_on_this_runtime`) live with the device:
    // Burn never leaves them. Only this test's groups are counted.
    let communicators =
        || with_server(&device(), |server| server.nccl_communicators()).expect("server");
    let before = communicators();
    for round in 0..rounds {
        let noticed = abort_round::<G>();
        G::sync(&device()).expect("sync");
        let bytes = device_bytes();
        let comms = communicators();
        println!(
            "round {round}: abort noticed in {noticed:?}; device bytes {bytes:?}; \
             communicators {comms} (before: {before})"
        );
        assert_eq!(comms, before, "a communicator outlived its group");
        usage.push(bytes);
    }
    assert_eq!(
        usage[1],
        usage[rounds - 1],
        "device memory grew over rounds: {usage:?}"
    );
}

/// Two ranks on one GPU are refused when they join (NCCL takes one rank per GPU, and
/// both would wait on the device's one worker): a typed error on both, in time.
fn two_ranks_on_one_gpu_are_refused_not_hung<G: Stack>() {
    let group = DataParallel::new(2, &DataParallelConfig::new().with_timeout_secs(30.0)).unwrap();
    let (send, receive) = mpsc::channel();
    for member in group.members().unwrap() {
        let send = send.clone();
        std::thread::spawn(move || {
            let rank = member.rank();
            let joined = G::join_group(&device(), &member);
            let _ = send.send((rank, joined));
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rank, joined) = receive.recv_timeout(left).expect("a rank hung joining");
        println!("rank {rank}: {joined:?}");
        assert!(
            matches!(joined, Err(DistError::InvalidUse(_))),
            "rank {rank}: {joined:?}"
        );
    }
}

stack_tests!(
    collectives_of_one_rank_return_their_inputs,
    a_recorded_collective_reads_its_input_at_every_replay,
    burns_collectives_run_on_this_runtime,
    one_rank_graphed_equals_capture_off_and_a_plain_trainer,
    an_aborted_group_stops_its_trainer_and_groups_leave_nothing_behind,
    two_ranks_on_one_gpu_are_refused_not_hung,
);
