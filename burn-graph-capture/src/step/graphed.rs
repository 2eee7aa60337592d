//! Capturing a step into a graph and replaying it (backends with hardware graphs).
//!
//! Capture, in order: pin parameters and optimizer state (once), pin a copy of the
//! batch as the graph's static input, open the window, run the step on the static input,
//! copy the new values into the pinned buffers (recorded too), close the window, then
//! launch the graph once: nothing recorded in a window runs until it is launched.
//! Replay: check that the model still sits on the pinned buffers, copy the batch into
//! the static input, launch. Every failure leaves the pre-step values in the pinned
//! buffers, so the step can run eagerly instead, with the reason.

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_backend::tensor::FloatTensor;

use super::input::{InputKey, StepInput};
use super::mode::{FallbackReason, StepMode};
use super::pinning::Pinned;
use super::trainer::{GraphTrainer, Loss, TrainBackend};
use crate::backend::{CaptureSession, GraphBackend, GraphError};
use crate::optim::CapturableOptimizer;

/// A graph with the static buffers it reads and writes.
pub(crate) struct CapturedStep<G: GraphBackend> {
    graph: G::Graph,
    /// Pinned copies of the batch tensors, in `StepInput::float_tensors` order.
    inputs: Vec<FloatTensor<G>>,
    /// The loss as the graph writes it; overwritten by every replay.
    loss: FloatTensor<G>,
}

/// Why a graph step did not happen; the step then runs eagerly.
pub(crate) enum Fallback {
    /// This shape stays eager.
    Shape(FallbackReason),
    /// Every shape stays eager.
    Trainer(FallbackReason),
    /// Pinned buffers changed: graphs were dropped; the next step captures again.
    Repin,
}

/// A copy of `tensor` in a fresh buffer: replays overwrite the graph's own loss buffer.
fn detached_copy<G: GraphBackend>(tensor: &FloatTensor<G>) -> Loss<G> {
    let inner =
        Tensor::<crate::GraphCapture<G>, 1>::from_primitive(TensorPrimitive::Float(tensor.clone()));
    Tensor::from_inner(inner.mul_scalar(1.0))
}

