//! The recurrences on `GraphCapture<B>`: `B`'s kernels (fused on the CubeCL stacks), each
//! direction recorded as one op, so that a capture session sees what it reads and
//! produces as it sees any other op's.

use burn::tensor::ops::FloatTensor;

use crate::backend::session::{OpRecorder, is_recording};
use crate::backend::{GraphBackend, GraphCapture};

/// `run` on `inputs`, recorded as the op `name` while a capture session records.
pub(crate) fn recorded<B: GraphBackend, const I: usize, const O: usize>(
    name: &'static str,
    inputs: [FloatTensor<GraphCapture<B>>; I],
    run: impl FnOnce([FloatTensor<B>; I]) -> [FloatTensor<B>; O],
) -> [FloatTensor<GraphCapture<B>>; O] {
    let recorder = is_recording().then(|| {
        let mut rec = OpRecorder::default();
        inputs.iter().for_each(|t| rec.tensor(t));
        rec
    });
    let outputs = run(inputs);
    if let Some(mut rec) = recorder {
        outputs.iter().for_each(|t| rec.output(t));
        rec.commit(name, None);
    }
    outputs
}
