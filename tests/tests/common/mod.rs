//! Helpers shared by the modules of the `integration` test binary: a small materialized
//! LSTM, its loss, and a capturable Adam; other models (`models`); and the fused
//! modules' parity checks against Burn's (`fused_lstm_parity`, `fused_gru_parity`, with
//! their `tolerance`). `gpu_trainer` includes those four files through `#[path]`. And
//! the lock on the process's generators that every test holds (`rng`).

pub mod fused_gru_parity;
pub mod fused_lstm_parity;
pub mod models;
pub mod rng;
pub mod tolerance;

use burn::backend::Flex;
use burn::prelude::*;
use burn_graph_capture::TrainBackend;
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig};

pub type B = TrainBackend<Flex>;
pub type Model = LstmRegressor<B>;

fn config() -> LstmRegressorConfig {
    LstmRegressorConfig::new(8)
}

/// Fresh weights as bytes. Burn initializes parameters lazily, so models built from
/// the same bytes are the only way to get two identical models.
pub fn model_bytes() -> Vec<u8> {
    to_bytes(config().init::<Flex>(&Default::default()))
}

pub fn model(bytes: &[u8]) -> Model {
    from_bytes(&config(), bytes.to_vec(), &Default::default())
}

pub fn adam() -> CapturableAdam<B> {
    CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<B>(&Default::default())
}

pub fn loss(model: &Model, batch: &Batch<B>) -> Tensor<B, 1> {
    model.loss(batch.x.clone(), batch.y.clone())
}
