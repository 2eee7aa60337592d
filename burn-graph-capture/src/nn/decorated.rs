//! The recurrences on `GraphCapture<B>`: `B`'s kernels (fused on the CubeCL stacks), each
//! direction recorded as one op, so that a capture session sees what it reads and
//! produces as it sees any other op's.

use burn::tensor::ops::FloatTensor;

use crate::backend::emulated::program::{self, StandInValue};
use crate::backend::session::is_recording;
use crate::backend::trace;
use crate::backend::{GraphBackend, GraphCapture};

/// `run` on `inputs`, recorded as the op `name` while a capture session records (and
/// as a step of an emulated graph's program, which runs it again at replay).
pub(crate) fn recorded<B: GraphBackend, const I: usize, const O: usize>(
    name: &'static str,
    inputs: [FloatTensor<GraphCapture<B>>; I],
    run: impl Fn([FloatTensor<B>; I]) -> [FloatTensor<B>; O] + Send + Sync + 'static,
) -> [FloatTensor<GraphCapture<B>>; O] {
    let recorder = is_recording().then(|| {
        let mut rec = trace::recorder();
        inputs.iter().for_each(|t| rec.tensor(t));
        let kept = program::recording().then(|| inputs.each_ref().map(|t| program::input(name, t)));
        (rec, kept)
    });
    if let Some((rec, _)) = &recorder
        && trace::active()
    {
        let keys: trace::Inputs<'_> = inputs.iter().map(trace::input).collect();
        if let Some(outputs) = trace::matched(name, rec, None, &keys, |stand_ins| {
            std::array::from_fn(|index| trace::hand_out(stand_ins, index))
        }) {
            return outputs;
        }
    }
    let outputs = run(inputs);
    if let Some((mut rec, kept)) = recorder {
        outputs.iter().for_each(|t| rec.output(t));
        if let Some(kept) = kept {
            let slots = outputs.each_ref().map(|t| program::output(name, t));
            let stand_ins = outputs
                .iter()
                .map(StandInValue::of)
                .collect::<Option<Vec<_>>>();
            let record = rec.op_record(name);
            program::push_traced(
                name,
                Box::new(move |env| {
                    let mut inputs = Vec::with_capacity(I);
                    for slot in &kept {
                        inputs.push(env.take::<FloatTensor<B>>(slot)?);
                    }
                    let inputs: [FloatTensor<B>; I] = inputs
                        .try_into()
                        .unwrap_or_else(|_| unreachable!("one value per input"));
                    for (slot, output) in slots.iter().zip(run(inputs)) {
                        env.bind(slot, output);
                    }
                    Ok(())
                }),
                record,
                true,
                stand_ins,
            );
        }
        rec.commit(name, None);
    }
    outputs
}
