//! Data-parallel training on the CPU (Flex, whose collectives run on the host): ranks
//! train as one trainer on their combined batch, stay bit-identical, refuse and fail
//! together, and never wait forever for a rank that is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::module::AutodiffModule;
use burn::prelude::*;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{
    DataParallel, DataParallelConfig, DistError, FallbackReason, GraphTrainer, GraphTrainerConfig,
    RankMember, StepError, StepMode,
};
use lstm_example::train::{parameter_bits, parameter_values, to_bytes};
use lstm_example::{Batch, CharLmConfig, SineTask, TokenBatch, TokenTask};

use crate::common::models::{GruRegressor, Regression};
use crate::common::{B, Model, adam, loss, model, model_bytes};

/// Per-rank batch and sequence length of the LSTM runs.
const BATCH: usize = 4;
const TIME: usize = 6;

/// Runs `f` on one thread per rank of a new group, each with its member; returns what
/// each returned (or how it panicked), in rank order.
pub(crate) fn on_ranks<T: Send>(
    world: usize,
    config: &DataParallelConfig,
    f: impl Fn(RankMember) -> T + Sync,
) -> Vec<thread::Result<T>> {
    let group = DataParallel::new(world, config).unwrap();
    thread::scope(|scope| {
        let handles: Vec<_> = group
            .members()
            .unwrap()
            .into_iter()
            .map(|member| scope.spawn(|| f(member)))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    })
}

/// Rank `rank`'s share of the combined batch of `world * BATCH` sequences of `step`.
pub(crate) fn shard(step: usize, rank: usize, world: usize) -> Batch<B> {
    let device = Default::default();
    let combined = SineTask::new(step as u64, 32).next_batch::<B>(world * BATCH, TIME, &device);
    let rows = rank * BATCH..(rank + 1) * BATCH;
    Batch {
        x: combined.x.slice([rows.clone()]),
        y: combined.y.slice([rows]),
    }
}

/// The LSTM trainer of one rank.
type LstmTrainer = GraphTrainer<
    Flex,
    Model,
    burn_graph_capture::optim::CapturableAdam<B>,
    Batch<B>,
    fn(&Model, &Batch<B>) -> Tensor<B, 1>,
>;

fn rank_trainer(member: RankMember, bytes: &[u8]) -> Result<LstmTrainer, StepError> {
    GraphTrainer::data_parallel(
        model(bytes),
        adam(),
        loss as fn(&Model, &Batch<B>) -> Tensor<B, 1>,
        GraphTrainerConfig::new(),
        member,
    )
}

/// What a rank's run ends with: its losses and final parameters.
struct RankRun {
    losses: Vec<f32>,
    bits: Vec<Vec<u32>>,
    values: Vec<Vec<f32>>,
}

#[test]
fn two_ranks_train_as_one_trainer_on_the_combined_batch_and_stay_bit_identical() {
    let _rng = crate::common::rng::shared();
    const STEPS: usize = 200;
    let bytes = model_bytes();
    let runs = on_ranks(2, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let mut trainer = rank_trainer(member, &bytes).unwrap();
        let mut losses = Vec::new();
        for step in 0..STEPS {
            let outcome = trainer.step(shard(step, rank, 2)).unwrap();
            assert_eq!(
                outcome.mode,
                StepMode::Eager(match step {
                    0..3 => FallbackReason::Warmup,
                    _ => FallbackReason::NoHardwareGraphs,
                })
            );
            losses.push(outcome.output.into_scalar());
        }
        let model = trainer.model().unwrap();
        RankRun {
            losses,
            bits: parameter_bits(model),
            values: parameter_values(model),
        }
    });
    let runs: Vec<RankRun> = runs.into_iter().map(Result::unwrap).collect();
    assert_eq!(runs[0].bits, runs[1].bits, "the ranks' parameters differ");
    assert_ne!(
        runs[0].losses, runs[1].losses,
        "the ranks saw the same data"
    );

    // One trainer on both shards at once.
    let mut alone = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let device = Default::default();
    let mut worst_loss = 0.0f32;
    for step in 0..STEPS {
        let combined = SineTask::new(step as u64, 32).next_batch::<B>(2 * BATCH, TIME, &device);
        let whole = alone.step(combined).unwrap().output.into_scalar();
        let mean = (runs[0].losses[step] + runs[1].losses[step]) / 2.0;
        worst_loss = worst_loss.max((mean - whole).abs() / whole.abs());
    }
    let reference = parameter_values(alone.model().unwrap());
    let worst_param = reference
        .iter()
        .flatten()
        .zip(runs[0].values.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // fp32 sums in another order: the rank means add two halves, the whole batch one sum.
    eprintln!(
        "200 steps: worst relative loss difference {worst_loss:e}, parameters {worst_param:e}"
    );
    assert!(
        worst_loss < 1e-4,
        "losses differ by {worst_loss} (relative)"
    );
    assert!(worst_param < 1e-4, "parameters differ by {worst_param}");
}

