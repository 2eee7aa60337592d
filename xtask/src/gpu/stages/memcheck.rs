//! compute-sanitizer memcheck around the GPU test binaries, one process per module and
//! stack rather than per test.
//!
//! The sanitizer instruments every kernel a process loads, so a process pays for its
//! kernels once, however many tests it runs. Under nextest (a process per test) a
//! trainer test took minutes (H200, session 20: `correctness::cube::sgd_momentum` 352 s,
//! 20 of the stage's 55 tests in 506 s); a module per process ran all six `correctness`
//! tests in 220 s (session 4). So memcheck runs each test binary directly, libtest
//! picking the tests by name, and reads libtest's lines for the results. The cube
//! stack's trainer modules are still too slow for one process in a call; their tests
//! are dealt into a few processes each (`SPLIT`).

use super::super::binaries::{self, Binary};
use super::{Dir, Group, Layout, Report, StackName, Stage, StageOptions, Step, direct, env};

/// The trainer modules memcheck covers (their tests run at a tenth of their steps,
/// `GPU_TRAINER_SHORT`).
const TRAINER_MODULES: [&str; 4] = ["guards", "correctness", "memory", "inputs"];

/// Module-stacks too slow under memcheck for one process in a call, and into how many
/// processes their tests are dealt (H200, session 23, beside `gpu_trainer` at `-j 4`:
/// `guards::cube` ran 3 of its 6 tests and `inputs::cube` 7 of 12 in 466 s;
/// `correctness::cube` took 465 s for 3 and `memory::cube` 459 s for 2). Dealing needs
/// the binary's test list, which the GPU machine reads; a dry run shows them unsplit.
const SPLIT: [(&str, usize); 4] = [
    ("guards::cube::", 3),
    ("inputs::cube::", 3),
    ("correctness::cube::", 2),
    ("memory::cube::", 2),
];

/// The runtime tests memcheck runs (their parity children followed). Not
/// `t1_smoke_add_matmul_matches_burn_cuda` (its add and matmul are among
/// `op_parity_plain`'s ops) or `t4_op_parity_fused` (the `tests` stage runs both): under
/// compute-sanitizer stock burn-cuda's fused matmul took a TF32 kernel where ours did not
/// (rel err 2.5e-4, session 20), which fails the test for a reason that is not a memory
/// error.
const RUNTIME_TESTS: [&str; 3] = ["random_and_sync", "op_parity_plain", "lstm_parity_small"];

/// compute-sanitizer's options for every tool: a found error fails the process.
pub fn sanitizer_args(tool: &str) -> Vec<String> {
    let args = [
        "--tool",
        tool,
        "--error-exitcode",
        "17",
        "--print-limit",
        "20",
    ];
    args.iter().map(|a| a.to_string()).collect()
}

/// memcheck's own: `--target-processes all` follows the parity tests' child processes;
/// `--report-api-errors no`, since NCCL's start-up probes and cuBLAS return errors they
/// handle (memory errors still fail the process).
fn memcheck_args() -> Vec<String> {
    let mut args = sanitizer_args("memcheck");
    args.extend(["--target-processes", "all", "--report-api-errors", "no"].map(String::from));
    args
}

/// One process: a test binary on the tests its libtest name filters pick.
#[derive(Debug, PartialEq, Eq)]
struct Process {
    /// Its label's suffix.
    name: String,
    binary: &'static Binary,
    /// libtest name filters (none: every `#[ignore]`d test of the binary).
    filters: Vec<String>,
    /// The filters are whole test names (libtest's `--exact`).
    exact: bool,
}

