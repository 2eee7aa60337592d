//! The trainer logs each mode change at info level and every step at debug level.
//!
//! Counted in a process of its own: tracing's level filter and callsites' interest are
//! process-wide, so other tests on other threads of this binary (their subscribers come
//! and go) could filter out a debug line this test's subscriber wants.

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};

use burn::backend::Flex;
use burn_graph_capture::optim::CapturableSgdConfig;
use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, TrainBackend};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig, SineTask};
use tracing::Level;

type B = TrainBackend<Flex>;

/// A log sink the test can read back.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Set in the child process that counts the lines.
const CHILD: &str = "STEP_TRACING_CHILD";

#[test]
fn mode_changes_are_info_and_steps_are_debug() {
    let _rng = crate::common::rng::shared();
    if std::env::var_os(CHILD).is_some() {
        return count_log_lines();
    }
    let module = module_path!().split_once("::").map_or("", |(_, path)| path);
    let test = format!("{module}::mode_changes_are_info_and_steps_are_debug");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("the child test process starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran the test: {stdout}"
    );
}

fn count_log_lines() {
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();

    let device = Default::default();
    let config = LstmRegressorConfig::new(4);
    let model = from_bytes::<B>(&config, to_bytes(config.init::<Flex>(&device)), &device);
    let optimizer = CapturableSgdConfig::new().init::<B>(&device);
    let loss = |m: &LstmRegressor<B>, b: &Batch<B>| m.loss(b.x.clone(), b.y.clone());
    let trainer_config = GraphTrainerConfig::new().with_warmup_steps(2);
    let mut trainer = GraphTrainer::new(model, optimizer, loss, trainer_config);
    let mut task = SineTask::new(1, 32);
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..4 {
            trainer.step(task.next_batch(2, 3, &device)).unwrap();
        }
    });

    let log = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let lines = |level: &str, text: &str| {
        log.lines()
            .filter(|l| l.contains(level) && l.contains(text))
            .count()
    };
    assert_eq!(lines("INFO", "graph trainer mode change"), 2, "{log}");
    assert_eq!(lines("DEBUG", "graph trainer step"), 4, "{log}");
    assert!(log.contains("NoHardwareGraphs"), "{log}");
}