#[test]
fn one_rank_trains_bit_for_bit_as_a_plain_trainer() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let runs = on_ranks(1, &DataParallelConfig::new(), |member| {
        let mut trainer = rank_trainer(member, &bytes).unwrap();
        let losses: Vec<u32> = (0..12)
            .map(|step| {
                let batch = shard(step, 0, 1);
                trainer.step(batch).unwrap().output.into_scalar().to_bits()
            })
            .collect();
        (losses, parameter_bits(trainer.model().unwrap()))
    });
    let (losses, bits) = runs.into_iter().next().unwrap().unwrap();
    let mut plain = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let plain_losses: Vec<u32> = (0..12)
        .map(|step| {
            plain
                .step(shard(step, 0, 1))
                .unwrap()
                .output
                .into_scalar()
                .to_bits()
        })
        .collect();
    assert_eq!(losses, plain_losses);
    assert_eq!(bits, parameter_bits(plain.model().unwrap()));
}

#[test]
fn every_rank_starts_from_rank_zeros_model_and_optimizer() {
    let _rng = crate::common::rng::shared();
    let zero = model_bytes();
    let other = model_bytes();
    assert_ne!(zero, other);
    let runs = on_ranks(3, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let bytes = if rank == 0 { &zero } else { &other };
        // Rank 2's optimizer starts at another learning rate: rank 0's is broadcast.
        let lr = if rank == 2 { 0.5 } else { 1e-2 };
        let optimizer = CapturableAdamConfig::new()
            .with_learning_rate(lr)
            .init::<B>(&Default::default());
        let mut trainer = GraphTrainer::data_parallel(
            model(bytes),
            optimizer,
            loss,
            GraphTrainerConfig::new(),
            member,
        )
        .unwrap();
        let start = parameter_bits(trainer.model().unwrap());
        trainer.step(shard(0, rank, 3)).unwrap();
        (start, parameter_bits(trainer.model().unwrap()))
    });
    let runs: Vec<_> = runs.into_iter().map(Result::unwrap).collect();
    assert_eq!(runs[0].0, parameter_bits(&model(&zero)));
    for run in &runs[1..] {
        assert_eq!(run.0, runs[0].0, "a rank did not start from rank 0's model");
        assert_eq!(
            run.1, runs[0].1,
            "a rank stepped otherwise (another learning rate?)"
        );
    }
}

#[test]
fn a_refused_step_is_refused_on_every_rank_and_training_goes_on() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let runs = on_ranks(2, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let mut trainer = rank_trainer(member, &bytes).unwrap();
        let mut refusals = Vec::new();
        for step in 0..6 {
            let mut batch = shard(step, rank, 2);
            if step == 2 && rank == 1 {
                batch.x = batch.x.slice([0..0, 0..TIME]);
            }
            if let Err(error) = trainer.step(batch) {
                refusals.push((step, error));
            }
        }
        (refusals, parameter_bits(trainer.model().unwrap()))
    });
    let runs: Vec<_> = runs.into_iter().map(Result::unwrap).collect();
    let (zero, one) = (&runs[0], &runs[1]);
    assert!(
        matches!(&one.0[..], [(2, StepError::EmptyBatch(_))]),
        "{:?}",
        one.0
    );
    assert!(
        matches!(&zero.0[..], [(2, StepError::PeerRefused { rank: 1, error })] if **error == one.0[0].1),
        "rank 0 is told rank 1's own error: {:?}",
        zero.0
    );
    assert_eq!(zero.1, one.1);
}

