//! Issue 14, part 2: the seed scenario at depth. Two trainers over deeply unrolled token
//! models (`Embedding` + `nn::Lstm` + `Linear`, int inputs) share one `Embedding` and
//! train interleaved, at sequence lengths 64, 256 and 512, each alternating two lengths
//! (so each trainer meets two shapes and, on a GPU, attempts a capture for each), with
//! the learning rate changing every step. Sharing: the first step finds the share and
//! runs eagerly with `SharedWithTrainer`; its update parts the two (a Burn tensor is a
//! value: each model trains its own embedding from then on), so both graph (on a GPU)
//! and each equals pure eager training of the pair, bit for bit; as they do sharing
//! nothing. This is the case the naive design crashed on (`cudaErrorIllegalAddress`,
//! SIGSEGV).
//!
//! On the CPU (`Flex`) in CI at 16 and 64 tokens (debug builds are slow); the GPU
//! variants, at 64, 256 and 512, are `#[ignore]`d and run by `xtask gpu run`
//! (stage `reliability`).

use burn::backend::Flex;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, Lstm, LstmConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use burn_graph_capture::{
    FallbackReason, GraphBackend, GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend,
};
use lstm_example::train::{load_bytes, parameter_bits, to_bytes};
use lstm_example::{TokenBatch, TokenTask};

const VOCAB: usize = 12;

/// A token model whose parts the test can hand to a second model.
#[derive(Module, Debug)]
struct TokenLm<B: Backend> {
    embedding: Embedding<B>,
    lstm: Lstm<B>,
    head: Linear<B>,
}

impl<B: Backend> TokenLm<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            embedding: EmbeddingConfig::new(VOCAB, 8).init(device),
            lstm: LstmConfig::new(8, 12, true).init(device),
            head: LinearConfig::new(12, VOCAB).init(device),
        }
    }

    /// This model with `other`'s embedding: the same tensors, so a share.
    fn with_embedding_of(self, other: &Self) -> Self {
        Self {
            embedding: other.embedding.clone(),
            ..self
        }
    }

    fn loss(&self, batch: &TokenBatch<B>) -> Tensor<B, 1> {
        let (hidden, _) = self
            .lstm
            .forward(self.embedding.forward(batch.tokens.clone()), None);
        let logits = self.head.forward(hidden);
        let [b, t, v] = logits.dims();
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(
                logits.reshape([b * t, v]),
                batch.targets.clone().reshape([b * t]),
            )
    }
}

type T<G> = TrainBackend<G>;

/// Two models from seeded weights (on Flex, then loaded onto `G`); the second has the
/// first's embedding when `share`. Flex's RNG is process-wide: the calling test holds
/// `common::rng` exclusively.
fn models<G: GraphBackend>(share: bool) -> (TokenLm<T<G>>, TokenLm<T<G>>) {
    let device = Default::default();
    let bytes = |seed| {
        Flex::seed(&Default::default(), seed);
        to_bytes(TokenLm::<Flex>::new(&Default::default()))
    };
    let first = load_bytes(TokenLm::new(&device), bytes(1), &device);
    let second = load_bytes(TokenLm::new(&device), bytes(2), &device);
    let second = if share {
        second.with_embedding_of(&first)
    } else {
        second
    };
    (first, second)
}

fn adam<B: AutodiffBackend>() -> CapturableAdam<B> {
    CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<B>(&Default::default())
}

/// The learning rate of step `step`: changes every step.
fn lr(step: usize) -> f64 {
    1e-2 / (1.0 + step as f64 * 0.1)
}

/// Batch `step` of trainer `which`: 2 sequences of `time` or `time / 2` tokens.
fn batch<B: Backend>(which: u64, step: usize, time: usize) -> TokenBatch<B> {
    let time = if step.is_multiple_of(2) {
        time
    } else {
        time / 2
    };
    TokenTask::new(which * 1000 + step as u64, VOCAB).next_batch(2, time, &Default::default())
}

/// Losses (bits) of both, their final parameters, and every step's modes.
struct Pair {
    losses: [Vec<u32>; 2],
    params: [Vec<Vec<u32>>; 2],
    modes: [Vec<StepMode>; 2],
}

fn graphed<G: GraphBackend>(share: bool, time: usize, steps: usize) -> Pair {
    let (first, second) = models::<G>(share);
    let loss = |m: &TokenLm<T<G>>, b: &TokenBatch<T<G>>| m.loss(b);
    let mut trainers = [
        GraphTrainer::new(first, adam(), loss, GraphTrainerConfig::new()),
        GraphTrainer::new(second, adam(), loss, GraphTrainerConfig::new()),
    ];
    let mut pair = Pair {
        losses: Default::default(),
        params: Default::default(),
        modes: Default::default(),
    };
    for step in 0..steps {
        for (which, trainer) in trainers.iter_mut().enumerate() {
            trainer.set_lr(lr(step));
            let outcome = trainer.step(batch(which as u64, step, time)).expect("step");
            pair.losses[which].push(outcome.output.into_scalar().elem::<f32>().to_bits());
            pair.modes[which].push(outcome.mode);
        }
    }
    for (which, trainer) in trainers.iter().enumerate() {
        pair.params[which] = parameter_bits(trainer.model().expect("model"));
    }
    pair
}

