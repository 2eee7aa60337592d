//! Parameters and optimizer state at fixed addresses (I2), and the seating of a
//! learner on them.
//!
//! A replay reads and writes the addresses it was captured with. The trainer therefore
//! pins every parameter and optimizer-state tensor once, and after every step, captured
//! or eager, copies the new values back into the pinned buffers and re-seats the model
//! and the optimizer on them: step k+1 reads what step k wrote, at the same address.
//! Seating lives here alone, so that every path onto the pins copies and re-seats alike.

use std::collections::BTreeMap;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};
use burn_backend::tensor::FloatTensor;

use super::learner::{Learner, retie};
use crate::backend::{
    Allocated, AllocationId, AnyTensor, BufferId, CopyMismatch, GraphBackend, GraphError,
    TensorKind, TrainBackend,
};
use crate::optim::{CapturableOptimizer, StateSlot};

/// The pinned buffers of one trainer.
pub(crate) struct Pinned<G: GraphBackend> {
    params: BTreeMap<ParamId, FloatTensor<G>>,
    /// Optimizer state, in `visit_state` order.
    state: Vec<FloatTensor<G>>,
    /// Index of the learning rate in `state`.
    lr: Option<usize>,
    /// Identities at pin time: parameters (by id order), then state.
    ids: Vec<Option<BufferId>>,
    /// Bytes held in the arena.
    pub(crate) bytes: u64,
}

impl<G: GraphBackend> Pinned<G> {
    /// Pins the learner's parameters and optimizer state, and seats both on the pins.
    pub(crate) fn pin_learner<M, O>(learner: &mut Learner<M, O>) -> Result<Self, GraphError>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let (model, optimizer) = learner.parts_mut();
        let (seated, pins) = Self::pin(model.clone(), optimizer)?;
        learner.update(|_, _| seated);
        Ok(pins)
    }

    /// Seats the learner's model on the pins: its values copied into them, its tensors
    /// (and the optimizer's) re-seated on them. If a copy fails, the learner keeps its
    /// model as it is, unpinned. Inside a capture window the copies are recorded too.
    pub(crate) fn seat<M, O>(&self, learner: &mut Learner<M, O>) -> Result<(), GraphError>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let model = learner.model().clone();
        let mut failed = None;
        learner.update(
            |_, optimizer| match self.write_back(model.clone(), optimizer) {
                Ok(seated) => seated,
                Err(error) => {
                    failed = Some(error);
                    model
                }
            },
        );
        failed.map_or(Ok(()), Err)
    }

    /// Puts the learner back on the pins without copying: for a step that ran nothing,
    /// whose values the pins still hold.
    pub(crate) fn reseat_learner<M, O>(&self, learner: &mut Learner<M, O>)
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        learner.update(|model, optimizer| self.reseat(model, optimizer));
    }

    /// Pins `model`'s parameters and `optimizer`'s state; returns the model re-seated on
    /// the pinned copies (the optimizer is re-seated in place).
    fn pin<M, O>(model: M, optimizer: &mut O) -> Result<(M, Self), GraphError>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let mut params = BTreeMap::new();
        for (id, tensor) in parameters::<G, M>(&model) {
            params.insert(id, pin_float::<G>(tensor)?);
        }
        let mut state = Vec::new();
        let mut lr = None;
        let mut error = None;
        optimizer.visit_state(&mut |slot, tensor| {
            if slot == StateSlot::LearningRate {
                lr = Some(state.len());
            }
            match pin_float::<G>(primitive(tensor)) {
                Ok(pinned) => state.push(pinned),
                Err(e) => error = Some(e),
            }
        });
        if let Some(error) = error {
            return Err(error);
        }
        let bytes = params.values().chain(&state).map(byte_size::<G>).sum();
        let mut pinned = Self {
            params,
            state,
            lr,
            ids: Vec::new(),
            bytes,
        };
        pinned.ids = pinned.own_ids();
        let model = pinned.reseat(model, optimizer);
        Ok((model, pinned))
    }

    /// True when the model and the optimizer still sit on exactly the pinned buffers.
    pub(crate) fn unchanged<M, O>(&self, model: &M, optimizer: &mut O) -> bool
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let ids: Vec<_> = buffers(model, optimizer)
            .iter()
            .map(buffer_id::<G>)
            .collect();
        ids == self.ids
    }

    /// Copies the new values of `model` and `optimizer` into the pinned buffers, then
    /// re-seats both on them. Inside a capture window the copies are recorded too.
    fn write_back<M, O>(&self, model: M, optimizer: &mut O) -> Result<M, GraphError>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        for (id, tensor) in parameters::<G, M>(&model) {
            let pinned = self
                .params
                .get(&id)
                .ok_or_else(|| GraphError::from(CopyMismatch::NotPinned(id.to_string())))?;
            write_pinned::<G>(pinned, &tensor)?;
        }
        let mut index = 0;
        let mut result = Ok(());
        optimizer.visit_state(&mut |_, tensor| {
            let copied = match self.state.get(index) {
                Some(pinned) => write_pinned::<G>(pinned, &primitive(tensor)),
                None => Err(CopyMismatch::StateGrew.into()),
            };
            if result.is_ok() {
                result = copied;
            }
            index += 1;
        });
        result?;
        Ok(self.reseat(model, optimizer))
    }

    /// Points `model` and `optimizer` at the pinned buffers, without copying.
    fn reseat<M, O>(&self, model: M, optimizer: &mut O) -> M
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let mut index = 0;
        optimizer.visit_state(&mut |_, tensor| {
            if let Some(pinned) = self.state.get(index) {
                *tensor = Tensor::from_primitive(TensorPrimitive::Float(pinned.clone()));
            }
            index += 1;
        });
        // One autodiff leaf per pinned buffer, however many fields hold its parameter.
        retie(model.map(&mut Reseat::<G> {
            params: &self.params,
        }))
    }

    /// The pinned learning-rate buffer.
    pub(crate) fn lr(&self) -> Option<&FloatTensor<G>> {
        self.lr.and_then(|i| self.state.get(i))
    }

    /// The allocations of the pinned buffers, which steps may read (the guard).
    pub(crate) fn allocations(&self) -> impl Iterator<Item = Option<AllocationId>> + '_ {
        self.params
            .values()
            .chain(&self.state)
            .map(Allocated::allocation_id)
    }

    fn own_ids(&self) -> Vec<Option<BufferId>> {
        self.params
            .values()
            .chain(&self.state)
            .map(buffer_id::<G>)
            .collect()
    }
}

