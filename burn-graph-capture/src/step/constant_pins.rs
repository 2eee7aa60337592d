//! The pins a capture reads constants through, made of the backend's own tensors: the
//! backend half of `backend::constant_pin`, which stays free of `GraphBackend` (the
//! trace that fills pins sits below it).

use std::any::Any;

use crate::backend::constant_pin::PinSlot;
use crate::backend::emulated::program::{AsValue, Value};
use crate::backend::{AnyTensor, GraphBackend, GraphError};

/// A pin of backend `G`.
struct Pin<G: GraphBackend>(AnyTensor<G>);

impl<G: GraphBackend> Pin<G> {
    /// `tensor` as a tensor of the pin's kind.
    fn of_kind(&self, tensor: &dyn Any) -> Option<AnyTensor<G>> {
        AnyTensor::downcast(self.0.kind(), tensor)
    }
}

impl<G: GraphBackend> PinSlot for Pin<G> {
    fn pin(&self) -> Value {
        match &self.0 {
            AnyTensor::Float(tensor) => tensor.as_value(),
            AnyTensor::Int(tensor) => tensor.as_value(),
            AnyTensor::Bool(tensor) => tensor.as_value(),
        }
    }

    fn alike(&self, tensor: &dyn Any) -> bool {
        self.of_kind(tensor)
            .is_some_and(|tensor| G::lies_alike(&self.0, &tensor))
    }

    fn fill(&self, tensor: &dyn Any) -> Result<(), GraphError> {
        let tensor = self.of_kind(tensor).ok_or(GraphError::PinKind)?;
        G::copy_into(&self.0, &tensor)
    }
}

/// A pin for each constant `rehearsed` (in the order the rehearsal first read them),
/// copied as it lies; `None` where one cannot be pinned.
pub(crate) fn pins_for<G: GraphBackend>(
    rehearsed: Vec<AnyTensor<G>>,
) -> Vec<Option<Box<dyn PinSlot>>> {
    rehearsed
        .into_iter()
        .map(|tensor| {
            let pin = G::pin_input(tensor).ok()?;
            Some(Box::new(Pin(pin)) as Box<dyn PinSlot>)
        })
        .collect()
}
