//! The stages of `gpu run`: what each runs, as command lines planned before anything
//! starts (so they can be printed and tested here, without a GPU).
//!
//! A stage is a list of groups; the steps of a group run side by side, groups one after
//! another. GPU tests run through nextest (profile `gpu`, `.config/nextest.toml`), each
//! test in a process of its own, and report through nextest's JUnit file; under
//! compute-sanitizer memcheck a test binary runs directly, a module per process
//! (`memcheck`), and reports through libtest's lines; benches, examples and tools run
//! directly and report through their exit status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

use super::binaries::{self, Kind};

mod memcheck;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Stage {
    /// A few runtime tests (gpu_runtime: smoke, random_and_sync, op_parity_plain).
    Smoke,
    /// The GPU test suites through nextest (--bins picks them).
    Tests,
    /// Tests under compute-sanitizer memcheck, a process per module and stack (runtime
    /// parity, capture, four trainer modules at a tenth of their steps).
    Memcheck,
    /// `tests` (four at a time) and `memcheck` side by side.
    Suite,
    /// Matmul and sum of both stacks against an f64 reference (gpu_precision).
    Precision,
    /// compute-sanitizer racecheck on the persistent recurrences (gpu_graph_speed profile).
    Racecheck,
    /// The speed bench, one process per size.
    Speed,
    /// One profiled step per target and size under Nsight Compute, summed by ncu_sum.py.
    Ncu,
    /// PyTorch's anchors (bench/anchors/torch_anchor.py).
    Torch,
    /// speed, ncu and torch, then scripts/speed_summary.py's table.
    Perf,
    /// CubeCL's matmul against cuBLAS at the LSTM step's shapes (gpu_matmul).
    Matmul,
    /// This runtime's eager step against stock burn-cuda's (runtime_eager_bench).
    Eager,
    /// The examples against their eager runs (--examples picks which).
    Examples,
    /// The differential fuzzer on both stacks side by side (--trace-seeds: traces).
    Fuzz,
    /// Side by side: threads, shared embeddings at depth, the fuzzer, part of it under memcheck.
    Reliability,
    /// One trainer test in many fresh processes with empty caches, side by side.
    Cold,
}

impl Stage {
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// Whether planning the stage reads the test binaries' lists
    /// ([`Layout::ignored_tests`]): memcheck deals its slow modules by test name.
    pub fn reads_test_lists(self) -> bool {
        matches!(self, Stage::Memcheck | Stage::Suite)
    }

    /// The binaries the stage runs with these options.
    pub fn binaries(self, opts: &StageOptions) -> Vec<&'static str> {
        let suites = || -> Vec<&'static str> {
            (opts.bins.iter())
                .filter_map(|name| binaries::find(name).ok().map(|b| b.name))
                .collect()
        };
        match self {
            Stage::Smoke => vec!["gpu_runtime"],
            Stage::Tests | Stage::Memcheck | Stage::Suite => suites(),
            Stage::Precision => vec!["gpu_precision"],
            Stage::Racecheck | Stage::Speed | Stage::Ncu | Stage::Perf => vec!["gpu_graph_speed"],
            Stage::Torch => vec![],
            Stage::Matmul => vec!["gpu_matmul"],
            Stage::Eager => vec!["runtime_eager_bench"],
            Stage::Examples => {
                let mut names: Vec<&'static str> = opts
                    .examples
                    .iter()
                    .filter_map(|run| example_run(run).ok().map(|(_, binary, _, _)| binary))
                    .collect();
                names.sort();
                names.dedup();
                names
            }
            Stage::Fuzz => vec!["fuzz"],
            Stage::Reliability => vec!["fuzz", "threads", "shared_embedding"],
            Stage::Cold => vec!["gpu_trainer"],
        }
    }

    /// Default time limit of one step, in seconds (`--timeout` overrides it; every
    /// limit ends inside the run's deadline).
    fn timeout_s(self) -> u64 {
        match self {
            Stage::Smoke | Stage::Racecheck => 200,
            Stage::Ncu | Stage::Matmul | Stage::Eager => 300,
            Stage::Torch | Stage::Cold => 400,
            Stage::Examples => 240,
            _ => 540,
        }
    }
}

/// The GPU test binaries `tests`, `memcheck` and `suite` run unless `--bins` names others.
const SUITES: [&str; 3] = ["gpu_runtime", "gpu_capture", "gpu_trainer"];

/// Which stack's tests `--stack` keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StackName {
    /// `CudaFused` (fusion over CubeCL on this runtime).
    Fused,
    /// `CudaCube` (no fusion).
    Cube,
}

impl StackName {
    /// The stack's module in the trainer's tests (`guards::fused::...`).
    pub fn module(self) -> &'static str {
        match self {
            StackName::Fused => "fused",
            StackName::Cube => "cube",
        }
    }
}

