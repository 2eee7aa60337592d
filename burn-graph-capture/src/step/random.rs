//! A trainer's generator (`rng`): its device state, pinned where graphs may read it, and
//! what its steps drew.
//!
//! Every step that runs the step closure, eager or recorded, draws from the same state
//! and then advances it on the device by the number of draws, so a replay draws what the
//! same step run eagerly would have drawn, and each step draws fresh numbers.

use burn::tensor::ops::IntTensor;
use burn_backend::DeviceOps;

use crate::backend::{Allocated, AllocationId, AnyTensor, GraphBackend, GraphError};
use crate::rng::scope::{DrawScope, Draws};
use crate::rng::seed;
use crate::rng::state::Words;

/// A trainer's generator.
pub(crate) struct TrainerRandom<G: GraphBackend> {
    device: G::Device,
    /// `[key, offset]` as four 32-bit words (`rng::state`).
    state: IntTensor<G>,
    /// Whether `state` is pinned: steps then write the advanced state into it, so that a
    /// graph reads and writes one address.
    pinned: bool,
    /// The seeding of the device this generator's stream came from.
    epoch: u64,
    /// What the latest step that ran the closure drew.
    last: Draws,
}

impl<G: GraphBackend> TrainerRandom<G> {
    /// A generator on the next stream of `device`'s seed (`rng::seed`), pinned where
    /// the device has graphs.
    pub(crate) fn new(device: &G::Device) -> Self {
        let stream = seed::take(device.id());
        let state = upload::<G>(stream.key, device);
        let (state, pinned) = match G::supports_hardware_graphs(device) {
            true => match G::pin(AnyTensor::Int(state.clone())) {
                Ok(AnyTensor::Int(pinned)) => (pinned, true),
                other => {
                    tracing::warn!(result = ?other.err(), "the generator state could not be pinned; steps that draw stay eager");
                    (state, false)
                }
            },
            false => (state, false),
        };
        Self {
            device: device.clone(),
            state,
            pinned,
            epoch: stream.epoch,
            last: Draws::default(),
        }
    }

    /// Runs a step with its random ops drawn from this generator; the draws are then
    /// [`advance`](Self::advance)'s to account for.
    pub(crate) fn draw_in<T>(&mut self, step: impl FnOnce() -> T) -> T {
        let scope = DrawScope::begin(self.state.clone());
        let out = step();
        self.last = scope.finish();
        out
    }

    /// Advances the state past the latest step's draws, on the device (inside a window,
    /// recorded). On failure the state is as before.
    pub(crate) fn advance(&mut self) -> Result<(), GraphError> {
        match self.advanced() {
            Some(next) => self.write(next),
            None => Ok(()),
        }
    }

    /// [`advance`](Self::advance) for an eager step, which must not fail.
    pub(crate) fn advance_eager(&mut self) {
        if let Some(next) = self.advanced() {
            self.write_or_unpin(next);
        }
    }

    /// Before a step: if the device was seeded since this generator's stream was
    /// taken, a fresh stream of the new seed, from offset 0.
    pub(crate) fn follow_seed(&mut self) {
        if seed::epoch(self.device.id()) == self.epoch {
            return;
        }
        let stream = seed::take(self.device.id());
        self.epoch = stream.epoch;
        self.write_or_unpin(upload::<G>(stream.key, &self.device));
    }

    /// The state's allocation where the trainer accounts for its reads (I7): pinned, or
    /// on a device without graphs, whose steps never replay.
    pub(crate) fn accounted(&self) -> Option<AllocationId> {
        let fixed = self.pinned || !G::supports_hardware_graphs(&self.device);
        fixed.then(|| self.state.allocation_id()).flatten()
    }

    /// The random ops the latest step that ran the closure drew from this generator.
    pub(crate) fn served(&self) -> &[String] {
        &self.last.served
    }

    /// The state after the latest step's draws, if it drew.
    fn advanced(&self) -> Option<IntTensor<G>> {
        (self.last.count > 0).then(|| G::advance_random(self.state.clone(), self.last.count))
    }

    /// [`write`](Self::write), outside any window: a state that cannot be written into
    /// its pin goes on unpinned (steps that draw then stay eager: its reads are not
    /// accounted for).
    fn write_or_unpin(&mut self, next: IntTensor<G>) {
        if let Err(error) = self.write(next.clone()) {
            tracing::warn!(%error, "the generator state could not be written into its pin; it goes on unpinned");
            self.state = next;
            self.pinned = false;
        }
    }

    fn write(&mut self, next: IntTensor<G>) -> Result<(), GraphError> {
        if self.pinned {
            G::copy_into(&AnyTensor::Int(self.state.clone()), &AnyTensor::Int(next))
        } else {
            self.state = next;
            Ok(())
        }
    }
}

/// A fresh state of `key` at offset 0, in the backend's int type.
fn upload<G: GraphBackend>(key: u64, device: &G::Device) -> IntTensor<G> {
    let words = Words { key, offset: 0 };
    let data = words
        .to_data(burn_backend::DType::I32)
        .expect("i32 holds the state's words");
    G::int_from_data(data, device)
}