/// The processes `opts` asks for: the default selection, narrowed by `--bins` and
/// `--stack`; or, with name filters after `--`, one process per binary on those.
fn processes(opts: &StageOptions, layout: &Layout) -> Result<Vec<Process>, String> {
    if opts.filterset.is_some() {
        let why = "memcheck picks tests by libtest name filters (after --), not by a filterset";
        return Err(why.into());
    }
    let bins = binaries::select(&opts.bins)?;
    if !opts.filters.is_empty() {
        if opts.stack.is_some() {
            let why = "memcheck: --stack narrows its default selection; with name filters, \
                       name the stack in them (e.g. guards::cube::)";
            return Err(why.into());
        }
        return bins
            .into_iter()
            .map(|binary| user_process(binary, &opts.filters))
            .collect();
    }
    let chosen: Vec<Process> = default_processes(layout)?
        .into_iter()
        .filter(|p| bins.contains(&p.binary))
        .filter(|p| match opts.stack {
            None => true,
            Some(stack) => {
                let module = format!("::{}::", stack.module());
                !p.filters.is_empty() && p.filters.iter().all(|f| f.contains(&module))
            }
        })
        .collect();
    if let Some(empty) = bins
        .iter()
        .find(|b| !chosen.iter().any(|p| p.binary == **b))
    {
        return Err(format!(
            "memcheck has no default tests in {} (with this --stack): name them after --",
            empty.name
        ));
    }
    Ok(chosen)
}

/// The runtime's small tests, the capture suite, and each trainer module per stack (the
/// slow ones of `SPLIT` dealt into several processes where the test list is known).
fn default_processes(layout: &Layout) -> Result<Vec<Process>, String> {
    let process = |name: &str, binary, filters: &[String]| -> Result<Process, String> {
        Ok(Process {
            name: name.into(),
            binary: binaries::find(binary)?,
            filters: filters.to_vec(),
            exact: false,
        })
    };
    let mut all = vec![
        process("runtime", "gpu_runtime", &RUNTIME_TESTS.map(String::from))?,
        process("capture", "gpu_capture", &[])?,
    ];
    let trainer = binaries::find("gpu_trainer")?;
    let listed = layout.ignored_tests.get(&trainer.binary_id());
    for module in TRAINER_MODULES {
        for stack in [StackName::Cube, StackName::Fused] {
            let name = format!("{module}-{}", stack.module());
            let filter = format!("{module}::{}::", stack.module());
            let parts = SPLIT.iter().find(|(f, _)| *f == filter).map(|(_, n)| *n);
            match (parts, listed) {
                (Some(parts), Some(tests)) => {
                    all.extend(dealt(trainer, &name, &filter, tests, parts))
                }
                _ => all.push(process(&name, "gpu_trainer", &[filter])?),
            }
        }
    }
    Ok(all)
}

/// The listed tests under `prefix`, dealt in turn into `parts` processes named
/// `{name}-1`, `{name}-2`, ... (alphabetical neighbours often share a fixture and its
/// cost, so dealing spreads them).
fn dealt(
    binary: &'static Binary,
    name: &str,
    prefix: &str,
    tests: &[String],
    parts: usize,
) -> Vec<Process> {
    let mine: Vec<&String> = tests.iter().filter(|t| t.starts_with(prefix)).collect();
    (0..parts.min(mine.len()))
        .map(|part| Process {
            name: format!("{name}-{}", part + 1),
            binary,
            filters: mine
                .iter()
                .skip(part)
                .step_by(parts)
                .map(|t| t.to_string())
                .collect(),
            exact: true,
        })
        .collect()
}

/// A binary on the user's filters; a module of a bigger binary only on its own tests.
fn user_process(binary: &'static Binary, filters: &[String]) -> Result<Process, String> {
    if let Some(prefix) = binary.filter
        && let Some(other) = filters.iter().find(|f| !f.starts_with(prefix))
    {
        return Err(format!(
            "memcheck --bins {}: filter {other} must start with {prefix} (libtest cannot \
             narrow the binary to that module otherwise)",
            binary.name
        ));
    }
    Ok(Process {
        name: binary.name.into(),
        binary,
        filters: filters.to_vec(),
        exact: false,
    })
}

/// The memcheck processes as steps labelled `{label}-{process}`, all side by side
/// unless `-j` says how many at once (`threads`).
pub fn groups(
    layout: &Layout,
    stage: Stage,
    label: &str,
    opts: &StageOptions,
    threads: Option<usize>,
) -> Result<Vec<Group>, String> {
    let mut steps = Vec::new();
    for p in processes(opts, layout)? {
        let label = format!("{label}-{}", p.name);
        let short = [("GPU_TRAINER_SHORT", "1")];
        steps.push(Step {
            env: env(&short),
            ..sanitized(layout, stage, &label, p.binary, &p.filters, p.exact)?
        });
    }
    let at_once = threads.unwrap_or(steps.len()).max(1);
    Ok(steps.chunks(at_once).map(<[Step]>::to_vec).collect())
}

