//! Eager data-parallel training of the reference LSTM step on stock burn-cuda, with
//! Burn's own DDP machinery (`DistributedBackend`: a sync server, gradients all-reduced
//! through NCCL inside `backward`), one thread per GPU: the issue's "eager DDP on stock
//! burn-cuda" reference for `gpu_graph_speed`'s `ddp2` stacks.
//!
//! `stock_ddp [--world N] [--size b/t/h] [--fusion] [--runtime ours]`: N GPUs (default:
//! all), each with a batch of b sequences of t steps, hidden size h (default 32/64/256),
//! input size 32, `nn::Lstm` + `Linear`, MSE, Burn's Adam. Prints one JSON line: rank 0's
//! milliseconds per step (pipelined: rounds of steps with one host read each, the median
//! of five), as `gpu_graph_speed` times its steps, and its first and last losses.
//! `--runtime ours` runs the same on this crate's runtime (`Autodiff<CudaFused>`, or
//! `CudaCube` without `--fusion`): Burn's own DDP path through `CudaGraphRuntime`'s
//! `ServerCommunication` (NCCL).

use std::time::Instant;

use burn::backend::Autodiff;
use burn::backend::cuda::CudaDevice;
use burn::module::{ModuleMapper, Param};
use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::backend::distributed::{
    DistributedBackend, DistributedConfig, DistributedParamId, ReduceOperation,
};

#[derive(Module, Debug)]
struct Net<B: Backend> {
    lstm: Lstm<B>,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(h: usize, device: &B::Device) -> Self {
        Self {
            lstm: LstmConfig::new(32, h, true).init(device),
            head: LinearConfig::new(h, 1).init(device),
        }
    }

    fn loss(&self, x: Tensor<B, 3>, y: Tensor<B, 3>) -> Tensor<B, 1> {
        let (hidden, _) = self.lstm.forward(x, None);
        (self.head.forward(hidden) - y).powi_scalar(2).mean()
    }
}

/// Marks every parameter's gradient for synchronisation across the ranks.
struct Sharded;

impl<B: AutodiffBackend> ModuleMapper<B> for Sharded {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = tensor.set_distributed(DistributedParamId::from(id.val()));
        Param::from_mapped_value(id, tensor, mapper)
    }
}

#[derive(Clone, Copy)]
struct Size {
    b: usize,
    t: usize,
    h: usize,
}

const WARMUP: usize = 5;
const ROUNDS: usize = 5;
const ROUND_LEN: usize = 10;

/// Rank `rank`'s training loop; rank 0 returns its timing (ms per step) and its first and
/// last losses.
fn rank<B>(rank: usize, device: B::Device, size: Size) -> Option<(f64, f32, f32)>
where
    B: AutodiffBackend + DistributedBackend,
{
    B::seed(&device, 7);
    let mut model = Net::<B>::new(size.h, &device).map(&mut Sharded);
    let mut optimizer = AdamConfig::new().init::<B, Net<B>>();
    let x = Tensor::<B, 3>::random([size.b, size.t, 32], Distribution::Default, &device);
    let y = Tensor::<B, 3>::random([size.b, size.t, 1], Distribution::Default, &device);
    let mut step = |model: Net<B>| {
        let loss = model.loss(x.clone(), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        (optimizer.step(1e-3, model, grads), loss)
    };
    let mut first = None;
    for _ in 0..WARMUP {
        let (next, loss) = step(model);
        model = next;
        let loss: f32 = loss.into_scalar().elem();
        first = first.or(Some(loss));
    }
    let mut rounds = Vec::new();
    let mut final_loss = f32::NAN;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let mut last = None;
        for _ in 0..ROUND_LEN {
            let (next, loss) = step(model);
            model = next;
            last = Some(loss);
        }
        let loss: f32 = last.expect("a step").into_scalar().elem();
        rounds.push(start.elapsed().as_secs_f64() * 1e3 / ROUND_LEN as f64);
        final_loss = loss;
    }
    rounds.sort_by(f64::total_cmp);
    (rank == 0).then(|| {
        (
            rounds[rounds.len() / 2],
            first.expect("a warmup step"),
            final_loss,
        )
    })
}

fn run<B>(world: usize, size: Size, stack: &str, device: impl Fn(usize) -> B::Device)
where
    B: AutodiffBackend + DistributedBackend,
{
    let devices: Vec<B::Device> = (0..world).map(device).collect();
    let config = DistributedConfig {
        all_reduce_op: ReduceOperation::Mean,
    };
    B::start_communication_server(&devices, config);
    let (ms, first, last) = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(r, device)| scope.spawn(move || rank::<B>(r, device.clone(), size)))
            .collect();
        let mut ms = None;
        for handle in handles {
            ms = ms.or(handle.join().expect("a rank panicked"));
        }
        ms.expect("rank 0's timing")
    });
    B::close_communication_server(&devices[0]);
    println!(
        "{}",
        serde_json::json!({"bench": "stock-ddp", "world": world, "size": format!("{}/{}/{}", size.b, size.t, size.h),
                           "stack": stack, "mode": "eager", "pipelined_ms": ms,
                           "first_loss": first, "last_loss": last})
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let world = value("--world")
        .map(|w| w.parse().expect("--world N"))
        .unwrap_or_else(|| <burn::backend::cuda::Cuda as Backend>::device_count(0));
    let size = value("--size").unwrap_or_else(|| "32/64/256".into());
    let parts: Vec<usize> = size.split('/').map(|p| p.parse().expect("b/t/h")).collect();
    let size = Size {
        b: parts[0],
        t: parts[1],
        h: parts[2],
    };
    let fusion = args.iter().any(|a| a == "--fusion");
    let ours = value("--runtime").as_deref() == Some("ours");
    let stock = CudaDevice::new;
    let graph = burn_graph_capture::runtime::CudaGraphDevice::new;
    match (ours, fusion) {
        (false, true) => {
            run::<Autodiff<burn::backend::Cuda>>(world, size, "stock burn-cuda (fusion)", stock)
        }
        (false, false) => run::<
            Autodiff<burn_cubecl::CubeBackend<cubecl_cuda::CudaRuntime, f32, i32, u8>>,
        >(world, size, "stock burn-cuda (no fusion)", stock),
        (true, true) => run::<Autodiff<burn_graph_capture::CudaFused>>(
            world,
            size,
            "CudaGraphRuntime (CudaFused)",
            graph,
        ),
        (true, false) => run::<Autodiff<burn_graph_capture::CudaCube>>(
            world,
            size,
            "CudaGraphRuntime (CudaCube)",
            graph,
        ),
    }
}
