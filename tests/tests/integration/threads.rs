//! Trainers on several threads at once (issue 14, part 3): two and four trainers, each on
//! its own thread, each with its own model, stepping while the others step, capture and
//! replay. Each must equal its own eager run, and no step may be refused.
//!
//! On the CPU this checks that sessions, the share registry and the lent copies keep
//! threads apart. The GPU variants (`#[ignore]`d, run by `xtask gpu run`) run the
//! same on this crate's CUDA stacks, where captures are THREAD_LOCAL on the runtime's one
//! stream and other threads' work waits while a window is open: every trainer must
//! capture and replay (a capture waits for another thread's window to close), and each
//! must still equal its eager run.

use std::sync::{Arc, Barrier};

use burn::backend::Flex;
use burn::tensor::ElementConversion;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{
    GraphBackend, GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend, TrainerReport,
};
use lstm_example::train::{load_bytes, parameter_bits, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig, SineTask};

const STEPS: usize = 24;

fn config() -> LstmRegressorConfig {
    LstmRegressorConfig::new(8).with_d_input(4)
}

/// One thread's training, graphed and eager, from `bytes` on batches of `seed`:
/// (losses, final parameters, steps replayed) of each.
fn train<G: GraphBackend>(
    bytes: &[u8],
    seed: u64,
    capture: bool,
    start: &Barrier,
) -> (Vec<u32>, Vec<Vec<u32>>, TrainerReport) {
    let device: G::Device = Default::default();
    let model: LstmRegressor<TrainBackend<G>> =
        load_bytes(config().init(&device), bytes.to_vec(), &device);
    let adam = CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<TrainBackend<G>>(&device);
    let loss = |m: &LstmRegressor<TrainBackend<G>>, b: &Batch<TrainBackend<G>>| {
        m.loss(b.x.clone(), b.y.clone())
    };
    let mut trainer = GraphTrainer::new(
        model,
        adam,
        loss,
        GraphTrainerConfig::new().with_capture(capture),
    );
    let mut task = SineTask::new(seed, 4);
    start.wait();
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let outcome = trainer
            .step(task.next_batch(4, 6, &device))
            .expect("no step is refused");
        if let StepMode::Eager(reason) = &outcome.mode {
            assert!(
                !matches!(
                    reason,
                    burn_graph_capture::FallbackReason::SharedWithTrainer(_)
                ),
                "trainers with their own models share nothing: {reason}"
            );
        }
        let loss: f32 = outcome.output.into_scalar().elem();
        losses.push(loss.to_bits());
    }
    let report = trainer.report();
    (
        losses,
        parameter_bits(trainer.model().expect("model")),
        report,
    )
}

/// `threads` trainers, graphed and eager at once (2 × `threads` threads), each checked
/// against its own eager run. Without hardware graphs, every graphed trainer must also
/// have warmed up exactly as alone: a session that saw another thread's ops would have
/// found the step non-static. Returns the replays of each graphed trainer.
fn threads_train_as_eager<G: GraphBackend>(threads: usize) -> Vec<u64> {
    let bytes: Vec<Vec<u8>> = (0..threads)
        .map(|_| to_bytes(config().init::<Flex>(&Default::default())))
        .collect();
    let start = Arc::new(Barrier::new(2 * threads));
    let handles: Vec<_> = (0..threads)
        .flat_map(|t| {
            [true, false].map(|capture| {
                let (bytes, start) = (bytes[t].clone(), Arc::clone(&start));
                std::thread::spawn(move || train::<G>(&bytes, t as u64, capture, &start))
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("no thread panics"))
        .collect();
    results
        .chunks(2)
        .enumerate()
        .map(|(t, pair)| {
            let [(graphed, graphed_params, report), (eager, eager_params, _)] = pair else {
                unreachable!()
            };
            let first = graphed.iter().zip(eager).position(|(a, b)| a != b);
            assert_eq!(first, None, "thread {t}: first differing loss");
            assert!(
                graphed_params == eager_params,
                "thread {t}: final parameters differ"
            );
            let alone = if G::supports_hardware_graphs(&Default::default()) {
                [("Warmup".to_string(), 3)].into_iter().collect()
            } else {
                [
                    ("NoHardwareGraphs".to_string(), STEPS as u64 - 3),
                    ("Warmup".to_string(), 3),
                ]
                .into_iter()
                .collect()
            };
            println!("thread {t}: {:?}", report.fallbacks);
            assert_eq!(
                report.fallbacks, alone,
                "thread {t}: steps ran as when alone"
            );
            report.modes.replayed
        })
        .collect()
}

#[test]
fn two_trainers_on_two_threads_train_as_eager() {
    let _rng = crate::common::rng::shared();
    threads_train_as_eager::<Flex>(2);
}

#[test]
fn four_trainers_on_four_threads_train_as_eager() {
    let _rng = crate::common::rng::shared();
    threads_train_as_eager::<Flex>(4);
}

#[cfg(feature = "cuda")]
mod gpu {
    use burn_graph_capture::{CudaCube, CudaFused};

    use super::threads_train_as_eager;

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn four_fused_trainers_on_four_threads_train_as_eager() {
        let _rng = crate::common::rng::shared();
        let replayed = threads_train_as_eager::<CudaFused>(4);
        println!("replays per trainer: {replayed:?}");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn two_cube_trainers_on_two_threads_train_as_eager() {
        let _rng = crate::common::rng::shared();
        let replayed = threads_train_as_eager::<CudaCube>(2);
        println!("replays per trainer: {replayed:?}");
    }
}