/// `binary`'s ignored tests matching `filters` (whole names if `exact`), one at a time,
/// under memcheck.
pub fn sanitized(
    layout: &Layout,
    stage: Stage,
    label: &str,
    binary: &Binary,
    filters: &[String],
    exact: bool,
) -> Result<Step, String> {
    let mut args = memcheck_args();
    args.push(super::path_arg(&layout.binary(binary.name)?));
    args.extend(["--ignored", "--test-threads=1"].map(String::from));
    if exact {
        args.push("--exact".into());
    }
    if binary.name == "gpu_trainer" {
        // A rank process of `killed_rank_process_is_a_typed_error_on_its_peer` is not a
        // test; `two_gpus::` tests fail at once on one GPU.
        let skip = match layout.gpus {
            0 | 1 => "two_gpus::",
            _ => "two_gpus::rank_process",
        };
        args.extend(["--skip".into(), skip.into()]);
    }
    args.extend(filters.iter().cloned());
    Ok(Step {
        dir: Dir::Shared,
        report: Report::SanitizedTests,
        ..direct(stage, label, "compute-sanitizer".into(), args)
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{layout, planned, steps};
    use super::*;

    fn refused(args: &[&str]) -> String {
        planned(Stage::Memcheck, args).unwrap_err()
    }

    #[test]
    fn memcheck_runs_a_process_per_module_and_stack_at_a_tenth_of_the_steps() {
        let groups = steps(Stage::Memcheck, &[]);
        assert_eq!(groups.len(), 1, "every process at once");
        let labels: Vec<&str> = groups[0].iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "memcheck-runtime",
                "memcheck-capture",
                "memcheck-guards-cube",
                "memcheck-guards-fused",
                "memcheck-correctness-cube",
                "memcheck-correctness-fused",
                "memcheck-memory-cube",
                "memcheck-memory-fused",
                "memcheck-inputs-cube",
                "memcheck-inputs-fused",
            ]
        );
        let guards = &groups[0][2];
        assert_eq!(
            guards.command_line(),
            "GPU_TRAINER_SHORT=1 compute-sanitizer --tool memcheck --error-exitcode 17 \
             --print-limit 20 --target-processes all --report-api-errors no \
             /w/pack/t/gpu_trainer --ignored --test-threads=1 --skip two_gpus:: guards::cube::"
        );
        assert_eq!(guards.report, Report::SanitizedTests);
        assert_eq!(guards.log, "memcheck-guards-cube.log");
        let capture = groups[0][1].command_line();
        assert!(capture.ends_with("/w/pack/t/gpu_capture --ignored --test-threads=1"));
    }

    /// libtest's filters select the tests whose names contain one of them.
    #[test]
    fn memcheck_leaves_out_the_runtime_tests_tf32_moves() {
        let runtime = &steps(Stage::Memcheck, &[])[0][0];
        let filters = &runtime.args[runtime.args.len() - 3..];
        let runs = |test: &str| filters.iter().any(|f| test.contains(f.as_str()));
        let kept = [
            "t2_random_and_sync_work",
            "t3_op_parity_plain",
            "t5_lstm_parity_small",
        ];
        assert!(kept.into_iter().all(runs), "{filters:?}");
        let left_out = [
            "t1_smoke_add_matmul_matches_burn_cuda",
            "t4_op_parity_fused",
        ];
        assert!(!left_out.into_iter().any(runs), "{filters:?}");
    }

    #[test]
    fn bins_stack_filters_and_j_narrow_or_split_the_processes() {
        let labels = |args: &[&str]| -> Vec<Vec<String>> {
            (steps(Stage::Memcheck, args).iter())
                .map(|g| g.iter().map(|s| s.label.clone()).collect())
                .collect()
        };
        assert_eq!(
            labels(&["--bins", "gpu_trainer", "--stack", "fused", "-j", "3"]),
            [
                vec![
                    "memcheck-guards-fused",
                    "memcheck-correctness-fused",
                    "memcheck-memory-fused"
                ],
                vec!["memcheck-inputs-fused"],
            ]
        );
        // Name filters: one process per binary, on them; a module of a bigger binary on
        // its own tests.
        let groups = steps(
            Stage::Memcheck,
            &["--bins", "gpu_runtime,gpu_capture", "--", "t2_", "c1_"],
        );
        let lines: Vec<String> = groups[0].iter().map(Step::command_line).collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("/w/pack/t/gpu_runtime --ignored --test-threads=1 t2_ c1_"));
        assert!(lines[1].ends_with("/w/pack/t/gpu_capture --ignored --test-threads=1 t2_ c1_"));
        assert_eq!(groups[0][1].label, "memcheck-gpu_capture");
        let fuzz = &steps(
            Stage::Memcheck,
            &["--bins", "fuzz", "--", "fuzz::gpu::cube_"],
        )[0][0];
        let line = fuzz.command_line();
        assert!(
            line.ends_with("/w/pack/t/integration --ignored --test-threads=1 fuzz::gpu::cube_")
        );
        // On two GPUs only the rank process is skipped.
        let opts = StageOptions::parse(&["--bins", "gpu_trainer"]);
        let groups = super::super::plan(Stage::Memcheck, &opts, &layout(2)).unwrap();
        assert!(
            groups[0][0]
                .command_line()
                .contains("--skip two_gpus::rank_process guards::cube::")
        );
    }

    /// On the GPU machine, where the trainer binary lists its tests, the slow cube
    /// modules are dealt into processes of whole names; the rest stay a module each.
    #[test]
    fn slow_modules_are_dealt_into_processes_when_the_tests_are_listed() {
        let mut layout = layout(1);
        let trainer = binaries::find("gpu_trainer").unwrap().binary_id();
        let names = |module: &'static str, n: usize| (0..n).map(move |i| format!("{module}t{i}"));
        let listed = (names("guards::cube::", 6))
            .chain(names("guards::fused::", 6))
            .chain(names("memory::cube::", 1))
            .chain(names("two_gpus::", 2))
            .collect();
        layout.ignored_tests.insert(trainer, listed);
        let opts = StageOptions::parse(&["--bins", "gpu_trainer"]);
        let groups = super::super::plan(Stage::Memcheck, &opts, &layout).unwrap();
        let labels: Vec<&str> = groups[0].iter().map(|s| s.label.as_str()).collect();
        // A split module dealt into as many processes as it has tests, none if it has
        // none (correctness::cube, inputs::cube here); unsplit modules as before.
        assert_eq!(
            labels,
            [
                "memcheck-guards-cube-1",
                "memcheck-guards-cube-2",
                "memcheck-guards-cube-3",
                "memcheck-guards-fused",
                "memcheck-correctness-fused",
                "memcheck-memory-cube-1",
                "memcheck-memory-fused",
                "memcheck-inputs-fused",
            ]
        );
        let second = groups[0][1].command_line();
        assert!(
            second.ends_with(
                "--ignored --test-threads=1 --exact --skip two_gpus:: \
                 guards::cube::t1 guards::cube::t4"
            ),
            "{second}"
        );
        let fused = groups[0][3].command_line();
        assert!(
            fused.ends_with("--skip two_gpus:: guards::fused::"),
            "{fused}"
        );
        assert!(!fused.contains("--exact"), "{fused}");
    }

    #[test]
    fn what_memcheck_cannot_run_is_refused() {
        assert!(refused(&["-E", "test(x)"]).contains("not by a filterset"));
        assert!(refused(&["--stack", "cube", "--", "guards::"]).contains("name the stack"));
        assert!(refused(&["--bins", "fuzz"]).contains("no default tests in fuzz"));
        let stackless = refused(&["--bins", "gpu_runtime", "--stack", "cube"]);
        assert!(
            stackless.contains("no default tests in gpu_runtime"),
            "{stackless}"
        );
        assert!(refused(&["--bins", "fuzz", "--", "gpu::"]).contains("must start with fuzz::"));
        assert!(refused(&["--bins", "nope"]).contains("no binary named nope"));
    }
}
