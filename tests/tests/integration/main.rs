//! The integration tests that run on the CPU (Flex), in one test binary, `integration`:
//! one module per area, so the workspace is linked once for all of them rather than once
//! per file. A test's path starts with its module (`fuzz::`, `threads::`, `dropout::`);
//! `cargo test -p integration-tests --test integration fuzz::` runs one area.
//!
//! `fuzz`, `threads` and `shared_embedding` also hold GPU variants (feature `cuda`,
//! `#[ignore]`d, in a `gpu` module of each: `fuzz::gpu::`, `threads::gpu::`,
//! `shared_embedding::gpu::`), which `scripts/gpu-check.sh` runs. The GPU trainer tests
//! are a binary of their own, `gpu_trainer`.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod breakers;
mod cpu_graph_backend;
mod data_parallel;
mod data_parallel_processes;
mod decorator_parity;
mod docs_in_sync;
mod dropout;
mod fused_gru;
mod fused_lstm;
mod fuzz;
mod learner_strategy;
mod module_state;
mod optim_parity;
mod optim_records;
mod optim_signatures;
mod other_models;
mod sessions;
mod shared_embedding;
mod signatures;
mod stale_replays;
mod step_api;
mod step_inputs;
mod step_lifecycle;
mod step_tracing;
mod threads;
mod unlisted_inputs;