/// Where a trainer's pins are in their life: one state at a time, so that no check or
/// seat can be claimed of pins that are not there.
pub(crate) enum Pins<G: GraphBackend> {
    /// Nothing pinned: steps write into no pins, and lent tensors need no copies.
    Unpinned,
    /// The model and optimizer sit on `pins`. `checked`: known to since they last
    /// entered the trainer; nothing else moves them off (the trainer never lends its
    /// tensors out), so graph steps skip the identity check while it holds.
    Seated { pins: Pinned<G>, checked: bool },
    /// A model put in (`put_model`) that does not sit on `pins` yet: its next eager
    /// step's write-back, or the next graph step, seats it. `checked` is what the seated
    /// state had; an eager write-back keeps it (a graph step seats and checks at once).
    Unseated { pins: Pinned<G>, checked: bool },
}

impl<G: GraphBackend> Pins<G> {
    /// The pins, where there are any.
    pub(crate) fn get(&self) -> Option<&Pinned<G>> {
        match self {
            Pins::Seated { pins, .. } | Pins::Unseated { pins, .. } => Some(pins),
            Pins::Unpinned => None,
        }
    }

    pub(crate) fn is_pinned(&self) -> bool {
        self.get().is_some()
    }

    /// Pins the learner and seats it (checked: it sits on what was just pinned); returns
    /// the bytes pinned. Only without pins.
    pub(crate) fn pin<M, O>(&mut self, learner: &mut Learner<M, O>) -> Result<u64, GraphError>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        debug_assert!(!self.is_pinned(), "pinning over pins");
        let pins = Pinned::pin_learner(learner)?;
        let bytes = pins.bytes;
        *self = Pins::Seated {
            pins,
            checked: true,
        };
        Ok(bytes)
    }

    /// Drops the pins; false when there were none.
    pub(crate) fn unpin(&mut self) -> bool {
        if !self.is_pinned() {
            return false;
        }
        *self = Pins::Unpinned;
        true
    }

    /// A model was put in: it does not sit on the pins, if any (false without).
    pub(crate) fn put_back(&mut self) -> bool {
        let old = std::mem::replace(self, Pins::Unpinned);
        *self = match old {
            Pins::Seated { pins, checked } | Pins::Unseated { pins, checked } => {
                Pins::Unseated { pins, checked }
            }
            other => other,
        };
        self.is_pinned()
    }

    /// The buffers may have left the pins (a new learning-rate tensor): the next graph
    /// step checks them.
    pub(crate) fn recheck(&mut self) {
        if let Pins::Seated { checked, .. } | Pins::Unseated { checked, .. } = self {
            *checked = false;
        }
    }

    /// A seated learner is known to sit on the pins.
    pub(crate) fn mark_checked(&mut self) {
        if let Pins::Seated { checked, .. } = self {
            *checked = true;
        }
    }

    pub(crate) fn is_unseated(&self) -> bool {
        matches!(self, Pins::Unseated { .. })
    }

    /// Seats the learner's model on the pins, if any ([`Pinned::seat`]): an unseated
    /// model is seated then. On failure nothing changes here: the caller drops the pins.
    pub(crate) fn seat<M, O>(&mut self, learner: &mut Learner<M, O>) -> Result<(), GraphError>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let Some(pins) = self.get() else {
            return Ok(());
        };
        pins.seat(learner)?;
        let old = std::mem::replace(self, Pins::Unpinned);
        *self = match old {
            Pins::Unseated { pins, checked } => Pins::Seated { pins, checked },
            other => other,
        };
        Ok(())
    }

    /// Whether the learner sits on the pins (trivially, without pins): known while
    /// checked, else checked now by buffer identity, a pass remembered. An unseated
    /// model does not.
    pub(crate) fn still_seated<M, O>(&mut self, learner: &mut Learner<M, O>) -> bool
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        match self {
            Pins::Unpinned => true,
            Pins::Unseated { .. } => false,
            Pins::Seated { checked: true, .. } => true,
            Pins::Seated { pins, checked } => {
                let (model, optimizer) = learner.parts_mut();
                *checked = pins.unchanged(model, optimizer);
                *checked
            }
        }
    }
}

