//! A profiler range for `ncu --profile-from-start off`: only kernels launched between
//! `cuProfilerStart` and `cuProfilerStop` are profiled, so one step can be measured in a
//! process that warmed up (compiled, autotuned) first.
//!
//! Both runtimes launch on device 0's primary context from their own worker threads; the
//! range is opened on that context from this thread (`CudaContext::new` retains the
//! primary context and makes it current here).

use std::time::Instant;

use cudarc::driver::{CudaContext, profiler_start, profiler_stop};

/// Runs `step` inside a profiler range, with `sync` (drain every queue, wait for the
/// device) before and after, so that exactly the step's launches fall inside. Returns
/// the step's wall time in ms (under ncu: mostly profiling overhead).
pub fn range(sync: impl Fn(), step: impl FnOnce()) -> f64 {
    let context = CudaContext::new(0).expect("device 0's primary context");
    sync();
    profiler_start().expect("cuProfilerStart");
    let start = Instant::now();
    step();
    sync();
    let wall = start.elapsed().as_secs_f64() * 1e3;
    profiler_stop().expect("cuProfilerStop");
    drop(context);
    wall
}