/// How long a test lets a rank wait for a peer that is gone: a failure must be
/// reported well before, since it is noticed, not timed out.
const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn a_rank_that_panics_mid_training_is_a_typed_error_on_the_others_at_once() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let config = DataParallelConfig::new().with_timeout_secs(PATIENCE.as_secs_f64());
    let runs = on_ranks(3, &config, |member| {
        let rank = member.rank();
        let steps = Arc::new(AtomicBool::new(false));
        let dies = steps.clone();
        let step_fn = move |model: &Model, batch: &Batch<B>| {
            if rank == 2 && dies.load(Ordering::SeqCst) {
                panic!("rank 2 is killed inside its step");
            }
            loss(model, batch)
        };
        let mut trainer = GraphTrainer::data_parallel(
            model(&bytes),
            adam(),
            step_fn,
            GraphTrainerConfig::new(),
            member,
        )
        .unwrap();
        for step in 0.. {
            steps.store(step == 5, Ordering::SeqCst);
            let started = Instant::now();
            if let Err(error) = trainer.step(shard(step, rank, 3)) {
                // Later steps keep failing the same way.
                let again = trainer.step(shard(step, rank, 3)).unwrap_err();
                return (step, error, again, started.elapsed());
            }
        }
        unreachable!()
    });
    assert!(runs[2].is_err(), "rank 2 should have died");
    for run in &runs[..2] {
        let (step, error, again, waited) = run.as_ref().unwrap();
        assert_eq!(*step, 5);
        assert!(
            matches!(
                error,
                StepError::DataParallel(DistError::RankFailed { rank: 2, .. })
                    | StepError::DataParallel(DistError::RankLost { rank: 2 })
            ),
            "{error:?}"
        );
        assert_eq!(again, error);
        assert!(*waited < Duration::from_secs(5), "noticed after {waited:?}");
    }
}

#[test]
fn a_rank_that_stops_stepping_times_the_others_out() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let config = DataParallelConfig::new().with_timeout_secs(0.3);
    let runs = on_ranks(2, &config, |member| {
        let rank = member.rank();
        let mut trainer = rank_trainer(member, &bytes).unwrap();
        for step in 0..3 {
            trainer.step(shard(step, rank, 2)).unwrap();
        }
        if rank == 1 {
            // Alive, holding its trainer, but stepping no more.
            thread::sleep(Duration::from_secs(1));
            return None;
        }
        let started = Instant::now();
        let error = trainer.step(shard(3, rank, 2)).unwrap_err();
        Some((error, started.elapsed()))
    });
    let (error, waited) = runs[0].as_ref().unwrap().clone().unwrap();
    let StepError::DataParallel(DistError::Timeout { rank, missing, .. }) = &error else {
        panic!("{error:?}");
    };
    assert_eq!((*rank, missing.as_slice()), (0, &[1][..]));
    assert!(
        waited >= Duration::from_millis(300) && waited < PATIENCE,
        "{waited:?}"
    );
}

#[test]
fn a_rank_that_leaves_early_is_named_by_the_others() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let runs = on_ranks(2, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let mut trainer = rank_trainer(member, &bytes).unwrap();
        let steps = if rank == 1 { 3 } else { 10 };
        (0..steps)
            .map(|step| trainer.step(shard(step, rank, 2)).err())
            .find_map(|error| error)
    });
    assert_eq!(runs[1].as_ref().unwrap(), &None);
    assert_eq!(
        runs[0].as_ref().unwrap(),
        &Some(StepError::DataParallel(DistError::RankLeft { rank: 1 }))
    );
}

#[test]
fn ranks_of_other_models_are_refused_when_they_join() {
    let _rng = crate::common::rng::shared();
    let runs = on_ranks(2, &DataParallelConfig::new(), |member| {
        let hidden = 6 + 2 * member.rank();
        let device = Default::default();
        let model = lstm_example::LstmRegressorConfig::new(hidden).init::<B>(&device);
        GraphTrainer::data_parallel(
            model,
            adam(),
            |m: &Model, b: &Batch<B>| loss(m, b),
            GraphTrainerConfig::new(),
            member,
        )
        .err()
    });
    for run in runs {
        let error = run.unwrap();
        assert!(
            matches!(error, Some(StepError::DataParallel(DistError::Mismatch(_)))),
            "{error:?}"
        );
    }
}

#[test]
fn an_error_inside_one_ranks_step_fails_every_rank() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let runs = on_ranks(2, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let step_fn = move |model: &Model, batch: &Batch<B>| {
            let loss = loss(model, batch);
            // Rank 1 returns a loss of two elements in its third step.
            if rank == 1 && batch.x.dims()[0] == BATCH && batch.y.clone().sum().into_scalar() < -1e9
            {
                return loss.repeat_dim(0, 2);
            }
            loss
        };
        let mut trainer = GraphTrainer::data_parallel(
            model(&bytes),
            adam(),
            step_fn,
            GraphTrainerConfig::new(),
            member,
        )
        .unwrap();
        (0..5)
            .map(|step| {
                let mut batch = shard(step, rank, 2);
                if step == 2 {
                    // A marker the closure sees: a batch whose targets sum below -1e9.
                    batch.y = batch.y.ones_like() * -1e10;
                }
                trainer.step(batch).err()
            })
            .enumerate()
            .find_map(|(step, error)| error.map(|e| (step, e)))
    });
    for run in runs {
        let (step, error) = run.unwrap().unwrap();
        assert_eq!(step, 2);
        assert!(
            matches!(
                &error,
                StepError::DataParallel(DistError::RankFailed { rank: 1, cause })
                    if cause.to_string().contains("scalar loss")
            ),
            "{error:?}"
        );
    }
}

