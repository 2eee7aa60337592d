//! Optimizer checkpoints: state saved mid-training through Burn's recorder and loaded
//! into a fresh optimizer continues exactly like the uninterrupted run; `visit_state`
//! walks the state in its documented order and can replace it.

use burn::backend::{Autodiff, Flex};
use burn::module::ParamId;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, LearningRate, Optimizer};
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_graph_capture::optim::{
    CapturableAdamConfig, CapturableAdamWConfig, CapturableOptimizer, CapturableSgdConfig,
    StateSlot,
};
use lstm_example::train::{from_bytes, parameter_bits, parameter_values, to_bytes};
use lstm_example::{LstmRegressor, LstmRegressorConfig, SineTask};

type B = Autodiff<Flex>;
type Model = LstmRegressor<B>;

const HIDDEN: usize = 16;
const SHAPE: (usize, usize) = (4, 8);
/// Steps before the checkpoint, and after it.
const BEFORE: usize = 10;
const AFTER: usize = 10;

fn config() -> LstmRegressorConfig {
    LstmRegressorConfig::new(HIDDEN)
}

/// A learning rate that changes every step, so the saved lr matters.
fn lr(step: usize) -> LearningRate {
    1e-2 / (1.0 + step as f64)
}

/// Trains `steps` steps starting at step `first`; batches depend only on the step.
fn train<O: CapturableOptimizer<Model, B>>(
    model: &mut Model,
    optim: &mut O,
    first: usize,
    steps: usize,
) -> Vec<u32> {
    let device = Default::default();
    let mut task = SineTask::new(5, 32);
    for _ in 0..first {
        task.next_data(SHAPE.0, SHAPE.1);
    }
    (first..first + steps)
        .map(|step| {
            optim.set_lr(lr(step));
            let batch = task.next_batch::<B>(SHAPE.0, SHAPE.1, &device);
            let loss = model.loss(batch.x, batch.y);
            let grads = GradientsParams::from_grads(loss.backward(), &*model);
            *model = CapturableOptimizer::step(optim, model.clone(), grads);
            loss.into_scalar().elem::<f32>().to_bits()
        })
        .collect()
}

fn save<O: CapturableOptimizer<Model, B>>(optim: &O) -> Vec<u8> {
    BinBytesRecorder::<FullPrecisionSettings>::default()
        .record(optim.to_record(), ())
        .expect("recording into memory cannot fail")
}

/// Runs uninterrupted, and interrupted at `BEFORE` (model and optimizer saved to bytes,
/// loaded into a fresh model and a fresh optimizer from `fresh`), and compares.
fn assert_round_trip<O: CapturableOptimizer<Model, B>>(name: &str, fresh: impl Fn() -> O) {
    let device = Default::default();
    let initial = to_bytes(config().init::<Flex>(&device));

    let mut model = from_bytes::<B>(&config(), initial.clone(), &device);
    let mut optim = fresh();
    optim.init_state(&model);
    train(&mut model, &mut optim, 0, BEFORE);
    let model_bytes = to_bytes(model.clone());
    let optim_bytes = save(&optim);
    let uninterrupted = train(&mut model, &mut optim, BEFORE, AFTER);
    let uninterrupted_params = parameter_bits(&model);

    let resume = |load: bool| {
        let mut model = from_bytes::<B>(&config(), model_bytes.clone(), &device);
        let mut optim = fresh();
        if load {
            let record = BinBytesRecorder::<FullPrecisionSettings>::default()
                .load(optim_bytes.clone(), &device)
                .expect("bytes written by `save` load back");
            optim = optim.load_record(record);
        }
        optim.init_state(&model);
        let losses = train(&mut model, &mut optim, BEFORE, AFTER);
        (losses, parameter_bits(&model))
    };

    let (losses, params) = resume(true);
    assert_eq!(losses, uninterrupted, "{name}: losses after loading");
    assert!(
        params == uninterrupted_params,
        "{name}: parameters after loading"
    );

    // The check can fail: without the saved state, training continues differently.
    let (losses, params) = resume(false);
    assert_ne!(losses, uninterrupted, "{name}: fresh state should differ");
    assert!(
        params != uninterrupted_params,
        "{name}: fresh state should differ"
    );
}

#[test]
fn sgd_with_momentum_round_trips() {
    let _rng = crate::common::rng::shared();
    assert_round_trip("sgd", || {
        CapturableSgdConfig::new()
            .with_momentum(Some(MomentumConfig::new()))
            .init::<B>(&Default::default())
    });
}

#[test]
fn adam_round_trips() {
    let _rng = crate::common::rng::shared();
    assert_round_trip("adam", || {
        CapturableAdamConfig::new()
            .with_amsgrad(true)
            .init::<B>(&Default::default())
    });
}

#[test]
fn adamw_round_trips() {
    let _rng = crate::common::rng::shared();
    assert_round_trip("adamw", || {
        CapturableAdamWConfig::new().init::<B>(&Default::default())
    });
}

