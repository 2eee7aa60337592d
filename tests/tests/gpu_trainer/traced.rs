//! Every replay on the plain stack (`CudaCube`) is traced: the step closure runs at
//! every step, each op matched against the graph's recording, and the graph launches
//! only if the whole step matched; a step that differs goes on eagerly from the first
//! difference. So a world of the closure that changes after the capture trains as
//! plain eager code, bit for bit, with every replay traced: a host loss weight changed
//! at one step (with the default `verify_every`), a host coin picking between two loss
//! terms, and a host branch between two constants of one shape. The same worlds
//! untraced (`Untraced` at the capture: the graph has no trace recording) diverge from
//! plain code: the trace is what catches them. The fusion stack has no stand-ins yet,
//! so its replays stay untraced and it is not instantiated here.

use burn::prelude::*;
use burn_graph_capture::{GraphTrainerConfig, StepChange, Untraced};

use crate::common::{Batch, Model, SMALL, Stack, device, loss};
use crate::inputs::{B, Run};
use crate::stale::{replays, run_both, stale_steps};

const STEPS: usize = 60;

/// Whether two runs trained alike, bit for bit: every loss and every final parameter.
fn bit_equal(graphed: &Run, eager: &Run) -> bool {
    let bits = |values: &mut dyn Iterator<Item = &f32>| -> Vec<u32> {
        values.map(|v| v.to_bits()).collect()
    };
    bits(&mut graphed.losses.iter()) == bits(&mut eager.losses.iter())
        && bits(&mut graphed.params.iter().flatten()) == bits(&mut eager.params.iter().flatten())
}

/// Both runs of a world, traced and untraced, each against plain code.
fn traced_and_untraced<G: Stack, W>(
    case: &str,
    world: impl Fn(usize, &Model<G>) -> W + Clone,
    change: impl Fn(usize) -> bool + Clone,
    step_loss: impl Fn(&Model<G>, &Batch<G>, &W) -> Tensor<B<G>, 1> + Clone,
) -> (Run, Run, Run) {
    let config = GraphTrainerConfig::new();
    let (traced, eager) = run_both::<G, W>(
        STEPS,
        config.clone(),
        world.clone(),
        change.clone(),
        step_loss.clone(),
    );
    let untraced = {
        let _untraced = Untraced::on();
        run_both::<G, W>(STEPS, config, world, change, step_loss).0
    };
    println!("{case} traced: modes {:?}", traced.modes);
    println!("{case} untraced: modes {:?}", untraced.modes);
    (traced, untraced, eager)
}

/// Every replay of `run` followed a matched trace, and there were some.
fn every_replay_traced(case: &str, run: &Run) {
    let report = run.report.as_ref().expect("a graphed run's report");
    let replayed = replays(run, 0..run.modes.len()) as u64;
    assert!(replayed > STEPS as u64 / 2, "{case}: {replayed} replays");
    assert_eq!(
        report.traces_matched, replayed,
        "{case}: every replay follows a matched trace"
    );
}

fn host_values(change: &StepChange) -> bool {
    matches!(change, StepChange::HostValues { .. })
}

/// An annealing schedule written as a host scalar: the loss weight halves at step 30.
fn a_host_weight_changed_after_the_capture_is_traced<G: Stack>() {
    let case = "host weight";
    let (traced, untraced, eager) = traced_and_untraced::<G, f32>(
        case,
        |step, _| if step < 30 { 1.0 } else { 0.5 },
        |step| step == 30,
        |model, batch, weight| loss::<G>(model, batch) * *weight,
    );
    assert!(
        bit_equal(&traced, &eager),
        "{case}: traced equals plain code"
    );
    every_replay_traced(case, &traced);
    assert_eq!(
        stale_steps(&traced, host_values),
        [30],
        "{case}: found at once"
    );
    assert!(!bit_equal(&untraced, &eager), "{case}: untraced diverges");
}

/// Teacher forcing's pattern: a host coin (90 % heads, seeded by the step) picks one of
/// two loss terms of one op sequence but other host values.
fn a_host_coin_is_traced<G: Stack>() {
    let case = "host coin";
    let coin = |step: usize| !(step.wrapping_mul(2_654_435_761) >> 7).is_multiple_of(10);
    let (traced, untraced, eager) = traced_and_untraced::<G, bool>(
        case,
        move |step, _| coin(step),
        |_| true,
        |model, batch, heads| loss::<G>(model, batch) * if *heads { 1.0 } else { 0.25 },
    );
    let tails = (0..STEPS).filter(|&step| !coin(step)).count();
    assert!(tails > 2, "{case}: the coin shows tails ({tails})");
    assert!(
        bit_equal(&traced, &eager),
        "{case}: traced equals plain code"
    );
    every_replay_traced(case, &traced);
    assert!(!bit_equal(&untraced, &eager), "{case}: untraced diverges");
}

/// A host branch between two masks of one shape, both held for the whole run: the op
/// sequence and host values are the same either way, only the tensor read differs.
fn a_branch_between_constants_of_one_shape_is_traced<G: Stack>() {
    let case = "branch between constants";
    let mask = |scale: f32| {
        let weights: Vec<f32> = (0..SMALL.batch * SMALL.time)
            .map(|i| scale + (i % 3) as f32 * 0.25)
            .collect();
        Tensor::<B<G>, 3>::from_data(
            TensorData::new(weights, [SMALL.batch, SMALL.time, 1]),
            &device(),
        )
    };
    let masks = [mask(0.5), mask(1.0)];
    let (traced, untraced, eager) = traced_and_untraced::<G, Tensor<B<G>, 3>>(
        case,
        move |step, _| masks[usize::from(step >= 30)].clone(),
        |_| true,
        |model, batch, mask| {
            ((model.forward(batch.x.clone()) - batch.y.clone()).powi_scalar(2) * mask.clone())
                .mean()
        },
    );
    assert!(
        bit_equal(&traced, &eager),
        "{case}: traced equals plain code"
    );
    every_replay_traced(case, &traced);
    assert!(!bit_equal(&untraced, &eager), "{case}: untraced diverges");
}

mod cube {
    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn a_host_weight_changed_after_the_capture_is_traced() {
        crate::common::trace_from_env();
        super::a_host_weight_changed_after_the_capture_is_traced::<burn_graph_capture::CudaCube>();
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn a_host_coin_is_traced() {
        crate::common::trace_from_env();
        super::a_host_coin_is_traced::<burn_graph_capture::CudaCube>();
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn a_branch_between_constants_of_one_shape_is_traced() {
        crate::common::trace_from_env();
        super::a_branch_between_constants_of_one_shape_is_traced::<burn_graph_capture::CudaCube>();
    }
}
