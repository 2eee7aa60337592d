//! What every stack trains on: the reference sizes (ARCHITECTURE.md), one set of initial weights and one data
//! stream per size, so that all columns of a row measure the same step.

use std::fmt;
use std::str::FromStr;

use burn::backend::Flex;
use burn::nn::DropoutConfig;
use burn::prelude::*;
use burn_graph_capture::nn::{GruBackend, LstmBackend};
use lstm_example::model::{
    DropoutLstmRegressor, Forecaster, FusedLstmRegressor, GruRegressor, GruRegressorConfig,
};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig, SineTask};

/// Eager steps before anything is timed or profiled: the trainer's default warmup, so an
/// eager step profiled after them is the step a graph would have captured.
pub const WARMUP: usize = 3;

/// Distinct batches a run cycles through (inputs change every step, as in training).
const BATCHES: usize = 8;

/// Batch, sequence length and hidden size of one configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    pub b: usize,
    pub t: usize,
    pub h: usize,
}

/// The configurations of the reference configurations (ARCHITECTURE.md).
pub const ALL: [Size; 3] = [
    Size {
        b: 32,
        t: 64,
        h: 256,
    },
    Size {
        b: 8,
        t: 64,
        h: 128,
    },
    Size {
        b: 128,
        t: 32,
        h: 512,
    },
];

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.b, self.t, self.h)
    }
}

impl FromStr for Size {
    type Err = String;

    /// Parses `b/t/h`, e.g. `32/64/256`.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<usize> = s
            .split('/')
            .map(|p| p.trim().parse().map_err(|_| format!("bad size {s:?}")))
            .collect::<Result<_, _>>()?;
        match parts[..] {
            [b, t, h] => Ok(Size { b, t, h }),
            _ => Err(format!("size {s:?} is not b/t/h")),
        }
    }
}

/// Parses `all` or a comma-separated list of `b/t/h`.
pub fn parse_sizes(arg: &str) -> Result<Vec<Size>, String> {
    if arg == "all" {
        return Ok(ALL.to_vec());
    }
    arg.split(',').map(str::parse).collect()
}

/// The model and data of one configuration, to be built on any backend.
pub struct Workload {
    pub size: Size,
    config: LstmRegressorConfig,
    weights: Vec<u8>,
    /// A second layer `H -> H` (for the two-layer dropout model), drawn when first asked.
    second: std::sync::OnceLock<Vec<u8>>,
    /// The dropout probability between the dropout model's layers.
    pub dropout: f64,
}

impl Workload {
    /// Fresh weights (drawn once, on the CPU) for `size`.
    pub fn new(size: Size) -> Self {
        let config = LstmRegressorConfig::new(size.h);
        let weights = to_bytes(config.init::<Flex>(&Default::default()));
        Self {
            size,
            config,
            weights,
            second: std::sync::OnceLock::new(),
            dropout: 0.3,
        }
    }

    fn second_config(&self) -> LstmRegressorConfig {
        LstmRegressorConfig::new(self.size.h).with_d_input(self.size.h)
    }

    /// The dropout model: this workload's layer and head, a second layer, `dropout`
    /// between them (0 skips it: the same model without dropout).
    pub fn dropout_model<B: LstmBackend>(&self, device: &B::Device) -> DropoutLstmRegressor<B> {
        let second = self
            .second
            .get_or_init(|| to_bytes(self.second_config().init::<Flex>(&Default::default())));
        let fused = |model: LstmRegressor<B>| model.to_fused().expect("nn::Lstm converts");
        let first = fused(self.model(device));
        let second = fused(from_bytes::<B>(
            &self.second_config(),
            second.clone(),
            device,
        ));
        DropoutLstmRegressor {
            first: first.lstm,
            dropout: DropoutConfig::new(self.dropout).init(),
            second: second.lstm,
            head: first.head,
        }
    }

    /// The model with this workload's weights on `B`.
    pub fn model<B: Backend>(&self, device: &B::Device) -> LstmRegressor<B> {
        from_bytes::<B>(&self.config, self.weights.clone(), device)
    }

    /// The batches every stack cycles through, on `B`.
    pub fn batches<B: Backend>(&self, device: &B::Device) -> Vec<Batch<B>> {
        let mut task = SineTask::new(1, self.config.d_input);
        (0..BATCHES)
            .map(|_| task.next_batch(self.size.b, self.size.t, device))
            .collect()
    }
}

/// The step's loss: MSE of the model's predictions.
pub fn loss<B: Backend, M: Forecaster<B>>(model: &M, batch: &Batch<B>) -> Tensor<B, 1> {
    model.mse(batch.x.clone(), batch.y.clone())
}

/// The model a step trains: the stock `nn::Lstm` + `Linear`, or the same weights with
/// `FusedLstm`.
pub trait BenchModel<B: Backend>: Module<B> + Forecaster<B> {
    /// The model of `work`, on `device`.
    fn build(work: &Workload, device: &B::Device) -> Self;
}

impl<B: Backend> BenchModel<B> for LstmRegressor<B> {
    fn build(work: &Workload, device: &B::Device) -> Self {
        work.model(device)
    }
}

impl<B: LstmBackend> BenchModel<B> for FusedLstmRegressor<B> {
    fn build(work: &Workload, device: &B::Device) -> Self {
        work.model(device).to_fused().expect("nn::Lstm converts")
    }
}

impl<B: LstmBackend> BenchModel<B> for DropoutLstmRegressor<B> {
    fn build(work: &Workload, device: &B::Device) -> Self {
        work.dropout_model(device)
    }
}

impl<B: GruBackend> BenchModel<B> for GruRegressor<B> {
    fn build(work: &Workload, device: &B::Device) -> Self {
        GruRegressorConfig::new(work.size.h)
            .with_d_input(work.config.d_input)
            .init(device)
    }
}

#[path = "../shared/transformer.rs"]
mod transformer;
pub use transformer::TransformerRegressor;

impl<B: Backend> BenchModel<B> for TransformerRegressor<B> {
    fn build(work: &Workload, device: &B::Device) -> Self {
        TransformerRegressor::new(work.config.d_input, work.size.h, device)
    }
}
