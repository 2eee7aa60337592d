//! Neural-network modules built for graphs: few, large kernels per step.

mod gates;
pub mod gru;
pub mod lstm;
mod sequence;

pub use gru::{
    FusedGru, FusedGruConfig, FusedGruLayer, GruBackend, GruConversionError, GruKernels,
};
pub use lstm::{
    FusedLstm, FusedLstmConfig, FusedLstmLayer, LstmBackend, LstmConversionError, LstmKernels,
    RecurrencePreference, recurrence_preference, set_recurrence_preference,
};
