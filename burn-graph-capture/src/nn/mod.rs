//! Neural-network modules built for graphs: few, large kernels per step.

#[cfg(feature = "cuda")]
mod cube;
mod decorated;
mod gates;
pub mod gru;
pub mod lstm;
mod sequence;
mod stacking;
mod strategy;

pub use gru::{
    FusedGru, FusedGruConfig, FusedGruLayer, GruBackend, GruConversionError, GruKernels,
};
pub use lstm::{
    FusedLstm, FusedLstmConfig, FusedLstmLayer, LstmBackend, LstmConversionError, LstmKernels,
};
pub use stacking::StackMismatch;
pub use strategy::{
    Cell, Direction, PersistentGrid, Recurrence, RecurrencePreference, RecurrenceShape,
    choose as choose_recurrence, persistent_launches, recurrence_preference,
    set_recurrence_preference,
};
