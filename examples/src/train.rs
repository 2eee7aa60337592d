//! Plain eager training with Burn's own optimizer, on any autodiff backend.

use burn::module::{ModuleVisitor, Param};
use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;

use crate::{LstmRegressor, LstmRegressorConfig, SineTask};

/// Runs `steps` optimizer steps on batches from `task`; returns the loss of each step.
pub fn train_eager<B, O>(
    model: &mut LstmRegressor<B>,
    optimizer: &mut O,
    task: &mut SineTask,
    (batch, time): (usize, usize),
    steps: usize,
    lr: f64,
) -> Vec<f32>
where
    B: AutodiffBackend,
    O: Optimizer<LstmRegressor<B>, B>,
{
    let device = model.devices()[0].clone();
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let batch = task.next_batch::<B>(batch, time, &device);
        let loss = model.loss(batch.x, batch.y);
        let grads = GradientsParams::from_grads(loss.backward(), model);
        *model = optimizer.step(lr, model.clone(), grads);
        losses.push(loss.into_scalar().elem::<f32>());
    }
    losses
}

/// Every float parameter's values, in visiting order, as `f32`.
pub fn parameter_values<B: Backend, M: Module<B>>(model: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = param.val().into_data().convert::<f32>().into_vec::<f32>();
            self.0.push(values.expect("converted data holds f32"));
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// Every float parameter's bit pattern: equal vectors mean bit-equal parameters.
pub fn parameter_bits<B: Backend, M: Module<B>>(model: &M) -> Vec<Vec<u32>> {
    parameter_values(model)
        .into_iter()
        .map(|p| p.into_iter().map(f32::to_bits).collect())
        .collect()
}

/// The model's parameters as record bytes, to rebuild it on any backend.
pub fn to_bytes<B: Backend, M: Module<B>>(model: M) -> Vec<u8> {
    BinBytesRecorder::<FullPrecisionSettings>::default()
        .record(model.into_record(), ())
        .expect("recording parameters into memory cannot fail")
}

/// Builds a model of `config` on `B` whose parameters are those saved in `bytes`.
///
/// Burn initializes parameters lazily, so a clone of a fresh model draws its own
/// values; loading both models from the same bytes is what makes them identical.
pub fn from_bytes<B: Backend>(
    config: &LstmRegressorConfig,
    bytes: Vec<u8>,
    device: &B::Device,
) -> LstmRegressor<B> {
    load_bytes(config.init::<B>(device), bytes, device)
}

/// `model` (freshly built, of the same structure) with the parameters saved in `bytes`.
pub fn load_bytes<B: Backend, M: Module<B>>(model: M, bytes: Vec<u8>, device: &B::Device) -> M {
    let record = BinBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes, device)
        .expect("bytes written by `to_bytes` load back");
    model.load_record(record)
}
