//! Every replay on both stacks (`CudaCube`, `CudaFused`) is traced: the step closure runs
//! at every step, each op matched against the graph's recording, and the graph launches
//! only if the whole step matched; a step that differs goes on eagerly from the first
//! difference. So a world of the closure that changes after the capture trains as plain
//! eager code (within the tolerance of every graphed run), with every replay traced: a
//! host loss weight changed at one step (with the default `verify_every`), a host coin
//! picking between two loss terms, a host branch between two constants of one shape, and
//! one between two views of one tensor with one shape. The same worlds untraced
//! (`Untraced` at the capture: the graph has no trace recording) diverge from plain
//! code: the trace is what catches them.

use burn::prelude::*;
use burn_graph_capture::{FallbackReason, GraphTrainerConfig, StepChange, StepMode, Untraced};

use crate::common::Diff;
use crate::common::{Batch, Model, Stack, loss};
use crate::inputs::{B, Run, check};
use crate::stale::{mask, replays, run_both, stale_steps};

const STEPS: usize = 60;

/// Replays a run with a host coin must reach at least: the first tails sends the shape
/// into a warmup of its other path, where tails steps are eager until that path graphs.
const REPLAYS_WITH_A_COIN: usize = 5;

/// How far two runs are apart: the largest relative difference of a loss or a final
/// parameter, and whether every one is equal bit for bit.
fn apart(graphed: &Run, eager: &Run) -> Diff {
    let losses = Diff::of(&graphed.losses, &eager.losses);
    let params = Diff::of(
        graphed.params.iter().flatten(),
        eager.params.iter().flatten(),
    );
    Diff {
        bit_exact: losses.bit_exact && params.bit_exact,
        max_rel: losses.max_rel.max(params.max_rel),
    }
}

/// The traced run equals plain code (as every graphed run must: `check`), and the
/// untraced one is far from it (a changed world replayed stale).
fn caught(case: &str, traced: &Run, untraced: &Run, eager: &Run) {
    check(case, traced, eager);
    let untraced = apart(untraced, eager);
    println!(
        "[{case}] traced: {:?}; untraced: {untraced:?}",
        apart(traced, eager)
    );
    assert!(untraced.max_rel > 1e-3, "{case}: untraced diverges");
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

/// Every replay of `run` followed a matched trace, and there were more than `least`.
fn every_replay_traced(case: &str, run: &Run, least: usize) {
    let report = run.report.as_ref().expect("a graphed run's report");
    let replayed = replays(run, 0..run.modes.len()) as u64;
    assert!(replayed > least as u64, "{case}: {replayed} replays");
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
    caught(case, &traced, &untraced, &eager);
    every_replay_traced(case, &traced, STEPS / 2);
    let stale = stale_steps(&traced, host_values);
    assert_eq!(stale.first(), Some(&30), "{case}: found at once");
    assert_eq!(
        traced.modes.last(),
        Some(&StepMode::Replayed),
        "{case}: the new value graphs beside the old"
    );
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
    caught(case, &traced, &untraced, &eager);
    every_replay_traced(case, &traced, REPLAYS_WITH_A_COIN);
}

/// A host branch between two masks of one shape, both held for the whole run: the op
/// sequence and host values are the same either way, only the tensor read differs.
fn a_branch_between_constants_of_one_shape_is_traced<G: Stack>() {
    let case = "branch between constants";
    let masks = [mask::<G>(0.5), mask::<G>(1.0)];
    let (traced, untraced, eager) = traced_and_untraced::<G, Tensor<B<G>, 3>>(
        case,
        move |step, _| masks[usize::from(step >= 30)].clone(),
        |_| true,
        |model, batch, mask| {
            ((model.forward(batch.x.clone()) - batch.y.clone()).powi_scalar(2) * mask.clone())
                .mean()
        },
    );
    caught(case, &traced, &untraced, &eager);
    every_replay_traced(case, &traced, STEPS / 2);
}

/// A host branch between two views of one tensor with one shape (the two halves of the
/// batch, both sliced at every step): the op sequence and host values are the same either
/// way, only where in one allocation the read lies differs.
fn a_branch_between_views_of_one_tensor_is_traced<G: Stack>() {
    let case = "branch between views";
    let (traced, untraced, eager) = traced_and_untraced::<G, usize>(
        case,
        |step, _| usize::from(step >= 30),
        |_| true,
        |model, batch, half| {
            let rows = batch.x.dims()[0] / 2;
            let halves = [
                batch.x.clone().narrow(0, 0, rows),
                batch.x.clone().narrow(0, rows, rows),
            ];
            let target = batch.y.clone().narrow(0, 0, rows);
            (model.forward(halves[*half].clone()) - target)
                .powi_scalar(2)
                .mean()
        },
    );
    caught(case, &traced, &untraced, &eager);
    every_replay_traced(case, &traced, STEPS / 2);
    assert_eq!(
        traced.modes.last(),
        Some(&StepMode::Replayed),
        "{case}: the other view's path graphs beside the first"
    );
}

/// Both outcomes of a host coin (70 % heads, seeded by the step) picking one of two loss
/// terms graph: the step that first differs keeps the graph of heads, tails warms up and
/// gets its own, and from then on the trace picks the graph of the path each step takes,
/// so every late step replays, on either outcome.
fn both_outcomes_of_a_host_coin_replay<G: Stack>() {
    let case = "both outcomes of a coin";
    const LONG: usize = 160;
    const LATE: usize = 40;
    let coin = |step: usize| (step.wrapping_mul(2_654_435_761) >> 7) % 10 < 7;
    let (traced, eager) = run_both::<G, bool>(
        LONG,
        GraphTrainerConfig::new(),
        move |step, _| coin(step),
        |_| true,
        |model, batch, heads| loss::<G>(model, batch) * if *heads { 1.0 } else { 0.25 },
    );
    println!("{case}: modes {:?}", traced.modes);
    check(case, &traced, &eager);
    every_replay_traced(case, &traced, LONG / 2);
    let late = LONG - LATE..LONG;
    assert!(late.clone().any(coin) && late.clone().any(|step| !coin(step)));
    let checks = late
        .clone()
        .filter(|&step| traced.modes[step] == StepMode::Eager(FallbackReason::ReplayCheck))
        .count();
    assert_eq!(
        replays(&traced, late) + checks,
        LATE,
        "{case}: every late step replays (or is the periodic check)"
    );
}

stack_tests!(
    both_outcomes_of_a_host_coin_replay,
    a_host_weight_changed_after_the_capture_is_traced,
    a_host_coin_is_traced,
    a_branch_between_constants_of_one_shape_is_traced,
    a_branch_between_views_of_one_tensor_is_traced,
);