/// The same interleaved training as plain Burn code: in Burn a tensor is a value, so
/// the two models start from the same embedding and then each trains its own.
fn eager<G: GraphBackend>(share: bool, time: usize, steps: usize) -> Pair {
    let (first, second) = models::<G>(share);
    let mut models = [first, second];
    let mut optimizers = [adam::<T<G>>(), adam::<T<G>>()];
    for (model, optimizer) in models.iter().zip(optimizers.iter_mut()) {
        optimizer.init_state(model);
    }
    // As each trainer does when it is built: launch what building the models queued, so
    // that it does not fuse with the first step (bench/results/inputs-2026-12-01.md).
    T::<G>::sync(&Default::default()).expect("device sync");
    let mut pair = Pair {
        losses: Default::default(),
        params: Default::default(),
        modes: Default::default(),
    };
    for step in 0..steps {
        for which in 0..2 {
            optimizers[which].set_lr(lr(step));
            let loss = models[which].loss(&batch(which as u64, step, time));
            let grads = GradientsParams::from_grads(loss.backward(), &models[which]);
            models[which] = optimizers[which].step(models[which].clone(), grads);
            pair.losses[which].push(loss.into_scalar().elem::<f32>().to_bits());
        }
    }
    for (which, model) in models.iter().enumerate() {
        pair.params[which] = parameter_bits(model);
    }
    pair
}

fn scenario<G: GraphBackend>(share: bool, time: usize, steps: usize) {
    let start = std::time::Instant::now();
    let got = graphed::<G>(share, time, steps);
    let graphed_s = start.elapsed().as_secs_f64();
    let want = eager::<G>(share, time, steps);
    println!(
        "t={time} share={share}: {steps} steps graphed in {graphed_s:.1} s, eager in {:.1} s",
        start.elapsed().as_secs_f64() - graphed_s
    );
    for which in 0..2 {
        let at = got.losses[which]
            .iter()
            .zip(&want.losses[which])
            .position(|(a, b)| a != b);
        assert_eq!(at, None, "t={time} share={share}: trainer {which}'s losses");
        assert!(
            got.params[which] == want.params[which],
            "t={time} share={share}: trainer {which}'s parameters"
        );
        let hardware = G::supports_hardware_graphs(&Default::default());
        for (step, mode) in got.modes[which].iter().enumerate() {
            // A share lasts while both hold the embedding: the first trainer's first
            // update moves it onto a tensor of its own.
            let shared_now = share && which == 0 && step == 0;
            let fits = match mode {
                StepMode::Eager(FallbackReason::SharedWithTrainer(_)) => shared_now,
                _ if shared_now => false,
                StepMode::Captured | StepMode::Replayed => hardware,
                StepMode::Eager(FallbackReason::Warmup) => true,
                StepMode::Eager(FallbackReason::NoHardwareGraphs) => !hardware,
                _ => false,
            };
            assert!(
                fits,
                "t={time} share={share}: trainer {which}, step {step}: {mode:?}"
            );
        }
        if hardware {
            let replays = got.modes[which]
                .iter()
                .filter(|m| **m == StepMode::Replayed)
                .count();
            assert!(replays > 0, "t={time}: trainer {which} never replayed");
        }
    }
}

/// The CPU runs in CI (debug builds) are shorter: 6 steps at 16 and 64 tokens.
#[test]
fn two_trainers_sharing_an_embedding_train_as_eager() {
    let _rng = crate::common::rng::exclusive();
    for time in [16, 64] {
        scenario::<Flex>(true, time, 6);
    }
}

#[test]
fn two_trainers_sharing_nothing_train_as_eager() {
    let _rng = crate::common::rng::exclusive();
    for time in [16, 64] {
        scenario::<Flex>(false, time, 6);
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use burn_graph_capture::{CudaCube, CudaFused, GraphBackend};

    /// Sequence lengths and steps per trainer: fewer at depth, where an eager step of the
    /// stock stack costs seconds. Each trainer alternates two lengths, so 12 steps give
    /// each length three warmups, a capture and two replays.
    const DEPTHS: [(usize, usize); 3] = [(64, 24), (256, 12), (512, 12)];

    fn at_depth<G: GraphBackend>(share: bool) {
        for (time, steps) in DEPTHS {
            super::scenario::<G>(share, time, steps);
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn fused_pairs_sharing_an_embedding_at_depth() {
        let _rng = crate::common::rng::exclusive();
        at_depth::<CudaFused>(true);
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn fused_pairs_sharing_nothing_at_depth() {
        let _rng = crate::common::rng::exclusive();
        at_depth::<CudaFused>(false);
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn cube_pairs_sharing_an_embedding_at_depth() {
        let _rng = crate::common::rng::exclusive();
        at_depth::<CudaCube>(true);
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn cube_pairs_sharing_nothing_at_depth() {
        let _rng = crate::common::rng::exclusive();
        at_depth::<CudaCube>(false);
    }
}
