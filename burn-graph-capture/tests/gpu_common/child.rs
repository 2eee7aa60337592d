//! One stack's measurement in a fresh process of the running test binary, with an
//! autotune cache of its own.
//!
//! Autotune picks kernels by timing, and f32 matmul candidates differ in precision
//! (tensor-core kernels round operands to TF32), so two processes of one stack can
//! disagree by 7.8e-4 (`gpu_precision`, H200: stock burn-cuda against itself). A child
//! starts with an empty autotune cache, or with one seeded from this runtime's results
//! under stock's tuner id, so a comparison can show that spread or pin both stacks to
//! the same kernels. The seeding goes from ours to stock because stock can run every
//! kernel this runtime can, not the reverse: stock also has TMA kernels, which its
//! autotune picks for some shapes (64x256x256 on the H200) and this runtime cannot launch.
//!
//! The parent runs a test of its own binary again (`--exact --include-ignored`) with the
//! child's variables set; that test calls [`as_child`] first and, in a child, measures
//! and returns through [`write_outputs`].

use burn_graph_capture::runtime::CudaGraphRuntime;
use cubecl_core::{CubeTuneId, Runtime};
use cubecl_runtime::config::{
    CubeClRuntimeConfig, RuntimeConfig, autotune::AutotuneLogLevel, cache::CacheConfig,
};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The stack a child measures (its presence makes a test a child).
const STACK_VAR: &str = "GPU_CHILD_STACK";
/// The file a child writes its outputs to.
const OUT_VAR: &str = "GPU_CHILD_OUT";
/// The child's autotune cache directory.
const AUTOTUNE_VAR: &str = "GPU_CHILD_AUTOTUNE";
/// Where this runtime's children keep their autotune results across tests and binaries
/// (set by `xtask gpu run`, so each shape is tuned once per run); a temporary
/// directory per test otherwise. No child tunes in it directly: tests run side by side,
/// and CubeCL keeps the first result a key was stored with, not the one a second process
/// tuned at the same time and ran (H200, session 24: `t3` and `t4` beside each other
/// seeded stock with the other's matmul choice, 2.5e-4 apart).
const OURS_AUTOTUNE_VAR: &str = "GPU_OURS_AUTOTUNE";
/// Autotune's log line for a key it had to tune (not found in the cache).
const TUNED_LINE: &str = "Fastest result";

/// One named output: its values as f32 bits (exact, NaN included) and whether the
/// comparison must be exact.
pub type Output = (String, bool, Vec<u32>);

pub fn output(name: impl Into<String>, exact: bool, values: &[f32]) -> Output {
    (
        name.into(),
        exact,
        values.iter().map(|v| v.to_bits()).collect(),
    )
}

pub fn values(output: &Output) -> Vec<f32> {
    output.2.iter().map(|b| f32::from_bits(*b)).collect()
}

/// In a child: points CubeCL at the child's autotune cache (before any client starts)
/// and returns the stack to measure. `None` in the parent.
///
/// The rest of the configuration is the parent's (its `cubecl.toml`): under `xtask gpu
/// run` that shares the run's cache of compiled kernels, so only the first child pays
/// for compiling the autotune candidates, and each child still times them itself.
pub fn as_child() -> Option<String> {
    let stack = std::env::var(STACK_VAR).ok()?;
    let autotune = std::env::var(AUTOTUNE_VAR).expect("a child has an autotune directory");
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.autotune.cache = CacheConfig::File(autotune.into());
    config.autotune.logger.stdout = true;
    config.autotune.logger.level = AutotuneLogLevel::Minimal;
    CubeClRuntimeConfig::set(config);
    Some(stack)
}

/// In a child: hands the outputs to the parent.
pub fn write_outputs(outputs: &[Output]) {
    let path = std::env::var(OUT_VAR).expect("a child has an output file");
    let json = serde_json::to_vec(outputs).expect("outputs serialize");
    std::fs::write(path, json).expect("child writes its outputs");
}

/// What one child measured, and the choices autotune made there.
pub struct ChildRun {
    pub outputs: Vec<Output>,
    /// Autotune's "Fastest result" lines: one per key the child had to tune itself.
    pub choices: Vec<String>,
    /// The autotune cache the child ran with: every choice it made is there.
    autotune: PathBuf,
}

/// The children of one parent test, in a temporary directory removed on drop.
pub struct Children {
    dir: PathBuf,
    test: &'static str,
    ours_autotune: PathBuf,
    runs: Cell<usize>,
}