/// The options of the stages (each stage reads those it names).
#[derive(clap::Args, Clone, Debug)]
pub struct StageOptions {
    /// tests, memcheck, suite: the test binaries.
    #[arg(long, value_delimiter = ',', default_values = SUITES)]
    pub bins: Vec<String>,
    /// Nextest stages: a filterset; it replaces the stage's own selection.
    #[arg(short = 'E', long)]
    pub filterset: Option<String>,
    /// Nextest stages: tests run at once (default 1; suite's tests 4, fuzz 2,
    /// reliability 8); memcheck: processes at once (default all).
    #[arg(short = 'j', long)]
    pub threads: Option<usize>,
    /// Nextest stages and memcheck: only the tests of one stack (modules
    /// `fused::`/`cube::`, or the `gpu::` tests named after their stack).
    #[arg(long, value_enum)]
    pub stack: Option<StackName>,
    /// speed: sizes b/t/h, one process each.
    #[arg(long, default_value = "32/64/256,8/64/128,128/32/512")]
    pub sizes: String,
    /// speed: the bench's stacks (default: the bench's own list).
    #[arg(long)]
    pub stacks: Option<String>,
    /// speed, ncu: a suffix for the logs, e.g. when the environment differs
    /// (`BURN_GRAPH_CAPTURE_GEMM_ROUTE=off ... --label route-off`).
    #[arg(long)]
    pub label: Option<String>,
    /// ncu: the profiled targets (gpu_graph_speed's `profile TARGET`).
    #[arg(long, value_delimiter = ',', default_value = "fused")]
    pub ncu_targets: Vec<String>,
    /// ncu: the profiled sizes.
    #[arg(long, value_delimiter = ',', default_value = "32/64/256")]
    pub ncu_sizes: Vec<String>,
    /// ncu: extra ncu flags, space-separated (e.g. "--cache-control none").
    #[arg(long, allow_hyphen_values = true)]
    pub ncu_flags: Option<String>,
    /// racecheck: TARGET@b/t/h pairs for `gpu_graph_speed profile`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fused-lstm@40/8/64,fused-lstm@128/4/512,fused-lstm@100/2/64,fused-gru@40/8/64"
    )]
    pub racecheck: Vec<String>,
    /// eager: steps per stack.
    #[arg(long, default_value_t = 60)]
    pub steps: u32,
    /// examples: the runs, in order (lstm, lstm-fused, lstm-gru, learner, charlm; one
    /// named twice runs twice).
    #[arg(long, value_delimiter = ',', default_value = "lstm-fused,lstm-gru")]
    pub examples: Vec<String>,
    /// examples: epochs of each run.
    #[arg(long, default_value_t = 3)]
    pub epochs: u32,
    /// fuzz, reliability: generated programs per stack (default 100 for fuzz, 300 for
    /// reliability), after the regression seeds.
    #[arg(long)]
    pub fuzz_programs: Option<u32>,
    /// fuzz: seeds to trace (each stack and seed in a fresh process, every event of
    /// both runs and cubecl's autotune log printed).
    #[arg(long, value_delimiter = ',')]
    pub trace_seeds: Vec<u64>,
    /// cold: processes per filter.
    #[arg(long, default_value_t = 12)]
    pub procs: usize,
    /// cold: the test filters of one process, space-separated; several filters with ';'.
    #[arg(
        long,
        value_delimiter = ';',
        default_value = "inputs::fused::batch_norm inputs::fused::tied inputs::fused::eager_mlp"
    )]
    pub cold_filters: Vec<String>,
    /// Nextest stages: test-name filters (substrings, any of them), after `--`.
    #[arg(last = true)]
    pub filters: Vec<String>,
}

impl StageOptions {
    /// The options parsed from `args` (none: the defaults).
    pub fn parse(args: &[&str]) -> StageOptions {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            opts: StageOptions,
        }
        <Cli as clap::Parser>::parse_from(std::iter::once("xtask").chain(args.iter().copied())).opts
    }
}

/// One example run: its name, the binary, its arguments, and whether it takes
/// `--epochs` (`--out` is added).
type ExampleRun = (&'static str, &'static str, &'static [&'static str], bool);

const EXAMPLE_RUNS: [ExampleRun; 5] = [
    ("lstm", "lstm", &["--compare", "--stock"], true),
    ("lstm-fused", "lstm", &["--fused", "--compare"], true),
    ("lstm-gru", "lstm", &["--gru", "--compare"], true),
    ("learner", "lstm-learner", &["--compare", "--stock"], true),
    ("charlm", "charlm", &[], false),
];