#[test]
fn abort_stops_every_rank() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let group = DataParallel::new(2, &DataParallelConfig::new()).unwrap();
    let members = group.members().unwrap();
    let errors = thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                let bytes = &bytes;
                scope.spawn(move || {
                    let rank = member.rank();
                    let mut trainer = rank_trainer(member, bytes).unwrap();
                    (0..).find_map(|step| trainer.step(shard(step % 7, rank, 2)).err())
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(200));
        group.abort("stopped by the test");
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for error in errors {
        assert_eq!(
            error,
            Some(StepError::DataParallel(DistError::Aborted(
                "stopped by the test".into()
            )))
        );
    }
    assert_eq!(
        group.failure(),
        Some(DistError::Aborted("stopped by the test".into()))
    );
}

#[test]
fn a_gru_with_evaluation_and_checkpoints_on_rank_zero_stays_identical_across_ranks() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let start = to_bytes(GruRegressor::<B>::new(6, &device));
    let runs = on_ranks(2, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let model = lstm_example::train::load_bytes(
            GruRegressor::<B>::new(6, &device),
            start.clone(),
            &device,
        );
        let adam = CapturableAdamConfig::new()
            .with_learning_rate(1e-2)
            .init::<B>(&device);
        let step_fn = |model: &GruRegressor<B>, batch: &Regression<B>| model.loss(batch);
        let mut trainer =
            GraphTrainer::data_parallel(model, adam, step_fn, GraphTrainerConfig::new(), member)
                .unwrap();
        let mut checkpoints = 0;
        for step in 0..20 {
            trainer
                .step(Regression::new(2 * step + rank, 4, &device))
                .unwrap();
            if rank == 0 && step % 5 == 4 {
                // Evaluation and a checkpoint on one rank only, between steps.
                let valid = trainer.model().unwrap().valid();
                assert!(
                    valid
                        .loss(&Regression::new(99, 4, &device))
                        .into_scalar()
                        .is_finite()
                );
                checkpoints += to_bytes(trainer.model().unwrap().clone()).len().min(1);
            }
        }
        (checkpoints, parameter_bits(trainer.model().unwrap()))
    });
    let runs: Vec<_> = runs.into_iter().map(Result::unwrap).collect();
    assert_eq!(runs[0].0, 4);
    assert_eq!(runs[0].1, runs[1].1);
}

#[test]
fn a_token_model_with_an_embedding_stays_identical_across_ranks() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let config = CharLmConfig::new(12, 8);
    let start = to_bytes(config.init::<B>(&device));
    let runs = on_ranks(2, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let model =
            lstm_example::train::load_bytes(config.init::<B>(&device), start.clone(), &device);
        let adam = CapturableAdamConfig::new()
            .with_learning_rate(1e-2)
            .init::<B>(&device);
        let step_fn = |model: &lstm_example::CharLm<B>, batch: &TokenBatch<B>| {
            model.loss(batch.tokens.clone(), batch.targets.clone())
        };
        let mut trainer =
            GraphTrainer::data_parallel(model, adam, step_fn, GraphTrainerConfig::new(), member)
                .unwrap();
        let mut task = TokenTask::new(rank as u64, 12);
        let first = trainer
            .step(task.next_batch(4, 8, &device))
            .unwrap()
            .output
            .into_scalar();
        for _ in 0..30 {
            trainer.step(task.next_batch(4, 8, &device)).unwrap();
        }
        let last = trainer
            .step(task.next_batch(4, 8, &device))
            .unwrap()
            .output
            .into_scalar();
        (first, last, parameter_bits(trainer.model().unwrap()))
    });
    let runs: Vec<_> = runs.into_iter().map(Result::unwrap).collect();
    assert_eq!(runs[0].2, runs[1].2);
    for (first, last, _) in &runs {
        assert!(last < first, "no learning: {first} -> {last}");
    }
}
