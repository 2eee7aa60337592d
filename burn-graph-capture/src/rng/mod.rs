//! Random numbers drawn on the device, for random ops inside graphs (issue 15, in
//! progress): a counter-based generator whose draws depend only on the seed, an offset
//! and each element's index.

pub mod draw;
pub mod philox;