fn example_run(name: &str) -> Result<ExampleRun, String> {
    EXAMPLE_RUNS
        .into_iter()
        .find(|(run, ..)| *run == name)
        .ok_or_else(|| {
            let names: Vec<_> = EXAMPLE_RUNS.iter().map(|(run, ..)| *run).collect();
            format!("no example run {name} (known: {})", names.join(", "))
        })
}

/// Where a step runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dir {
    /// The run's shared directory: its cubecl.toml points at the run's caches.
    Shared,
    /// A nextest workspace root of the step's own (its store holds the JUnit file),
    /// with the shared cubecl.toml: nextest runs each test in its package's directory
    /// below it, and CubeCL finds the file walking up from there.
    Nextest(PathBuf),
    /// A fresh directory with empty caches of its own; `autotune_log` makes CubeCL print
    /// each kernel choice it tunes.
    Fresh { dir: PathBuf, autotune_log: bool },
}

/// How a step's result is read, besides its exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    Exit,
    /// Nextest's JUnit file: tests passed, failed and skipped.
    JUnit(PathBuf),
    /// An ncu CSV, summed by scripts/ncu_sum.py into ncu.log after the step.
    Ncu {
        csv: PathBuf,
        label: String,
        size: String,
    },
    /// compute-sanitizer's summary line.
    Sanitizer,
    /// compute-sanitizer's summary line and libtest's results, both in the log.
    SanitizedTests,
    /// An example's summary.json in this folder.
    Example(PathBuf),
}

#[derive(Clone, Debug)]
pub struct Step {
    pub stage: Stage,
    /// Unique within a run; names the log and the nextest workspace.
    pub label: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub dir: Dir,
    pub timeout_s: u64,
    /// The log file, in the run's log folder; steps of one stage may append to one.
    pub log: String,
    pub append: bool,
    pub report: Report,
}

