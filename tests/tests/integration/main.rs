//! The integration tests that run on the CPU (Flex), in one test binary, `integration`:
//! one module per area, so the workspace is linked once for all of them rather than once
//! per file. A test's path starts with its module (`fuzz::`, `threads::`, `dropout::`);
//! `cargo test -p integration-tests --test integration fuzz::` runs one area.
//!
//! `fuzz`, `threads` and `shared_embedding` also hold GPU variants (feature `cuda`,
//! `#[ignore]`d, in a `gpu` module of each: `fuzz::gpu::`, `threads::gpu::`,
//! `shared_embedding::gpu::`), which `xtask gpu run` runs. The GPU trainer tests
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
mod emulated_graphs;
mod fused_gru;
mod fused_lstm;
mod fuzz;
mod graph_tree;
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
mod traced_ranks;
mod traced_replays;
mod unlisted_inputs;

/// What this binary's layout relies on, which nothing else checks: a file in
/// `integration/` that `mod` does not name is never compiled; a file directly in
/// `tests/tests/` is a binary of its own (another link of the workspace); and a test that
/// does not take `common::rng` first can move the numbers a seeded test on another
/// thread expects.
#[test]
fn every_file_is_a_module_and_every_test_takes_the_generator_lock() {
    let _rng = crate::common::rng::shared();
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let files = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
            .collect();
        files.sort();
        files
    };
    assert_eq!(
        files(&tests),
        Vec::<std::path::PathBuf>::new(),
        "test files go into tests/integration/ as modules"
    );
    let main = std::fs::read_to_string(tests.join("integration/main.rs")).unwrap();
    let mut missing = Vec::new();
    for file in files(&tests.join("integration")) {
        let name = file.file_stem().unwrap().to_str().unwrap().to_string();
        if name != "main" && !main.lines().any(|line| line == format!("mod {name};")) {
            missing.push(format!("{name}: not a module (mod {name}; in main.rs)"));
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let mut lines = text.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if line != "#[test]" {
                continue;
            }
            // Past the other attributes and the signature, to the first statement.
            let signature = lines
                .by_ref()
                .find(|line| !line.starts_with("#[") && line.ends_with('{'));
            let first = lines.next().unwrap_or_default();
            if !first.starts_with("let _rng = crate::common::rng::") {
                missing.push(format!("{name}: {}", signature.unwrap_or_default()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "every file here is a module (`mod` in main.rs), and every test's first statement \
         `let _rng = crate::common::rng::shared();` (or `exclusive()`: common/rng.rs):\n{}",
        missing.join("\n")
    );
}
