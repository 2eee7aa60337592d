//! Stand-ins: the tensors a trace hands the step closure for a matched op's outputs
//! (`backend::trace`).

/// A tensor primitive that can stand in for a recorded output in a trace: a buffer of
/// the same layout that the recording keeps, and that a trace which stops matching can
/// fill with the value the op computes now. Backends without stand-ins replay without
/// traces (the defaults).
pub trait StandIn: Sized {
    /// A stand-in for `self`, laid out as it is.
    fn stand_in(&self) -> Option<Self> {
        None
    }

    /// Writes `value` into the stand-in `self`; false where it cannot.
    fn fill(&self, _value: &Self) -> bool {
        false
    }
}