impl<G, M, O, I, F> GraphTrainer<G, M, O, I, F>
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>>,
    O: CapturableOptimizer<M, TrainBackend<G>>,
    I: StepInput<TrainBackend<G>>,
    F: FnMut(&M, &I) -> Tensor<TrainBackend<G>, 1>,
{
    /// Pins the model and optimizer state unless they already are.
    pub(super) fn ensure_pinned(&mut self) -> Result<(), Fallback> {
        if self.pinned.is_some() {
            return Ok(());
        }
        let model = self.model.take().expect("checked by `step`");
        let (model, pinned) = match Pinned::pin(model.clone(), &mut self.optimizer) {
            Ok(done) => done,
            Err(error) => {
                self.model = Some(model);
                return Err(Fallback::Trainer(FallbackReason::Graph(error)));
            }
        };
        self.report.pinned_bytes = pinned.bytes;
        self.model = Some(model);
        self.pinned = Some(pinned);
        self.pins_verified = true;
        self.register_buffers();
        Ok(())
    }

    /// Checks that the model and optimizer still sit on the pinned buffers; if not,
    /// drops every graph (before the buffers they use) and the pins.
    pub(super) fn check_pins(&mut self) -> Result<(), Fallback> {
        if self.pins_verified {
            return Ok(());
        }
        let (Some(pinned), Some(model)) = (&self.pinned, &self.model) else {
            return Ok(());
        };
        if pinned.unchanged(model, &mut self.optimizer) {
            self.pins_verified = true;
            return Ok(());
        }
        self.unpin();
        self.report.recaptures += 1;
        if self.report.recaptures > self.config.max_recaptures {
            return Err(Fallback::Trainer(FallbackReason::RecaptureLimit));
        }
        Err(Fallback::Repin)
    }

    /// Drops every graph (before the buffers they use) and the pins, so that no step
    /// writes into the pinned buffers any more; graphed shapes capture again later.
    pub(super) fn unpin(&mut self) {
        if self.pinned.is_some() {
            self.cache.drop_graphs();
            self.pinned = None;
            self.report.pinned_bytes = 0;
        }
    }

    /// Records the step for `key` into a graph and launches it once.
    pub(super) fn capture_step(
        &mut self,
        key: &InputKey,
        batch: &I,
    ) -> Result<(Loss<G>, StepMode), Fallback> {
        self.check_pins()?;
        self.ensure_pinned()?;
        let shape_error = |error| Fallback::Shape(FallbackReason::Graph(error));
        let inputs = batch
            .float_tensors()
            .into_iter()
            .map(G::pin)
            .collect::<Result<Vec<_>, _>>()
            .map_err(shape_error)?;
        let static_batch = batch.with_float_tensors(&mut inputs.clone().into_iter());

        let started = Instant::now();
        let device = self.device.clone();
        let session = CaptureSession::begin();
        let captured = G::capture(&device, || self.record_step(&static_batch));
        let recording = session.finish();
        let (recorded, graph) = captured.map_err(shape_error)?;
        let closed = recorded.and_then(|loss| graph.map(|graph| (graph, loss)));
        let pinned = self.pinned.as_ref().expect("pinned above");
        let (graph, loss) = match closed {
            Ok(done) => done,
            Err(error) => {
                // Nothing recorded ran: the pinned buffers hold the pre-step values.
                let model = self.model.take().expect("restored below");
                self.model = Some(pinned.reseat(model, &mut self.optimizer));
                return Err(shape_error(error));
            }
        };
        if let Some(breaker) = recording.breakers.into_iter().next() {
            drop(graph);
            let model = self.model.take().expect("restored below");
            self.model = Some(pinned.reseat(model, &mut self.optimizer));
            return Err(Fallback::Shape(FallbackReason::CaptureBreaker(breaker)));
        }
        G::replay(&graph).map_err(|e| Fallback::Trainer(FallbackReason::Graph(e)))?;
        self.report.capture_ms += started.elapsed().as_secs_f64() * 1e3;
        let output = detached_copy::<G>(&loss);
        self.cache.captured(
            key,
            CapturedStep {
                graph,
                inputs,
                loss,
            },
        );
        Ok((output, StepMode::Captured))
    }

    /// The body of a captured step: loss, backward, update, write-back into the pins.
    fn record_step(&mut self, batch: &I) -> Result<FloatTensor<G>, GraphError> {
        let model = self.model.as_ref().expect("checked by `step`");
        let loss = (self.step_fn)(model, batch);
        let grads = GradientsParams::from_grads(loss.backward(), model);
        let model = self.model.take().expect("checked by `step`");
        let updated = self.optimizer.step(model, grads);
        let pinned = self.pinned.as_ref().expect("pinned before capture");
        match pinned.write_back(updated.clone(), &mut self.optimizer) {
            Ok(model) => self.model = Some(model),
            Err(error) => {
                self.model = Some(updated);
                return Err(error);
            }
        }
        Ok(loss.inner().into_primitive().tensor())
    }

    /// Replays the graph of `key` on `batch`.
    pub(super) fn replay_step(
        &mut self,
        key: &InputKey,
        batch: &I,
    ) -> Result<(Loss<G>, StepMode), Fallback> {
        self.check_pins()?;
        let Some(step) = self.cache.graph(key) else {
            return Err(Fallback::Repin);
        };
        let fatal = |error| Fallback::Trainer(FallbackReason::Graph(error));
        for (input, tensor) in step.inputs.iter().zip(batch.float_tensors()) {
            G::copy_into(input, &tensor).map_err(fatal)?;
        }
        G::replay(&step.graph).map_err(fatal)?;
        Ok((detached_copy::<G>(&step.loss), StepMode::Replayed))
    }

    /// Writes an eager step's results into the pinned buffers, if the trainer has any.
    /// On failure the pins are dropped (graphs first) and training goes on unpinned.
    pub(super) fn write_back_eager(&mut self) {
        let Some(pinned) = &self.pinned else {
            return;
        };
        let Some(model) = self.model.take() else {
            return;
        };
        match pinned.write_back(model.clone(), &mut self.optimizer) {
            Ok(model) => self.model = Some(model),
            Err(error) => {
                tracing::warn!(trainer = self.id.0, %error, "write-back failed; dropping graphs and pins");
                self.unpin();
                self.model = Some(model);
            }
        }
    }

    /// Sets the learning rate in the pinned buffer; false when nothing is pinned.
    pub(super) fn write_lr(&mut self, lr: f64) -> bool {
        let Some(target) = self.pinned.as_ref().and_then(Pinned::lr) else {
            return false;
        };
        let value = Tensor::<crate::GraphCapture<G>, 1>::from_floats([lr as f32], &self.device);
        G::copy_into(target, &value.into_primitive().tensor()).is_ok()
    }
}
