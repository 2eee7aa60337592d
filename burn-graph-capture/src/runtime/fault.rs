//! Injected failures, for tests (issue 14, fault injection): each stage of a graph's life
//! can be made to fail the next `n` times it runs, with the error a real failure there
//! returns, so that tests can check the trainer falls back, keeps its state and stays
//! usable. Armed only through the `fault-injection` feature; without it every check is a
//! constant `false` and compiles away.

/// A stage of a graph's life where a failure can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultStage {
    /// `cuStreamBeginCapture` fails: no window opens.
    CaptureBegin,
    /// An allocation inside the window needs a new device page (`NeedsAllocation`).
    WindowAllocation,
    /// `cuStreamEndCapture`/`cuGraphInstantiate` fail: the stream leaves capture mode, no
    /// graph.
    EndInstantiate,
    /// `cuGraphUpload` fails after instantiation: the graph is thrown away.
    Upload,
    /// `cuGraphLaunch` fails: the replay does not run.
    ReplayLaunch,
    /// A device copy recorded in the window (the write-back into the pins) fails.
    CopyBack,
    /// The arena allocation of a pin fails.
    Pin,
}

impl FaultStage {
    /// Every stage, in the order a graph meets them.
    pub const ALL: [FaultStage; 7] = [
        FaultStage::Pin,
        FaultStage::CaptureBegin,
        FaultStage::WindowAllocation,
        FaultStage::CopyBack,
        FaultStage::EndInstantiate,
        FaultStage::Upload,
        FaultStage::ReplayLaunch,
    ];
}

#[cfg(feature = "fault-injection")]
mod armed {
    use super::FaultStage;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Faults {
        armed: HashMap<FaultStage, u32>,
        fired: HashMap<FaultStage, u64>,
    }

    static FAULTS: Mutex<Option<Faults>> = Mutex::new(None);

    fn with<T>(f: impl FnOnce(&mut Faults) -> T) -> T {
        let mut faults = FAULTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(faults.get_or_insert_with(Faults::default))
    }

    /// Makes `stage` fail the next `times` times it runs (in any thread).
    pub fn arm(stage: FaultStage, times: u32) {
        with(|f| *f.armed.entry(stage).or_default() += times);
    }

    /// Clears every armed failure (fired counts stay).
    pub fn disarm_all() {
        with(|f| f.armed.clear());
    }

    /// How many injected failures `stage` has returned so far.
    pub fn fired(stage: FaultStage) -> u64 {
        with(|f| f.fired.get(&stage).copied().unwrap_or(0))
    }

    /// Whether `stage` must fail now (consumes one arming).
    pub(crate) fn trip(stage: FaultStage) -> bool {
        with(|f| match f.armed.get_mut(&stage) {
            Some(left) if *left > 0 => {
                *left -= 1;
                *f.fired.entry(stage).or_default() += 1;
                true
            }
            _ => false,
        })
    }
}

#[cfg(feature = "fault-injection")]
pub(crate) use armed::trip;
#[cfg(feature = "fault-injection")]
pub use armed::{arm, disarm_all, fired};

/// Without the feature nothing is ever injected.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn trip(_stage: FaultStage) -> bool {
    false
}

/// The driver error an injected driver failure reports.
pub(crate) fn injected_driver_error() -> cudarc::driver::DriverError {
    cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN)
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;

    #[test]
    fn an_armed_stage_fails_as_many_times_as_armed() {
        // One test owns the global state (stages no other unit test arms).
        disarm_all();
        let stage = FaultStage::Upload;
        let before = fired(stage);
        assert!(!trip(stage));
        arm(stage, 2);
        assert!(!trip(FaultStage::ReplayLaunch), "other stages stay healthy");
        assert!(trip(stage) && trip(stage));
        assert!(!trip(stage), "two armings, two failures");
        assert_eq!(fired(stage) - before, 2);
        arm(stage, 5);
        disarm_all();
        assert!(!trip(stage));
    }
}