/// Pins a float tensor.
fn pin_float<G: GraphBackend>(tensor: FloatTensor<G>) -> Result<FloatTensor<G>, GraphError> {
    G::pin(AnyTensor::Float(tensor))?
        .into_float()
        .ok_or_else(|| CopyMismatch::PinChangedKind(TensorKind::Float).into())
}

/// Copies `src` into the pinned `dst`, unless `src` already is that buffer (the
/// learning rate that `set_lr` wrote in place, state nothing replaced): a copy onto
/// itself would overlap.
fn write_pinned<G: GraphBackend>(
    dst: &FloatTensor<G>,
    src: &FloatTensor<G>,
) -> Result<(), GraphError> {
    let same = dst.allocation_id().is_some() && dst.allocation_id() == src.allocation_id();
    if same {
        Ok(())
    } else {
        copy_float::<G>(dst, src)
    }
}

/// Copies a float tensor into a pinned one.
pub(crate) fn copy_float<G: GraphBackend>(
    dst: &FloatTensor<G>,
    src: &FloatTensor<G>,
) -> Result<(), GraphError> {
    G::copy_into(
        &AnyTensor::Float(dst.clone()),
        &AnyTensor::Float(src.clone()),
    )
}

/// The address of a float tensor's buffer.
pub(crate) fn buffer_id<G: GraphBackend>(tensor: &FloatTensor<G>) -> Option<BufferId> {
    G::buffer_id(&AnyTensor::Float(tensor.clone()))
}

