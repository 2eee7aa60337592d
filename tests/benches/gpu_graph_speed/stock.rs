//! Stock Burn on stock burn-cuda: `Autodiff<burn_cuda::Cuda>` (fusion on, Burn's
//! defaults) with Burn's own `AdamConfig`, the reference of the reference eager step.

use burn::backend::Autodiff;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_cuda::{Cuda, CudaDevice};
use lstm_example::Batch;

use crate::memory::{self, PoolDelta};
use crate::setup::{WARMUP, Workload, loss};
use crate::timing::{self, Timing};

type Stock = Autodiff<Cuda>;

/// `CapturableAdamConfig`'s default learning rate, passed to Burn's Adam every step.
const LR: f64 = 1e-3;

fn read(loss: Tensor<Stock, 1>) {
    let _ = loss.into_scalar();
}

/// Runs `body` with a step function of `work` on the stock stack (warmed up).
fn with_steps<R>(
    work: &Workload,
    batches: Vec<Batch<Stock>>,
    device: &CudaDevice,
    body: impl FnOnce(&mut dyn FnMut() -> Tensor<Stock, 1>) -> R,
) -> R {
    let mut model = Some(work.model::<Stock>(device));
    let mut optimizer = AdamConfig::new().init::<Stock, _>();
    let mut next = batches.iter().cycle();
    let mut step = || {
        let m = model.take().expect("model");
        let l = loss(&m, next.next().expect("batch"));
        let grads = GradientsParams::from_grads(l.backward(), &m);
        model = Some(optimizer.step(LR, m, grads));
        l
    };
    for _ in 0..WARMUP {
        read(step());
    }
    body(&mut step)
}

/// Times eager steps, and the pools' growth over them (see `memory`).
pub fn eager(work: &Workload) -> (Timing, PoolDelta) {
    let device = CudaDevice::default();
    let sync = || Stock::sync(&device).expect("sync");
    let batches = work.batches::<Stock>(&device);
    let before = memory::stock_after_cleanup::<Stock>(sync, &device);
    let timing = with_steps(work, batches, &device, |step| {
        timing::time(timing::EAGER, step, read)
    });
    sync();
    let after = memory::stock(&device);
    (timing, PoolDelta::between(before, after))
}

/// Profiles the eager step after `WARMUP` eager steps.
pub fn profile(work: &Workload) -> f64 {
    let device = CudaDevice::default();
    let sync = || Stock::sync(&device).expect("sync");
    with_steps(work, work.batches(&device), &device, |step| {
        let mut loss = None;
        let wall = crate::profile::range(sync, || loss = Some(step()));
        read(loss.expect("loss"));
        wall
    })
}
