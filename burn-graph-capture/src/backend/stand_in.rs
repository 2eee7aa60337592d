//! Stand-ins: the tensors a trace hands the step closure for a matched op's outputs
//! (`backend::trace`).

/// Makes a stand-in after the capture's window (`StandIn::stand_in_later`).
pub type LaterStandIn<T> = Box<dyn Fn() -> T + Send + Sync>;

/// A tensor primitive that can stand in for a recorded output in a trace: a buffer of
/// the same shape and dtype that the recording keeps, and that a trace which stops
/// matching can fill with the value the op computes now. Backends without stand-ins
/// replay without traces (the defaults).
pub trait StandIn: Sized {
    /// A stand-in for `self`, laid out as it is, made while the capture records.
    fn stand_in(&self) -> Option<Self> {
        None
    }

    /// A maker of a stand-in for `self`, for backends where making one while the capture
    /// records would change what the captured step does (fusion would queue it among the
    /// step's ops); the capture makes it once its window has closed. Asked only where
    /// [`StandIn::stand_in`] gives none.
    fn stand_in_later(&self) -> Option<LaterStandIn<Self>> {
        None
    }

    /// Writes `value` into the stand-in `self`, in order with the work queued before it;
    /// false where it cannot.
    fn fill(&self, _value: &Self) -> bool {
        false
    }
}
