//! Shared GPU test/bench harness: backend aliases, deterministic host data, and the LSTM
//! training step used by the parity tests and the eager bench.
//!
//! Every backend gets the same initial weights (built once on the CPU backend and moved
//! through the backend-independent record item) and the same inputs (from a host PRNG),
//! so differences come from the runtime alone.

#![allow(dead_code)]

pub mod child;

use burn::{
    module::Module,
    nn::{
        Linear, LinearConfig, Lstm, LstmConfig,
        loss::{MseLoss, Reduction},
    },
    optim::{Adam, AdamConfig, GradientsParams, Optimizer, adaptor::OptimizerAdaptor},
    record::{FullPrecisionSettings, Record},
    tensor::{
        ElementConversion, Tensor, TensorData,
        backend::{AutodiffBackend, Backend},
    },
};
use burn_cubecl::CubeBackend;
use burn_graph_capture::runtime::CudaGraphDevice;

/// This crate's runtime, without and with fusion (`CudaFused` is
/// `Fusion<CubeBackend<CudaGraphRuntime, f32, i32, u8>>`, the stack the op-parity and LSTM
/// checks compare with the fused `burn_cuda::Cuda`).
pub type Ours = burn_graph_capture::CudaCube;
pub type OursFused = burn_graph_capture::CudaFused;
/// Stock cubecl-cuda, without and with fusion (`burn_cuda::Cuda` is the fused one).
pub type Stock = CubeBackend<cubecl_cuda::CudaRuntime, f32, i32, u8>;
pub type StockFused = burn_cuda::Cuda<f32, i32>;
/// CPU backend used to build initial weights.
pub type Cpu = burn::backend::Flex;

pub fn our_device() -> CudaGraphDevice {
    CudaGraphDevice::new(0)
}

pub fn stock_device() -> cubecl_cuda::CudaDevice {
    cubecl_cuda::CudaDevice::new(0)
}

/// Deterministic uniform values in [-1, 1) (64-bit LCG, top bits).
pub fn host_values(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Relative error ‖a − b‖ / max(‖b‖, tiny); infinite on length mismatch or NaN.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        if x.is_nan() != y.is_nan() {
            return f64::INFINITY;
        }
        if x.is_nan() {
            continue;
        }
        diff += (*x as f64 - *y as f64).powi(2);
        norm += (*y as f64).powi(2);
    }
    diff.sqrt() / norm.sqrt().max(1e-30)
}

/// LSTM + linear head, as in the reference configurations (ARCHITECTURE.md) (head on every timestep).
#[derive(Module, Debug)]
pub struct Net<B: Backend> {
    pub lstm: Lstm<B>,
    pub head: Linear<B>,
}

pub const D_IN: usize = 32;

impl<B: Backend> Net<B> {
    pub fn new(hidden: usize, device: &B::Device) -> Self {
        Self {
            lstm: LstmConfig::new(D_IN, hidden, true).init(device),
            head: LinearConfig::new(hidden, 1).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let (out, _) = self.lstm.forward(x, None);
        self.head.forward(out)
    }
}

/// The same initial weights on any backend: built on the CPU with a fixed seed, then
/// moved through the backend-independent record item.
///
/// Seeding and drawing happen under one lock: the CPU backend's RNG is process-global, so
/// tests running in parallel would otherwise interleave their draws and start from
/// different weights (seen on the H200 with `--test-threads=4`: 3.5% apart at step 0).
pub fn initial_net<B: Backend>(hidden: usize, device: &B::Device) -> Net<B> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let cpu: Net<Cpu> = {
        let _guard = INIT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let cpu_device = Default::default();
        Cpu::seed(&cpu_device, 7);
        Net::new(hidden, &cpu_device)
    };
    let item = cpu.into_record().into_item::<FullPrecisionSettings>();
    let json = serde_json::to_value(&item).expect("record serializes");
    let item = serde_json::from_value(json).expect("record deserializes");
    let record = <NetRecord<B> as Record<B>>::from_item::<FullPrecisionSettings>(item, device);
    Net::new(hidden, device).load_record(record)
}

/// One LSTM training problem: model, Adam, fixed batch.
pub struct LstmProblem<B: AutodiffBackend> {
    pub net: Net<B>,
    pub optim: OptimizerAdaptor<Adam, Net<B>, B>,
    pub x: Tensor<B, 3>,
    pub y: Tensor<B, 3>,
}

impl<B: AutodiffBackend> LstmProblem<B> {
    pub fn new(batch: usize, seq: usize, hidden: usize, device: &B::Device) -> Self {
        let x = TensorData::new(host_values(1, batch * seq * D_IN), [batch, seq, D_IN]);
        let y = TensorData::new(host_values(2, batch * seq), [batch, seq, 1]);
        Self {
            net: initial_net(hidden, device),
            optim: AdamConfig::new().init(),
            x: Tensor::from_data(x, device),
            y: Tensor::from_data(y, device),
        }
    }

    /// One optimizer step; returns the loss tensor (not read back).
    pub fn step(&mut self) -> Tensor<B, 1> {
        let pred = self.net.forward(self.x.clone());
        let loss = MseLoss::new().forward(pred, self.y.clone(), Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &self.net);
        let net = self.net.clone();
        self.net = self.optim.step(1e-3, net, grads);
        loss.detach()
    }
}

/// Losses of `steps` eager steps on backend `B`.
pub fn lstm_losses<B: AutodiffBackend>(
    device: &B::Device,
    (batch, seq, hidden): (usize, usize, usize),
    steps: usize,
) -> Vec<f32> {
    let mut problem = LstmProblem::<B>::new(batch, seq, hidden, device);
    (0..steps)
        .map(|_| problem.step().into_scalar().elem::<f32>())
        .collect()
}
