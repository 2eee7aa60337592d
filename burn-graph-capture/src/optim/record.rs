//! The checkpoint format of every capturable optimizer.
//!
//! State tensors belong to the inner backend, while Burn's `Optimizer::Record` must be a
//! `Record` of the autodiff backend. Burn's `derive(Record)` can only tie a struct to the
//! backend it is generic over, so this record implements `Record<B>` by hand and
//! serializes its inner tensors through their own records (both backends share one
//! device type). Parameters are keyed by `ParamId::serialize`, as Burn's own
//! `HashMap<ParamId, _>` record does, in `ParamId` order.

use std::collections::BTreeMap;

use burn::module::ParamId;
use burn::record::{PrecisionSettings, Record};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Saved state of a capturable optimizer: learning rate, step count and, per parameter,
/// its flattened state tensors in [`StateSlot`](super::StateSlot) index order.
#[derive(Clone, Debug)]
pub struct CapturableRecord<B: AutodiffBackend> {
    /// The learning-rate tensor, shape `[1]`.
    pub lr: Tensor<Inner<B>, 1>,
    /// The step-count tensor, shape `[1]`.
    pub step: Tensor<Inner<B>, 1>,
    /// Per-parameter state.
    pub params: BTreeMap<ParamId, Vec<Tensor<Inner<B>, 1>>>,
}

type TensorItem<B, S> = <Tensor<Inner<B>, 1> as Record<Inner<B>>>::Item<S>;

/// The serialized form of [`CapturableRecord`].
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct CapturableRecordItem<B: AutodiffBackend, S: PrecisionSettings> {
    lr: TensorItem<B, S>,
    step: TensorItem<B, S>,
    params: Vec<(String, Vec<TensorItem<B, S>>)>,
}

impl<B: AutodiffBackend, S: PrecisionSettings> Clone for CapturableRecordItem<B, S> {
    fn clone(&self) -> Self {
        Self {
            lr: self.lr.clone(),
            step: self.step.clone(),
            params: self.params.clone(),
        }
    }
}

impl<B: AutodiffBackend> Record<B> for CapturableRecord<B> {
    type Item<S: PrecisionSettings> = CapturableRecordItem<B, S>;

    fn into_item<S: PrecisionSettings>(self) -> Self::Item<S> {
        CapturableRecordItem {
            lr: Record::<Inner<B>>::into_item(self.lr),
            step: Record::<Inner<B>>::into_item(self.step),
            params: self
                .params
                .into_iter()
                .map(|(id, state)| {
                    let state = state.into_iter().map(Record::<Inner<B>>::into_item);
                    (id.serialize(), state.collect())
                })
                .collect(),
        }
    }

    fn from_item<S: PrecisionSettings>(item: Self::Item<S>, device: &B::Device) -> Self {
        let tensor = |item| Record::<Inner<B>>::from_item::<S>(item, device);
        Self {
            lr: tensor(item.lr),
            step: tensor(item.step),
            params: item
                .params
                .into_iter()
                .map(|(id, state)| {
                    let state = state.into_iter().map(tensor).collect();
                    (ParamId::deserialize(&id), state)
                })
                .collect(),
        }
    }
}
