//! `FusedLstm` against `nn::Lstm` on any autodiff backend: outputs, final states and
//! every gradient from the same weights, within 1e-5 relative. Shared by the CPU tests
//! (`integration`'s `fused_lstm`, as `common::fused_lstm_parity`) and the GPU tests
//! (`gpu_trainer`, through `#[path]`).

use burn::module::Param;
use burn::nn::{Lstm, LstmConfig, LstmState};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor, backend::Backend};
use burn_graph_capture::nn::{FusedLstm, LstmBackend};
use lstm_example::train::{load_bytes, to_bytes};

/// Declared beside this module by each test binary that includes it.
pub use super::tolerance::{Tolerance, assert_close_within};

/// Shapes of one case: batch, time, input, hidden, bias, layers.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub batch: usize,
    pub time: usize,
    pub input: usize,
    pub hidden: usize,
    pub bias: bool,
    pub layers: usize,
}

/// `nn::Lstm` layers with materialized weights (loaded from a record: Burn initializes
/// lazily, and a fused copy must see the same values).
pub fn reference_layers<A: AutodiffBackend>(case: Case) -> Vec<Lstm<A>> {
    (0..case.layers)
        .map(|layer| {
            let d_input = if layer == 0 { case.input } else { case.hidden };
            let config = LstmConfig::new(d_input, case.hidden, case.bias);
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

pub fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec().unwrap()
}

/// Output, final states and every gradient of both modules on one random problem,
/// each value within 1e-5.
pub fn compare<A: AutodiffBackend + LstmBackend>(case: Case) {
    compare_within::<A>(case, Tolerance::Each(1e-5));
}

/// [`compare`] under `tolerance`.
pub fn compare_within<A: AutodiffBackend + LstmBackend>(case: Case, tolerance: Tolerance) {
    let assert_close = |what: &str, a: &[f32], b: &[f32]| {
        assert_close_within(&format!("{case:?}: {what}"), a, b, tolerance)
    };
    let reference = reference_layers::<A>(case);
    let fused = FusedLstm::from_lstms(&reference).unwrap();
    let x = random::<A, 3>([case.batch, case.time, case.input]);
    let h0 = random::<A, 3>([case.layers, case.batch, case.hidden]);
    let c0 = random::<A, 3>([case.layers, case.batch, case.hidden]);
    let weights = (
        random::<A, 3>([case.batch, case.time, case.hidden]).detach(),
        random::<A, 3>([case.layers, case.batch, case.hidden]).detach(),
        random::<A, 3>([case.layers, case.batch, case.hidden]).detach(),
    );
    // A loss that reads the sequence and both final states.
    let loss = |out: Tensor<A, 3>, state: LstmState<A, 3>| {
        (out * weights.0.clone()).sum()
            + (state.hidden * weights.1.clone()).sum()
            + (state.cell * weights.2.clone()).sum()
    };

    // nn::Lstm, layer by layer.
    let mut input = x.clone();
    let (mut hiddens, mut cells) = (Vec::new(), Vec::new());
    for (index, layer) in reference.iter().enumerate() {
        let slice = |t: &Tensor<A, 3>| t.clone().narrow(0, index, 1).squeeze_dim(0);
        let (out, state) = layer.forward(input, Some(LstmState::new(slice(&c0), slice(&h0))));
        hiddens.push(state.hidden);
        cells.push(state.cell);
        input = out;
    }
    let expected_state = LstmState::new(Tensor::stack(cells, 0), Tensor::stack(hiddens, 0));
    let expected_out = input;
    let (out, state) = fused.forward(x.clone(), Some(LstmState::new(c0.clone(), h0.clone())));

    assert_close(
        "output",
        &values(out.clone()),
        &values(expected_out.clone()),
    );
    assert_close(
        "final hidden",
        &values(state.hidden.clone()),
        &values(expected_state.hidden.clone()),
    );
    assert_close(
        "final cell",
        &values(state.cell.clone()),
        &values(expected_state.cell.clone()),
    );

    let expected_grads = loss(expected_out, expected_state).backward();
    let grads = loss(out, state).backward();
    for (name, input) in [("x", &x), ("h0", &h0), ("c0", &c0)] {
        let expected = values(input.grad(&expected_grads).unwrap());
        assert_close(name, &values(input.grad(&grads).unwrap()), &expected);
    }
    // Parameter gradients, packed as the fused layer packs them.
    for (index, (layer, reference)) in fused.layers.iter().zip(&reference).enumerate() {
        let gates = [
            &reference.input_gate,
            &reference.forget_gate,
            &reference.cell_gate,
            &reference.output_gate,
        ];
        let packed_weight = |pick: fn(&burn::nn::GateController<A>) -> &Param<Tensor<A, 2>>| {
            let parts = gates
                .iter()
                .map(|g| pick(g).grad(&expected_grads).unwrap())
                .collect();
            values(Tensor::<A::InnerBackend, 2>::cat(parts, 1))
        };
        let input_weight = packed_weight(|g| &g.input_transform.weight);
        let hidden_weight = packed_weight(|g| &g.hidden_transform.weight);
        assert_close(
            &format!("layer {index} input weight"),
            &values(layer.input_weight.grad(&grads).unwrap()),
            &input_weight,
        );
        assert_close(
            &format!("layer {index} hidden weight"),
            &values(layer.hidden_weight.grad(&grads).unwrap()),
            &hidden_weight,
        );
        if case.bias {
            for (bias, pick) in [
                (
                    &layer.input_bias,
                    (|g: &burn::nn::GateController<A>| g.input_transform.bias.clone())
                        as fn(&_) -> _,
                ),
                (&layer.hidden_bias, |g: &burn::nn::GateController<A>| {
                    g.hidden_transform.bias.clone()
                }),
            ] {
                let parts = gates
                    .iter()
                    .map(|g| pick(g).unwrap().grad(&expected_grads).unwrap())
                    .collect();
                let expected = values(Tensor::<A::InnerBackend, 1>::cat(parts, 0));
                let got = values(bias.as_ref().unwrap().grad(&grads).unwrap());
                assert_close(&format!("layer {index} bias"), &got, &expected);
            }
        } else {
            assert!(layer.input_bias.is_none() && layer.hidden_bias.is_none());
        }
    }
}

/// The base case; the others change one thing each.
pub const BASE: Case = Case {
    batch: 3,
    time: 6,
    input: 4,
    hidden: 8,
    bias: true,
    layers: 1,
};
