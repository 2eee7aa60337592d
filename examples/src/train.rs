//! Plain eager training with Burn's own optimizer, on any autodiff backend.

use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;

use crate::{LstmRegressor, SineTask};

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

/// The model's parameters as bytes: equal bytes mean bit-equal parameters.
pub fn parameter_bytes<B: AutodiffBackend>(model: &LstmRegressor<B>) -> Vec<u8> {
    BinBytesRecorder::<FullPrecisionSettings>::default()
        .record(model.valid().into_record(), ())
        .expect("recording parameters into memory cannot fail")
}

/// Rebuilds `model` on another backend with bit-identical parameters.
pub fn transfer<B1: Backend, B2: Backend>(
    model: &LstmRegressor<B1>,
    target: LstmRegressor<B2>,
    device: &B2::Device,
) -> LstmRegressor<B2> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder
        .record(model.clone().into_record(), ())
        .expect("recording parameters into memory cannot fail");
    let record = recorder
        .load(bytes, device)
        .expect("a record just written loads back");
    target.load_record(record)
}
