//! A sampling profile of the bench's own host time, where `HOST_PROFILE` names a folder.
//!
//! The GPU machine has no `perf`, and a trace's host time there differs from the same
//! trace's on a CPU (emulated graphs): the process samples itself (pprof, SIGPROF) and
//! writes one folded-stack file per profiled row, `frame;frame;...;leaf count` per line,
//! the form flame-graph tools and `grep` read.

use std::path::PathBuf;

/// Samples per second of CPU time.
#[cfg(feature = "host-profile")]
const FREQUENCY: i32 = 4999;

/// Where profiles go, if the run asked for them.
fn folder() -> Option<PathBuf> {
    std::env::var_os("HOST_PROFILE").map(PathBuf::from)
}

/// Runs `run` while sampling this process, then writes `HOST_PROFILE/NAME.folded`.
#[cfg(feature = "host-profile")]
pub fn sampled<T>(name: &str, run: impl FnOnce() -> T) -> T {
    let Some(folder) = folder() else {
        return run();
    };
    // Unwinding inside these libraries from a signal handler can deadlock.
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .expect("the sampler starts");
    let started = std::time::Instant::now();
    let value = run();
    let wall = started.elapsed();
    let report = guard.report().build().expect("the samples resolve");
    let mut lines: Vec<String> = report
        .data
        .iter()
        .map(|(frames, count)| {
            // The thread, then the outermost frame first; inlined functions after the
            // function they are in. Samples are of time on a CPU: a thread that waits
            // (for a lock, for the device) shows as fewer samples than its wall time.
            let stack: Vec<String> = std::iter::once(frames.thread_name_or_id())
                .chain(
                    frames
                        .frames
                        .iter()
                        .rev()
                        .flat_map(|symbols| symbols.iter().rev().map(|s| s.name())),
                )
                .collect();
            format!("{} {count}", stack.join(";"))
        })
        .collect();
    lines.sort();
    std::fs::create_dir_all(&folder).expect("the profile folder");
    let path = folder.join(format!("{name}.folded"));
    std::fs::write(&path, lines.join("\n") + "\n").expect("the profile is written");
    eprintln!(
        "host profile: {} samples at {FREQUENCY} Hz over {:.2} s of wall time in {}",
        report.data.values().sum::<isize>(),
        wall.as_secs_f64(),
        path.display()
    );
    value
}

/// Built without the sampler: says so once, and runs `run` unsampled.
#[cfg(not(feature = "host-profile"))]
pub fn sampled<T>(name: &str, run: impl FnOnce() -> T) -> T {
    if folder().is_some() {
        eprintln!("host profile of {name} not taken: built without the host-profile feature");
    }
    run()
}