impl Step {
    /// The command line as a shell would read it (for printing).
    pub fn command_line(&self) -> String {
        let env = self.env.iter().map(|(k, v)| format!("{k}={}", quote(v)));
        let program = std::iter::once(quote(&path_arg(&self.program)));
        env.chain(program)
            .chain(self.args.iter().map(|a| quote(a)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Steps run side by side.
pub type Group = Vec<Step>;

/// Where things are on the GPU machine.
pub struct Layout {
    /// The repository's working tree (scripts, bench/anchors, .config/nextest.toml).
    pub repo: PathBuf,
    /// The run's scratch folder (unpacked binaries, caches, nextest workspaces).
    pub work: PathBuf,
    /// This run's log folder (tarred into $OUT at the end).
    pub logs: PathBuf,
    /// GPUs on the machine (`two_gpus::` tests need two).
    pub gpus: usize,
    /// Nextest binary id to the unpacked test binary.
    pub test_binaries: BTreeMap<String, PathBuf>,
    /// Nextest binary id to its `#[ignore]`d tests' names, as the binary lists them on
    /// the GPU machine for the stages that read them; empty in a dry run (memcheck then
    /// shows its unsplit processes).
    pub ignored_tests: BTreeMap<String, Vec<String>>,
}

impl Layout {
    pub fn unpacked(&self) -> PathBuf {
        self.work.join("pack")
    }

    pub fn shared(&self) -> PathBuf {
        self.work.join("shared")
    }

    pub fn nextest_target(&self) -> PathBuf {
        self.unpacked().join("nextest/target")
    }

    /// The unpacked binary of the table's entry `name`.
    pub fn binary(&self, name: &str) -> Result<PathBuf, String> {
        let binary = binaries::find(name)?;
        match binary.kind {
            Kind::Test => (self.test_binaries.get(&binary.binary_id()).cloned())
                .ok_or_else(|| not_packed(name)),
            _ => Ok(self.unpacked().join(binary.payload_path())),
        }
    }
}

pub fn not_packed(name: &str) -> String {
    format!(
        "{name} is not packed (build it here with `cargo run -q -p xtask -- gpu pack --bins ...,{name}`)"
    )
}

/// The nextest profile of `.config/nextest.toml`.
const GPU: &str = "gpu";

/// The groups of one stage.
pub fn plan(stage: Stage, opts: &StageOptions, layout: &Layout) -> Result<Vec<Group>, String> {
    // A name the table does not know is an error here, not an empty selection there.
    binaries::select(&opts.bins)?;
    let one = |step: Step| vec![step];
    let expr =
        |names: &[&str], default: Option<&str>| expression(names, default, opts, layout.gpus);
    let nextest =
        |label: &str, profile, threads, expr| nextest(layout, stage, label, profile, threads, expr);
    let tests = |label: &str, threads| -> Result<Step, String> {
        let expr = expr(&Stage::Tests.binaries(opts), None)?;
        Ok(nextest(label, GPU, threads, expr))
    };
    Ok(match stage {
        Stage::Smoke => {
            let default = "test(smoke) | test(random_and_sync) | test(op_parity_plain)";
            let expr = expr(&stage.binaries(opts), Some(default))?;
            vec![one(nextest("smoke", GPU, opts.threads, expr))]
        }
        Stage::Tests => vec![one(tests("tests", opts.threads)?)],
        Stage::Memcheck => memcheck::groups(layout, stage, "memcheck", opts, opts.threads)?,
        Stage::Suite => {
            let mut group = vec![tests("suite-tests", Some(opts.threads.unwrap_or(4)))?];
            group.extend(memcheck::groups(layout, stage, "suite-memcheck", opts, None)?.concat());
            vec![group]
        }
        Stage::Precision => {
            let expr = expr(&stage.binaries(opts), None)?;
            vec![one(nextest("precision", GPU, opts.threads, expr))]
        }
        Stage::Racecheck => {
            let bench = path_arg(&layout.binary("gpu_graph_speed")?);
            let mut groups = Vec::new();
            for pair in &opts.racecheck {
                let (target, size) = pair
                    .split_once('@')
                    .ok_or_else(|| format!("--racecheck {pair}: expected TARGET@b/t/h"))?;
                let label = format!("racecheck-{target}-{}", size.replace('/', "-"));
                let mut args = memcheck::sanitizer_args("racecheck");
                args.extend(words(&[&bench, "profile", target, size]));
                let step = direct(stage, &label, "compute-sanitizer".into(), args);
                let report = Report::Sanitizer;
                groups.push(one(Step { report, ..step }));
            }
            groups
        }
        Stage::Speed => speed(layout, opts)?,
        Stage::Ncu => ncu(layout, opts)?,
        Stage::Torch => vec![one(torch(layout))],
        Stage::Perf => {
            let mut groups = speed(layout, opts)?;
            groups.extend(ncu(layout, opts)?);
            groups.push(one(torch(layout)));
            for step in groups.iter_mut().flatten() {
                step.stage = Stage::Perf;
            }
            groups
        }
        Stage::Matmul => {
            let bench = layout.binary("gpu_matmul")?;
            vec![one(direct(stage, "matmul", bench, vec![]))]
        }
        Stage::Eager => {
            let bench = layout.binary("runtime_eager_bench")?;
            let args = vec![opts.steps.to_string()];
            vec![one(direct(stage, "eager", bench, args))]
        }
        Stage::Examples => {
            let mut groups = Vec::new();
            for (i, name) in opts.examples.iter().enumerate() {
                let (_, binary, args, epochs) = example_run(name)?;
                // A run named again gets `-2`, `-3`, ...
                let label = match opts.examples[..i].iter().filter(|n| *n == name).count() {
                    0 => format!("example-{name}"),
                    n => format!("example-{name}-{}", n + 1),
                };
                let out = layout.logs.join("examples").join(&label);
                let mut args = words(args);
                if epochs {
                    args.extend(["--epochs".into(), opts.epochs.to_string()]);
                }
                args.extend(["--out".into(), path_arg(&out)]);
                let step = direct(stage, &label, layout.binary(binary)?, args);
                let report = Report::Example(out);
                groups.push(one(Step { report, ..step }));
            }
            groups
        }
        Stage::Fuzz => {
            let expr = expr(&stage.binaries(opts), Some("test(/::gpu::/)"))?;
            let step = nextest("fuzz", GPU, Some(opts.threads.unwrap_or(2)), expr);
            let env = fuzz_env(opts.fuzz_programs.unwrap_or(100));
            let mut groups = vec![one(Step { env, ..step })];
            if !opts.trace_seeds.is_empty() {
                groups.push(fuzz_traces(layout, opts)?);
            }
            groups
        }
        Stage::Reliability => {
            let all = expr(&stage.binaries(opts), Some("test(/::gpu::/)"))?;
            let all = nextest("reliability", GPU, Some(opts.threads.unwrap_or(8)), all);
            let fuzz = binaries::find("fuzz")?;
            let filter = format!("{}gpu::fused_", fuzz.filter.unwrap_or_default());
            let fuzz = memcheck::sanitized(
                layout,
                stage,
                "reliability-memcheck",
                fuzz,
                &[filter],
                false,
            )?;
            vec![vec![
                Step {
                    env: fuzz_env(opts.fuzz_programs.unwrap_or(300)),
                    ..all
                },
                Step {
                    env: env(&[("FUZZ_PROGRAMS", "20")]),
                    ..fuzz
                },
            ]]
        }
        Stage::Cold => {
            let trainer = layout.binary("gpu_trainer")?;
            let mut group = Vec::new();
            for (k, filter) in opts.cold_filters.iter().enumerate() {
                for i in 0..opts.procs {
                    let label = format!("cold-{k}-{i}");
                    let tests = filter.split_whitespace().map(String::from);
                    group.push(fresh(layout, stage, &label, &trainer, tests, false));
                }
            }
            vec![group]
        }
    })
}

/// The fuzzer keeps going past a failing program, over this many per stack.
fn fuzz_env(programs: u32) -> Vec<(String, String)> {
    env(&[
        ("FUZZ_KEEP_GOING", "1"),
        ("FUZZ_PROGRAMS", &programs.to_string()),
    ])
}

/// The filterset of a nextest step: the binaries' tests, narrowed by the user's
/// filterset and name filters (or else the stage's default selection) and `--stack`,
/// without the tests this machine cannot run.
fn expression(
    names: &[&str],
    default: Option<&str>,
    opts: &StageOptions,
    gpus: usize,
) -> Result<String, String> {
    let selection: Vec<String> = binaries::select(names)?
        .iter()
        .map(|b| b.selector())
        .collect();
    let mut parts = vec![selection.join(" | ")];
    let mut user = Vec::new();
    user.extend(opts.filterset.clone());
    if !opts.filters.is_empty() {
        let names: Vec<String> = opts.filters.iter().map(|f| format!("test(~{f})")).collect();
        user.push(names.join(" | "));
    }
    if user.is_empty() {
        parts.extend(default.map(String::from));
    } else {
        parts.extend(user);
    }
    if let Some(stack) = opts.stack {
        let name = stack.module();
        parts.push(format!(
            "test(/::{name}::/) | test(/::gpu::(\\w+_)?{name}_/)"
        ));
    }
    let trainer = binaries::find("gpu_trainer")?.selector();
    // A rank process of `killed_rank_process_is_a_typed_error_on_its_peer`, not a test.
    parts.push(format!("not ({trainer} & test(=two_gpus::rank_process))"));
    if gpus < 2 {
        parts.push(format!("not ({trainer} & test(/^two_gpus::/))"));
    }
    let parts: Vec<String> = parts.iter().map(|p| format!("({p})")).collect();
    Ok(parts.join(" & "))
}

/// A nextest run of `expr` from the unpacked archive, in a workspace of its own.
fn nextest(
    layout: &Layout,
    stage: Stage,
    label: &str,
    profile: &str,
    threads: Option<usize>,
    expr: String,
) -> Step {
    let workspace = layout.work.join("nextest").join(label);
    let target = layout.nextest_target();
    let meta = |file: &str| path_arg(&target.join("nextest").join(file));
    let mut args = words(&[
        "nextest",
        "run",
        "--binaries-metadata",
        &meta("binaries-metadata.json"),
        "--cargo-metadata",
        &meta("cargo-metadata.json"),
        "--target-dir-remap",
        &path_arg(&target),
        "--workspace-remap",
        &path_arg(&workspace),
        "--config-file",
        &path_arg(&layout.repo.join(".config/nextest.toml")),
        "--user-config-file",
        "none",
        "--profile",
        profile,
        "--run-ignored",
        "only",
        "--color",
        "never",
    ]);
    if let Some(threads) = threads {
        args.extend(["--test-threads".into(), threads.to_string()]);
    }
    args.extend(["-E".into(), expr]);
    let junit = workspace.join(format!("target/nextest/{profile}/junit.xml"));
    let program = layout.unpacked().join("cargo-nextest");
    Step {
        dir: Dir::Nextest(workspace),
        report: Report::JUnit(junit),
        ..direct(stage, label, program, args)
    }
}

/// A step run as it is, in the shared folder, with the stage's time limit and a log of
/// its own.
fn direct(stage: Stage, label: &str, program: PathBuf, args: Vec<String>) -> Step {
    Step {
        stage,
        label: label.into(),
        program,
        args,
        env: vec![],
        dir: Dir::Shared,
        timeout_s: stage.timeout_s(),
        log: format!("{label}.log"),
        append: false,
        report: Report::Exit,
    }
}

/// A test binary run by itself on the tests `filters` names, one thread, in a fresh
/// folder with empty caches.
fn fresh(
    layout: &Layout,
    stage: Stage,
    label: &str,
    binary: &Path,
    filters: impl IntoIterator<Item = String>,
    autotune_log: bool,
) -> Step {
    let mut args = words(&["--ignored", "--test-threads=1", "--nocapture"]);
    args.extend(filters);
    let dir = layout.work.join("fresh").join(label);
    Step {
        dir: Dir::Fresh { dir, autotune_log },
        ..direct(stage, label, binary.to_path_buf(), args)
    }
}

/// One process per size: eager memory is the growth of fresh pools, so a size run after
/// a larger one in the same process would find its pages already reserved.
fn speed(layout: &Layout, opts: &StageOptions) -> Result<Vec<Group>, String> {
    let bench = layout.binary("gpu_graph_speed")?;
    let suffix = label_suffix(opts);
    let mut groups = Vec::new();
    for size in opts.sizes.split(',').filter(|s| !s.is_empty()) {
        let label = format!("speed-{}{suffix}", size.replace('/', "-"));
        let mut args = vec![size.to_string()];
        args.extend(opts.stacks.clone());
        groups.push(vec![Step {
            log: format!("speed{suffix}.log"),
            append: true,
            ..direct(Stage::Speed, &label, bench.clone(), args)
        }]);
    }
    Ok(groups)
}

/// ncu replays each kernel of the profiled step with the caches flushed, summing
/// gpu__time_duration (as for the anchors in bench/results).
fn ncu(layout: &Layout, opts: &StageOptions) -> Result<Vec<Group>, String> {
    let bench = path_arg(&layout.binary("gpu_graph_speed")?);
    let suffix = label_suffix(opts);
    let mut groups = Vec::new();
    for target in &opts.ncu_targets {
        for size in &opts.ncu_sizes {
            let label = format!("ncu-{target}-{}{suffix}", size.replace('/', "-"));
            let csv = layout.logs.join(format!("{label}.csv"));
            let mut args = words(&[
                "--profile-from-start",
                "off",
                "--clock-control",
                "none",
                "--metrics",
                "gpu__time_duration.sum",
                "--csv",
                "--print-units",
                "base",
            ]);
            if let Some(flags) = &opts.ncu_flags {
                args.extend(flags.split_whitespace().map(String::from));
            }
            args.extend(words(&["--log-file", &path_arg(&csv), &bench]));
            args.extend(words(&["profile", target, size]));
            let report = Report::Ncu {
                csv,
                label: format!("{target}{suffix}"),
                size: size.clone(),
            };
            groups.push(vec![Step {
                log: format!("ncu-run{suffix}.log"),
                append: true,
                report,
                ..direct(Stage::Ncu, &label, "ncu".into(), args)
            }]);
        }
    }
    Ok(groups)
}

fn torch(layout: &Layout) -> Step {
    let script = path_arg(&layout.repo.join("bench/anchors/torch_anchor.py"));
    let step = direct(Stage::Torch, "torch", "python3".into(), vec![script]);
    let env = env(&[("PYTHONUNBUFFERED", "1")]);
    Step { env, ..step }
}

/// Each stack and seed in a fresh process: every event of the graphed and the eager run
/// (`FUZZ_TRACE`), and which kernels each step tuned first (CubeCL's autotune log).
fn fuzz_traces(layout: &Layout, opts: &StageOptions) -> Result<Group, String> {
    let binary = layout.binary("fuzz")?;
    let prefix = binaries::find("fuzz")?.filter.unwrap_or_default();
    let mut group = Vec::new();
    for stack in ["fused", "cube"] {
        for seed in &opts.trace_seeds {
            let label = format!("fuzz-trace-{stack}-{seed}");
            let test = format!("{prefix}gpu::{stack}_");
            let step = fresh(layout, Stage::Fuzz, &label, &binary, [test], true);
            let seed = seed.to_string();
            let env = env(&[
                ("FUZZ_TRACE", "1"),
                ("FUZZ_SEED", &seed),
                ("FUZZ_PROGRAMS", "1"),
            ]);
            group.push(Step { env, ..step });
        }
    }
    Ok(group)
}

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    (pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).collect()
}

pub fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

/// `-LABEL` for the file names of speed and ncu runs, when `--label` gives one.
fn label_suffix(opts: &StageOptions) -> String {
    opts.label
        .as_ref()
        .map_or(String::new(), |l| format!("-{l}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn layout(gpus: usize) -> Layout {
        let mut test_binaries = BTreeMap::new();
        for b in binaries::BINARIES.iter().filter(|b| b.kind == Kind::Test) {
            test_binaries.insert(
                b.binary_id(),
                PathBuf::from(format!("/w/pack/t/{}", b.target)),
            );
        }
        Layout {
            repo: "/repo".into(),
            work: "/w".into(),
            logs: "/w/logs/1".into(),
            gpus,
            test_binaries,
            ignored_tests: BTreeMap::new(),
        }
    }

    /// The stage planned with these options on one GPU.
    pub(super) fn planned(stage: Stage, args: &[&str]) -> Result<Vec<Group>, String> {
        plan(stage, &StageOptions::parse(args), &layout(1))
    }

    pub(super) fn steps(stage: Stage, args: &[&str]) -> Vec<Vec<Step>> {
        planned(stage, args).unwrap()
    }

    #[test]
    fn tests_run_the_three_suites_from_the_unpacked_archive() {
        let groups = steps(Stage::Tests, &[]);
        let step = &groups[0][0];
        assert_eq!(step.program, PathBuf::from("/w/pack/cargo-nextest"));
        let line = step.command_line();
        for part in [
            "nextest run --binaries-metadata /w/pack/nextest/target/nextest/binaries-metadata.json",
            "--cargo-metadata /w/pack/nextest/target/nextest/cargo-metadata.json",
            "--target-dir-remap /w/pack/nextest/target --workspace-remap /w/nextest/tests",
            "--config-file /repo/.config/nextest.toml",
            "--profile gpu --run-ignored only",
        ] {
            assert!(line.contains(part), "{part} not in {line}");
        }
        assert!(!line.contains("--test-threads"), "the profile's one thread");
        let expr = step.args.last().unwrap();
        assert_eq!(
            expr,
            "(binary_id(burn-graph-capture::gpu_runtime) | binary_id(burn-graph-capture::gpu_capture) \
             | binary_id(integration-tests::gpu_trainer)) \
             & (not (binary_id(integration-tests::gpu_trainer) & test(=two_gpus::rank_process))) \
             & (not (binary_id(integration-tests::gpu_trainer) & test(/^two_gpus::/)))"
        );
        assert_eq!(
            step.report,
            Report::JUnit("/w/nextest/tests/target/nextest/gpu/junit.xml".into())
        );
    }

    #[test]
    fn two_gpus_tests_run_where_two_gpus_are() {
        let groups = plan(Stage::Tests, &StageOptions::parse(&[]), &layout(2)).unwrap();
        let expr = groups[0][0].args.last().unwrap().clone();
        assert!(expr.contains("rank_process"));
        assert!(!expr.contains("/^two_gpus::/"));
    }

    #[test]
    fn name_filters_and_the_stack_narrow_the_selection() {
        let groups = steps(
            Stage::Tests,
            &[
                "--bins",
                "gpu_trainer",
                "--stack",
                "fused",
                "-j",
                "4",
                "--",
                "fused_lstm::",
                "matmul::",
            ],
        );
        let step = &groups[0][0];
        assert!(step.command_line().contains("--test-threads 4"));
        let expr = step.args.last().unwrap();
        assert!(expr.starts_with(
            "(binary_id(integration-tests::gpu_trainer)) & (test(~fused_lstm::) | test(~matmul::)) \
             & (test(/::fused::/) | test(/::gpu::(\\w+_)?fused_/))"
        ));
    }

    /// `tests` runs all of gpu_runtime (memcheck leaves two of its tests out): only the
    /// trainer's selection is narrowed.
    #[test]
    fn tests_runs_every_runtime_test() {
        let tests = steps(Stage::Tests, &[])[0][0].args.last().unwrap().clone();
        let mut parts = tests.split(") & (");
        let runtime = "binary_id(burn-graph-capture::gpu_runtime)";
        assert!(parts.next().unwrap().starts_with(&format!("({runtime} | ")));
        assert!(parts.all(|p| p.starts_with("not (binary_id(integration-tests::gpu_trainer)")));
    }

    #[test]
    fn suite_runs_tests_and_memcheck_side_by_side() {
        let groups = steps(Stage::Suite, &[]);
        assert_eq!(groups.len(), 1);
        let labels: Vec<_> = groups[0].iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels.len(), 11);
        assert_eq!(
            labels[..3],
            [
                "suite-tests",
                "suite-memcheck-runtime",
                "suite-memcheck-capture"
            ]
        );
        assert!(groups[0][0].command_line().contains("--test-threads 4"));
        assert!(
            groups[0][1]
                .command_line()
                .contains("compute-sanitizer --tool memcheck")
        );
    }

    #[test]
    fn modules_of_the_integration_binary_are_filtered_by_prefix() {
        let groups = steps(Stage::Reliability, &["--fuzz-programs", "50"]);
        let [tests, memcheck] = &groups[0][..] else {
            panic!("two steps")
        };
        let expr = tests.args.last().unwrap();
        assert!(expr.starts_with(
            "((binary_id(integration-tests::integration) & test(/^fuzz::/)) \
             | (binary_id(integration-tests::integration) & test(/^threads::/)) \
             | (binary_id(integration-tests::integration) & test(/^shared_embedding::/))) \
             & (test(/::gpu::/))"
        ));
        assert!(tests.env.contains(&("FUZZ_PROGRAMS".into(), "50".into())));
        assert!(
            memcheck
                .command_line()
                .starts_with("FUZZ_PROGRAMS=20 compute-sanitizer --tool memcheck")
        );
        assert!(
            memcheck
                .command_line()
                .ends_with("/w/pack/t/integration --ignored --test-threads=1 fuzz::gpu::fused_")
        );
        assert!(
            memcheck
                .env
                .contains(&("FUZZ_PROGRAMS".into(), "20".into()))
        );
    }

    #[test]
    fn fuzz_traces_run_the_test_binary_in_fresh_folders() {
        let groups = steps(Stage::Fuzz, &["--trace-seeds", "38,14"]);
        assert_eq!(groups.len(), 2);
        assert!(groups[0][0].command_line().contains("--test-threads 2"));
        let traces = &groups[1];
        assert_eq!(traces.len(), 4);
        assert_eq!(
            traces[0].command_line(),
            "FUZZ_TRACE=1 FUZZ_SEED=38 FUZZ_PROGRAMS=1 /w/pack/t/integration --ignored \
             --test-threads=1 --nocapture fuzz::gpu::fused_"
        );
        assert_eq!(
            traces[0].dir,
            Dir::Fresh {
                dir: "/w/fresh/fuzz-trace-fused-38".into(),
                autotune_log: true
            }
        );
    }

    #[test]
    fn perf_runs_each_size_alone_then_ncu_then_torch() {
        let groups = steps(Stage::Perf, &["--stacks", "fused,fused-lstm"]);
        let lines: Vec<String> = groups.iter().map(|g| g[0].command_line()).collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(
            lines[0],
            "/w/pack/bin/gpu_graph_speed 32/64/256 fused,fused-lstm"
        );
        assert_eq!(
            lines[2],
            "/w/pack/bin/gpu_graph_speed 128/32/512 fused,fused-lstm"
        );
        assert!(
            groups[..3]
                .iter()
                .all(|g| g[0].log == "speed.log" && g[0].append)
        );
        assert_eq!(
            lines[3],
            "ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
             --csv --print-units base --log-file /w/logs/1/ncu-fused-32-64-256.csv \
             /w/pack/bin/gpu_graph_speed profile fused 32/64/256"
        );
        assert_eq!(
            lines[4],
            "PYTHONUNBUFFERED=1 python3 /repo/bench/anchors/torch_anchor.py"
        );
        assert!(groups.iter().all(|g| g[0].stage == Stage::Perf));
    }

    #[test]
    fn labelled_speed_runs_keep_their_own_logs() {
        let groups = steps(
            Stage::Speed,
            &["--sizes", "128/32/512", "--label", "route-off"],
        );
        assert_eq!(groups[0][0].log, "speed-route-off.log");
        assert_eq!(groups[0][0].label, "speed-128-32-512-route-off");
    }

    #[test]
    fn racecheck_profiles_one_step_per_target_and_size() {
        let groups = steps(Stage::Racecheck, &[]);
        assert_eq!(groups.len(), 4);
        assert_eq!(
            groups[0][0].command_line(),
            "compute-sanitizer --tool racecheck --error-exitcode 17 --print-limit 20 \
             /w/pack/bin/gpu_graph_speed profile fused-lstm 40/8/64"
        );
        assert!(planned(Stage::Racecheck, &["--racecheck", "fused"]).is_err());
    }

    #[test]
    fn examples_run_in_order_and_twice_when_named_twice() {
        let groups = steps(Stage::Examples, &["--examples", "lstm-gru,lstm-gru,charlm"]);
        let lines: Vec<String> = groups.iter().map(|g| g[0].command_line()).collect();
        assert_eq!(
            lines,
            [
                "/w/pack/bin/lstm --gru --compare --epochs 3 --out /w/logs/1/examples/example-lstm-gru",
                "/w/pack/bin/lstm --gru --compare --epochs 3 --out /w/logs/1/examples/example-lstm-gru-2",
                "/w/pack/bin/charlm --out /w/logs/1/examples/example-charlm",
            ]
        );
        assert_eq!(
            Stage::Examples.binaries(&StageOptions::parse(&[
                "--examples",
                "lstm,charlm,lstm-fused"
            ])),
            ["charlm", "lstm"]
        );
    }

    #[test]
    fn cold_starts_every_process_with_empty_caches() {
        let groups = steps(
            Stage::Cold,
            &["--procs", "3", "--cold-filters", "a::x a::y;b::z"],
        );
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].len(), 6);
        assert_eq!(
            groups[0][1].command_line(),
            "/w/pack/t/gpu_trainer --ignored --test-threads=1 --nocapture a::x a::y"
        );
        assert!(matches!(&groups[0][5].dir, Dir::Fresh { dir, .. } if dir.ends_with("cold-1-2")));
    }

    #[test]
    fn an_unknown_binary_is_refused_when_planning() {
        let error = planned(Stage::Tests, &["--bins", "nope"]).unwrap_err();
        assert!(error.contains("no binary named nope"), "{error}");
        assert!(planned(Stage::Tests, &["--bins", "gpu_runtime"]).is_ok());
    }

    #[test]
    fn every_stage_plans_and_names_packed_binaries() {
        let defaults = StageOptions::parse(&[]);
        for stage in Stage::value_variants() {
            plan(*stage, &defaults, &layout(1)).unwrap();
            binaries::select(&stage.binaries(&defaults)).unwrap();
        }
    }
}