/// The record holds the learning rate and step count: a loaded optimizer has them.
#[test]
fn the_record_holds_lr_and_step_count() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let mut model = from_bytes::<B>(&config(), to_bytes(config().init::<Flex>(&device)), &device);
    let mut optim = CapturableAdamConfig::new().init::<B>(&device);
    optim.init_state(&model);
    train(&mut model, &mut optim, 0, 3);
    let bytes = save(&optim);
    let record = BinBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes, &device)
        .expect("load");
    let mut loaded = CapturableAdamConfig::new()
        .init::<B>(&device)
        .load_record(record);
    let mut scalars = Vec::new();
    CapturableOptimizer::<Model, B>::visit_state(&mut loaded, &mut |slot, tensor| {
        if !matches!(slot, StateSlot::Param { .. }) {
            scalars.push((slot, tensor.clone().into_scalar()));
        }
    });
    assert_eq!(
        scalars,
        vec![
            (StateSlot::LearningRate, lr(2) as f32),
            (StateSlot::StepCount, 3.0),
        ]
    );
}

/// Burn's `Optimizer` trait uses the same record and the same arithmetic.
#[test]
fn burn_optimizer_trait_matches_and_shares_records() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let bytes = to_bytes(config().init::<Flex>(&device));
    let mut ours = from_bytes::<B>(&config(), bytes.clone(), &device);
    let mut optim = CapturableAdamWConfig::new().init::<B>(&device);
    optim.init_state(&ours);
    let losses = train(&mut ours, &mut optim, 0, 5);

    let mut theirs = from_bytes::<B>(&config(), bytes, &device);
    let mut burn_api = CapturableAdamWConfig::new().init::<B>(&device);
    let mut task = SineTask::new(5, 32);
    let burn_losses: Vec<u32> = (0..5)
        .map(|step| {
            let batch = task.next_batch::<B>(SHAPE.0, SHAPE.1, &device);
            let loss = theirs.loss(batch.x, batch.y);
            let grads = GradientsParams::from_grads(loss.backward(), &theirs);
            theirs = Optimizer::step(&mut burn_api, lr(step), theirs.clone(), grads);
            loss.into_scalar().elem::<f32>().to_bits()
        })
        .collect();
    assert_eq!(losses, burn_losses);
    assert!(parameter_bits(&ours) == parameter_bits(&theirs));

    let record = Optimizer::<Model, B>::to_record(&burn_api);
    let reloaded = CapturableAdamWConfig::new()
        .init::<B>(&device)
        .load_record(record);
    let count = |optim: &mut _| {
        let mut n = 0;
        CapturableOptimizer::<Model, B>::visit_state(optim, &mut |_, _| n += 1);
        n
    };
    assert_eq!(count(&mut optim), count(&mut { reloaded }));
}

/// `visit_state` visits the learning rate, the step count, then every parameter's
/// slots in `ParamId` order; a tensor it replaces is the one the next step uses.
#[test]
fn visit_state_order_and_replacement() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let mut model = from_bytes::<B>(&config(), to_bytes(config().init::<Flex>(&device)), &device);
    let mut optim = CapturableAdamConfig::new().init::<B>(&device);
    optim.init_state(&model);

    let mut slots = Vec::new();
    CapturableOptimizer::<Model, B>::visit_state(&mut optim, &mut |slot, _| slots.push(slot));
    assert_eq!(slots[..2], [StateSlot::LearningRate, StateSlot::StepCount]);
    let params: Vec<(ParamId, usize)> = slots[2..]
        .iter()
        .map(|slot| match slot {
            StateSlot::Param { id, index } => (*id, *index),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let mut sorted = params.clone();
    sorted.sort();
    assert_eq!(params, sorted, "ordered by ParamId, then index");
    assert_eq!(
        params.len(),
        2 * parameter_values(&model).len(),
        "two moments each"
    );
    let mut again = Vec::new();
    CapturableOptimizer::<Model, B>::visit_state(&mut optim, &mut |slot, _| again.push(slot));
    assert_eq!(slots, again, "stable order");

    // Replace the learning rate by zero through the visitor: the step changes nothing.
    CapturableOptimizer::<Model, B>::visit_state(&mut optim, &mut |slot, tensor| {
        if slot == StateSlot::LearningRate {
            *tensor = Tensor::zeros([1], &device);
        }
    });
    let before = parameter_bits(&model);
    let batch = SineTask::new(5, 32).next_batch::<B>(SHAPE.0, SHAPE.1, &device);
    let grads = GradientsParams::from_grads(model.loss(batch.x, batch.y).backward(), &model);
    model = CapturableOptimizer::step(&mut optim, model, grads);
    assert!(parameter_bits(&model) == before);
    let mut step = None;
    CapturableOptimizer::<Model, B>::visit_state(&mut optim, &mut |slot, tensor| {
        if slot == StateSlot::StepCount {
            step = Some(tensor.clone().into_scalar());
        }
    });
    assert_eq!(step, Some(1.0));
}