fn primitive<G: GraphBackend>(tensor: &Tensor<crate::GraphCapture<G>, 1>) -> FloatTensor<G> {
    tensor.clone().into_primitive().tensor()
}

fn byte_size<G: GraphBackend>(tensor: &FloatTensor<G>) -> u64 {
    (tensor.shape().num_elements() * tensor.dtype().size()) as u64
}

/// Every parameter (by `ParamId`) and then every optimizer-state tensor (in
/// `visit_state` order), as inner primitives: the buffers a trainer registers and pins,
/// in the order `Pinned` records their identities.
pub(super) fn buffers<G, M, O>(model: &M, optimizer: &mut O) -> Vec<FloatTensor<G>>
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>>,
    O: CapturableOptimizer<M, TrainBackend<G>>,
{
    let mut buffers: Vec<_> = parameters::<G, M>(model).into_values().collect();
    optimizer.visit_state(&mut |_, tensor| buffers.push(primitive(tensor)));
    buffers
}

/// The buffers that decide whether a trainer shares with another (I6, `registry`): the
/// trainable parameters and the optimizer state but its learning rate, which steps
/// replace. A frozen parameter or a learning-rate tensor is only read by steps, and
/// pinning copies it: two trainers over clones of one model with a frozen backbone, or
/// given clones of one optimizer, hold those alike for good without any harm.
pub(super) fn shareable_buffers<G, M, O>(model: &M, optimizer: &mut O) -> Vec<FloatTensor<G>>
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>>,
    O: CapturableOptimizer<M, TrainBackend<G>>,
{
    let mut buffers: Vec<_> = collect_parameters::<G, M>(model, true)
        .into_values()
        .collect();
    optimizer.visit_state(&mut |slot, tensor| {
        if slot != StateSlot::LearningRate {
            buffers.push(primitive(tensor));
        }
    });
    buffers
}

/// The model's float parameters as inner primitives, ordered by `ParamId`.
fn parameters<G: GraphBackend, M: AutodiffModule<TrainBackend<G>>>(
    model: &M,
) -> BTreeMap<ParamId, FloatTensor<G>> {
    collect_parameters::<G, M>(model, false)
}

/// The model's float parameters (only the trainable ones, if `trainable`) as inner
/// primitives, ordered by `ParamId`.
fn collect_parameters<G: GraphBackend, M: AutodiffModule<TrainBackend<G>>>(
    model: &M,
    trainable: bool,
) -> BTreeMap<ParamId, FloatTensor<G>> {
    struct Collect<G: GraphBackend> {
        params: BTreeMap<ParamId, FloatTensor<G>>,
        trainable: bool,
    }
    impl<G: GraphBackend> ModuleVisitor<TrainBackend<G>> for Collect<G> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<TrainBackend<G>, D>>) {
            let tensor = param.val();
            if self.trainable && !tensor.is_require_grad() {
                return;
            }
            self.params
                .insert(param.id, tensor.inner().into_primitive().tensor());
        }
    }
    let mut collect = Collect {
        params: BTreeMap::new(),
        trainable,
    };
    model.visit(&mut collect);
    collect.params
}

/// Replaces each parameter's tensor by its pinned buffer, keeping id and `require_grad`.
struct Reseat<'a, G: GraphBackend> {
    params: &'a BTreeMap<ParamId, FloatTensor<G>>,
}

impl<G: GraphBackend> ModuleMapper<TrainBackend<G>> for Reseat<'_, G> {
    fn map_float<const D: usize>(
        &mut self,
        param: Param<Tensor<TrainBackend<G>, D>>,
    ) -> Param<Tensor<TrainBackend<G>, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(pinned) = self.params.get(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let inner = Tensor::from_primitive(TensorPrimitive::Float(pinned.clone()));
        let mut reseated = Tensor::from_inner(inner);
        if tensor.is_require_grad() {
            reseated = reseated.require_grad();
        }
        Param::from_mapped_value(id, reseated, mapper)
    }
}