impl Children {
    /// Children that re-run `test` (this binary's test of that exact name).
    pub fn new(test: &'static str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpu-child-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ours_autotune = std::env::var_os(OURS_AUTOTUNE_VAR)
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("ours-autotune"));
        Self {
            dir,
            test,
            ours_autotune,
            runs: Cell::new(0),
        }
    }

    /// Runs `stack` with an empty autotune cache: it tunes every op itself.
    pub fn fresh(&self, stack: &str) -> ChildRun {
        let autotune = self.next_dir();
        self.run(stack, &autotune)
    }

    /// Runs one of this runtime's stacks on a private copy of the autotune results this
    /// test (or, under `xtask gpu run`, this run) has stored so far, then stores what it
    /// tuned there for the next children.
    pub fn ours(&self, stack: &str) -> ChildRun {
        let autotune = self.next_dir();
        copy_renaming(&self.ours_autotune, &autotune, None);
        let run = self.run(stack, &autotune);
        copy_renaming(&autotune, &self.ours_autotune, None);
        run
    }

    /// Runs a stock stack with the autotune results `ours` ran with, under stock's tuner
    /// id: every op `ours` tuned or found runs the kernel `ours` ran.
    pub fn stock_with_choices_of(&self, ours: &ChildRun, stack: &str) -> ChildRun {
        let autotune = self.next_dir();
        let (stock_id, ours_id) = tuner_ids();
        let rename = Some((ours_id.as_str(), stock_id.as_str()));
        let copied = copy_renaming(&ours.autotune, &autotune, rename);
        assert!(
            copied > 0,
            "no autotune results of this runtime under {}",
            ours.autotune.display()
        );
        self.run(stack, &autotune)
    }

    /// A new, empty directory for one child.
    fn next_dir(&self) -> PathBuf {
        let index = self.runs.get();
        self.runs.set(index + 1);
        let dir = self.dir.join(format!("child-{index}"));
        std::fs::create_dir_all(&dir).expect("child dir");
        dir
    }

    fn run(&self, stack: &str, autotune: &Path) -> ChildRun {
        let out = self.next_dir().join("outputs.json");
        let exe = std::env::current_exe().expect("own executable");
        let result = Command::new(exe)
            .args([self.test, "--exact", "--include-ignored", "--nocapture"])
            .env(STACK_VAR, stack)
            .env(OUT_VAR, &out)
            .env(AUTOTUNE_VAR, autotune)
            .output()
            .expect("child process starts");
        let stdout = String::from_utf8_lossy(&result.stdout);
        assert!(
            result.status.success() && stdout.contains("1 passed"),
            "child {stack} of {} failed or ran no test:\n{stdout}\n{}",
            self.test,
            String::from_utf8_lossy(&result.stderr)
        );
        let choices: Vec<String> = stdout
            .lines()
            .filter(|l| l.contains(TUNED_LINE))
            .map(|l| l.trim().to_string())
            .collect();
        let bytes = std::fs::read(&out).expect("child wrote its outputs");
        ChildRun {
            outputs: serde_json::from_slice(&bytes).expect("child outputs parse"),
            choices,
            autotune: autotune.to_path_buf(),
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stock cubecl-cuda's and this runtime's autotune ids for device 0: the directory each
/// keeps its tuners' results under.
fn tuner_ids() -> (String, String) {
    let stock = super::stock_device();
    let ours = super::our_device();
    let stock_client = cubecl_cuda::CudaRuntime::client(&stock);
    let ours_client = CudaGraphRuntime::client(&ours);
    (
        CubeTuneId::new::<cubecl_cuda::CudaRuntime>(&stock_client, &stock).to_string(),
        CubeTuneId::new::<CudaGraphRuntime>(&ours_client, &ours).to_string(),
    )
}

/// Copies the tree `from` into `to`; with `rename` = `(old, new)`, every path component
/// `old` becomes `new` and those already named `new` are left out (the other runtime's
/// own results, when the cache is shared with a run of both). Returns the number of
/// files copied.
///
/// Each file is written whole: beside its place under a temporary name, then renamed
/// over it. So a test copying the run's shared cache while another child's results are
/// published into it (`Children::ours`) reads one child's complete file or another's,
/// and skips the temporary ones. A file published meanwhile is replaced: its new keys
/// are tuned again later, never mixed into a run.
pub fn copy_renaming(from: &Path, to: &Path, rename: Option<(&str, &str)>) -> usize {
    let Ok(entries) = std::fs::read_dir(from) else {
        return 0;
    };
    let mut copied = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(PART) {
            continue; // another test's file being published: renamed away any moment
        }
        let target = match rename {
            Some((_, new)) if name == new => continue,
            Some((old, new)) if name == old => to.join(new),
            _ => to.join(name),
        };
        let path = entry.path();
        if path.is_dir() {
            copied += copy_renaming(&path, &target, rename);
        } else {
            std::fs::create_dir_all(to).expect("autotune dir");
            let n = WRITTEN.fetch_add(1, Ordering::Relaxed);
            let part = to.join(format!(".{}-{n}{PART}", std::process::id()));
            std::fs::copy(&path, &part).expect("autotune file copies");
            std::fs::rename(&part, &target).expect("autotune file replaces");
            copied += 1;
        }
    }
    copied
}

/// Files [`copy_renaming`] has written in this process (their temporary names differ).
static WRITTEN: AtomicUsize = AtomicUsize::new(0);
/// The suffix of a file [`copy_renaming`] is writing, before it renames it into place.
const PART: &str = ".part";
