//! Neural-network modules built for graphs: few, large kernels per step.

pub mod lstm;

pub use lstm::{
    FusedLstm, FusedLstmConfig, FusedLstmLayer, LstmBackend, LstmConversionError, LstmKernels,
};
