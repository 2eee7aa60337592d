//! Errors for bad input to a step. The trainer stays usable after each of them, except
//! [`StepError::DataParallel`]: a failed group ends data-parallel training.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::backend::TensorKind;
use crate::parallel::DistError;

/// A step that was refused before it changed anything. Serializable, so that the ranks
/// of a data-parallel group can tell each other why they refused a step.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
pub enum StepError {
    /// A batch tensor lives on another device than the model. The devices are kept as
    /// the backend prints them (this error is not generic over the backend).
    #[error("batch tensor {index} is on {found}, the model is on {expected}")]
    WrongDevice {
        /// Position of the tensor in the batch.
        index: usize,
        /// The model's device.
        expected: String,
        /// The tensor's device.
        found: String,
    },
    /// The batch has no tensors, or a tensor with no elements.
    #[error("empty batch: {0}")]
    EmptyBatch(EmptyBatch),
    /// The step closure returned a loss with more than one element.
    #[error("the step closure must return a scalar loss, got shape {shape:?}")]
    NonScalarLoss {
        /// Shape of the returned loss.
        shape: Vec<usize>,
    },
    /// The optimizer holds state for parameters the model does not have, or state of
    /// another size than its parameter: a record saved with another model. Nothing ran;
    /// put the matching model in with `put_model`, or build the trainer with the
    /// optimizer record saved with this model.
    #[error(
        "the optimizer state does not fit the model: {foreign} parameter(s) with state \
         are not in the model, {misshapen} have state of another size; was the optimizer \
         record saved with another model?"
    )]
    OptimizerStateMismatch {
        /// Parameters with state that the model does not have.
        foreign: usize,
        /// Parameters whose state has another number of elements.
        misshapen: usize,
    },
    /// The model was taken out with `take_model` and not put back.
    #[error("the model was taken out of the trainer; put it back with `put_model`")]
    ModelTakenOut,
    /// Data-parallel training: another rank refused this step (bad input there), so no
    /// rank ran it. Every rank stays usable.
    #[error("rank {rank} refused this step: {error}")]
    PeerRefused {
        /// The lowest refusing rank.
        rank: usize,
        /// Its error.
        #[source]
        error: Box<StepError>,
    },
    /// Data-parallel training failed: a rank was lost, left, stayed away past the
    /// timeout, or failed inside a step; or the group was aborted. Every later step
    /// returns this too. The model's last step may hold a partial average (a collective
    /// cut short): resume from a checkpoint, with a new group.
    #[error("data-parallel training failed: {0}")]
    DataParallel(#[from] DistError),
}

/// What is empty about an empty batch.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum EmptyBatch {
    /// The batch lists no tensors.
    #[error("the batch has no tensors")]
    NoTensors,
    /// A tensor of the batch has no elements.
    #[error("{kind} tensor {index} has shape {shape:?}")]
    EmptyTensor {
        /// Its kind.
        kind: TensorKind,
        /// Its position in the batch.
        index: usize,
        /// Its shape.
        shape: Vec<usize>,
    },
}
