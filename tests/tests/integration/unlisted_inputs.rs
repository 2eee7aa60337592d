//! The unlisted-input guard on the CPU: a step that reads a tensor its batch does not
//! list stays eager and names the op; constants and listed tensors do not stop it.
//! (On the CPU every step is eager anyway; the guard's verdict is what shows.)

use std::cell::RefCell;
use std::rc::Rc;

use burn::prelude::*;
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use burn_graph_capture::{FallbackReason, GraphTrainer, GraphTrainerConfig, StepInput, StepMode};
use lstm_example::{CharLm, CharLmConfig, TokenBatch, TokenTask};

use crate::common::B;
use crate::common::models::MaskOnly;

const VOCAB: usize = 12;

fn model() -> CharLm<B> {
    CharLmConfig::new(VOCAB, 8).init::<B>(&Default::default())
}

fn adam() -> CapturableAdam<B> {
    CapturableAdamConfig::new().init::<B>(&Default::default())
}

fn modes<I, F>(
    trainer: &mut GraphTrainer<burn::backend::Flex, CharLm<B>, CapturableAdam<B>, I, F>,
    batches: impl IntoIterator<Item = I>,
) -> Vec<StepMode>
where
    I: StepInput<B>,
    F: FnMut(&CharLm<B>, &I) -> Tensor<B, 1> + Clone,
{
    batches
        .into_iter()
        .map(|batch| trainer.step(batch).unwrap().mode)
        .collect()
}

fn token_batches(steps: usize) -> Vec<TokenBatch<B>> {
    let mut task = TokenTask::new(3, VOCAB);
    (0..steps)
        .map(|_| task.next_batch(2, 6, &Default::default()))
        .collect()
}

/// The warmup verdict: the reason of the step after warmup.
fn verdict(modes: &[StepMode]) -> FallbackReason {
    match modes.last() {
        Some(StepMode::Eager(reason)) => reason.clone(),
        other => panic!("expected an eager step, got {other:?}"),
    }
}

/// Asserts that token-batch steps with `loss` pass warmup: only the CPU keeps them eager.
fn assert_passes_the_guard(loss: impl FnMut(&CharLm<B>, &TokenBatch<B>) -> Tensor<B, 1> + Clone) {
    let mut trainer = GraphTrainer::new(model(), adam(), loss, GraphTrainerConfig::new());
    let modes = modes(&mut trainer, token_batches(4));
    assert_eq!(
        verdict(&modes),
        FallbackReason::NoHardwareGraphs,
        "{modes:?}"
    );
}

#[test]
fn listed_tokens_pass_the_guard() {
    let _rng = crate::common::rng::shared();
    assert_passes_the_guard(|model, batch| model.loss(batch.tokens.clone(), batch.targets.clone()));
}

#[test]
fn unlisted_tokens_keep_the_step_eager_and_name_the_reading_op() {
    let _rng = crate::common::rng::shared();
    let loss = |model: &CharLm<B>, batch: &MaskOnly<B>| {
        let weight = batch.mask.clone().mean();
        model.loss(batch.tokens.tokens.clone(), batch.tokens.targets.clone()) * weight
    };
    let mut trainer = GraphTrainer::new(model(), adam(), loss, GraphTrainerConfig::new());
    let batches = token_batches(4).into_iter().map(|tokens| MaskOnly {
        mask: Tensor::ones([2, 6], &Default::default()),
        tokens,
    });
    let modes = modes(&mut trainer, batches);
    assert_eq!(modes[0], StepMode::Eager(FallbackReason::Warmup));
    let reason = verdict(&modes[..2]);
    let FallbackReason::UnlistedInput { op, shape, dtype } = &reason else {
        panic!("expected an unlisted input, got {reason:?}");
    };
    assert_eq!((op.as_ref(), shape.as_slice()), ("embedding", &[2, 6][..]));
    assert!(dtype.is_int(), "{dtype:?}");
    assert_eq!(
        verdict(&modes),
        reason,
        "the shape stays eager for that reason"
    );
    let report = trainer.report();
    assert_eq!(report.fallbacks.get("UnlistedInput"), Some(&3));
    assert!(report.last_fallback.unwrap().contains("`embedding`"));
}

#[test]
fn a_tensor_built_once_outside_the_step_is_a_constant() {
    let _rng = crate::common::rng::shared();
    let weights =
        Tensor::<B, 2>::from_floats([[1.0, 0.5, 1.0, 0.5, 1.0, 0.5]; 2], &Default::default());
    assert_passes_the_guard(move |model, batch| {
        let logits = model.forward(batch.tokens.clone());
        (logits.mean_dim(2).squeeze_dim::<2>(2) * weights.clone()).mean()
    });
}

#[test]
fn a_tensor_replaced_between_steps_outside_the_batch_is_unlisted() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let scale = Rc::new(RefCell::new(Tensor::<B, 1>::ones([1], &device)));
    let read = scale.clone();
    let loss = move |model: &CharLm<B>, batch: &TokenBatch<B>| {
        model.loss(batch.tokens.clone(), batch.targets.clone()) * read.borrow().clone()
    };
    let mut trainer = GraphTrainer::new(model(), adam(), loss, GraphTrainerConfig::new());
    let mut modes = Vec::new();
    for (step, batch) in token_batches(3).into_iter().enumerate() {
        *scale.borrow_mut() = Tensor::from_floats([1.0 + step as f32], &device);
        modes.push(trainer.step(batch).unwrap().mode);
    }
    let reason = verdict(&modes[..2]);
    assert!(
        matches!(&reason, FallbackReason::UnlistedInput { op, shape, .. } if op == "float_mul" && shape == &[1]),
        "{reason:?}"
    );
}
