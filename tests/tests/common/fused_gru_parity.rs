//! `FusedGru` against `nn::Gru` on any autodiff backend: outputs, final states and every
//! gradient from the same weights, within a tolerance (1e-5 relative unless a test says).
//! Shared by the CPU tests (`integration`'s `fused_gru`, as `common::fused_gru_parity`)
//! and the GPU tests (`gpu_trainer`, through `#[path]`).

use burn::module::Param;
use burn::nn::{GateController, Gru, GruConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor, backend::Backend};
use burn_graph_capture::nn::{FusedGru, GruBackend};
use lstm_example::train::{load_bytes, to_bytes};

/// Declared beside this module by each test binary that includes it.
pub use super::tolerance::{Tolerance, assert_close_within};

/// Shapes of one case: batch, time, input, hidden, bias, layers.
#[derive(Clone, Copy, Debug)]
pub struct GruCase {
    pub batch: usize,
    pub time: usize,
    pub input: usize,
    pub hidden: usize,
    pub bias: bool,
    pub layers: usize,
}

/// The base case; the others change one thing each.
pub const GRU_BASE: GruCase = GruCase {
    batch: 3,
    time: 6,
    input: 4,
    hidden: 8,
    bias: true,
    layers: 1,
};

/// `nn::Gru` layers with materialized weights (loaded from a record: Burn initializes
/// lazily, and a fused copy must see the same values).
pub fn reference_grus<A: AutodiffBackend>(case: GruCase) -> Vec<Gru<A>> {
    (0..case.layers)
        .map(|layer| {
            let d_input = if layer == 0 { case.input } else { case.hidden };
            let config = GruConfig::new(d_input, case.hidden, case.bias);
            let bytes = to_bytes(config.init::<burn::backend::Flex>(&Default::default()));
            load_bytes(
                config.init::<A>(&Default::default()),
                bytes,
                &Default::default(),
            )
        })
        .collect()
}

fn random<A: AutodiffBackend, const D: usize>(shape: [usize; D]) -> Tensor<A, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default()).require_grad()
}

fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec().unwrap()
}

/// Output, final states and every gradient of both modules on one random problem,
/// each value within 1e-5.
pub fn compare_gru<A: AutodiffBackend + GruBackend>(case: GruCase) {
    compare_gru_within::<A>(case, Tolerance::Each(1e-5));
}

/// [`compare_gru`] under `tolerance`.
pub fn compare_gru_within<A: AutodiffBackend + GruBackend>(case: GruCase, tolerance: Tolerance) {
    let assert_close = |what: &str, a: &[f32], b: &[f32]| {
        assert_close_within(&format!("{case:?}: {what}"), a, b, tolerance)
    };
    let reference = reference_grus::<A>(case);
    let fused = FusedGru::from_grus(&reference).unwrap();
    let x = random::<A, 3>([case.batch, case.time, case.input]);
    let h0 = random::<A, 3>([case.layers, case.batch, case.hidden]);
    let weights = (
        random::<A, 3>([case.batch, case.time, case.hidden]).detach(),
        random::<A, 3>([case.layers, case.batch, case.hidden]).detach(),
    );
    // A loss that reads the sequence and the final states.
    let loss = |out: Tensor<A, 3>, state: Tensor<A, 3>| {
        (out * weights.0.clone()).sum() + (state * weights.1.clone()).sum()
    };

    let mut input = x.clone();
    let mut finals = Vec::new();
    for (index, layer) in reference.iter().enumerate() {
        let h = h0.clone().narrow(0, index, 1).squeeze_dim(0);
        let out = layer.forward(input, Some(h));
        finals.push(out.clone().narrow(1, case.time - 1, 1).squeeze_dim::<2>(1));
        input = out;
    }
    let expected_state = Tensor::stack::<3>(finals, 0);
    let expected_out = input;
    let (out, state) = fused.forward(x.clone(), Some(h0.clone()));
    assert_close(
        "output",
        &values(out.clone()),
        &values(expected_out.clone()),
    );
    assert_close(
        "final state",
        &values(state.clone()),
        &values(expected_state.clone()),
    );

    let expected_grads = loss(expected_out, expected_state).backward();
    let grads = loss(out, state).backward();
    for (name, input) in [("x", &x), ("h0", &h0)] {
        let expected = values(input.grad(&expected_grads).unwrap());
        assert_close(name, &values(input.grad(&grads).unwrap()), &expected);
    }
    for (index, (layer, reference)) in fused.layers.iter().zip(&reference).enumerate() {
        let gates = [
            &reference.update_gate,
            &reference.reset_gate,
            &reference.new_gate,
        ];
        let packed = |pick: fn(&GateController<A>) -> &Param<Tensor<A, 2>>| {
            let parts = gates
                .iter()
                .map(|g| pick(g).grad(&expected_grads).unwrap())
                .collect();
            values(Tensor::<A::InnerBackend, 2>::cat(parts, 1))
        };
        assert_close(
            &format!("layer {index} input weight"),
            &values(layer.input_weight.grad(&grads).unwrap()),
            &packed(|g| &g.input_transform.weight),
        );
        assert_close(
            &format!("layer {index} hidden weight"),
            &values(layer.hidden_weight.grad(&grads).unwrap()),
            &packed(|g| &g.hidden_transform.weight),
        );
        type PickBias<A> = fn(&GateController<A>) -> Option<Param<Tensor<A, 1>>>;
        let biases: [(_, PickBias<A>); 2] = [
            (&layer.input_bias, |g| g.input_transform.bias.clone()),
            (&layer.hidden_bias, |g| g.hidden_transform.bias.clone()),
        ];
        for (side, (bias, pick)) in biases.into_iter().enumerate() {
            match bias {
                Some(bias) => {
                    let parts = gates
                        .iter()
                        .map(|g| pick(g).unwrap().grad(&expected_grads).unwrap())
                        .collect();
                    let expected = values(Tensor::<A::InnerBackend, 1>::cat(parts, 0));
                    let got = values(bias.grad(&grads).unwrap());
                    assert_close(&format!("layer {index} bias {side}"), &got, &expected);
                }
                None => assert!(!case.bias, "layer {index}: a bias went missing"),
            }
        }
    }
}
