//! The three kinds of Burn tensors, named in errors and batch checks.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which of Burn's three tensor kinds a tensor is; reads `float`, `int` or `bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TensorKind {
    /// Float tensors.
    Float,
    /// Int tensors.
    Int,
    /// Bool tensors.
    Bool,
}

impl TensorKind {
    /// The kind whose tensors hold `dtype`.
    pub(crate) fn of_dtype(dtype: burn_backend::DType) -> Self {
        match dtype {
            burn_backend::DType::Bool(_) => TensorKind::Bool,
            dtype if dtype.is_float() => TensorKind::Float,
            _ => TensorKind::Int,
        }
    }
}

impl fmt::Display for TensorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TensorKind::Float => "float",
            TensorKind::Int => "int",
            TensorKind::Bool => "bool",
        })
    }
}
