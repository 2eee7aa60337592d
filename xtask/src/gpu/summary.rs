//! What a run found: nextest's JUnit files and libtest's lines read for test counts and
//! failures, the exit status of every other step, and the measurements the benches
//! print, as one markdown summary.

use std::fmt::Write as _;

use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

/// The tests of one step.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TestResults {
    pub passed: usize,
    pub skipped: usize,
    /// `binary test: kind (message)`, one per failed test (the last attempt's).
    pub failures: Vec<String>,
    /// Tests that failed, then passed on a retry.
    pub flaky: usize,
}

impl TestResults {
    pub fn counts(&self) -> String {
        let mut text = format!("{} passed, {} failed", self.passed, self.failures.len());
        if self.skipped > 0 {
            let _ = write!(text, ", {} skipped", self.skipped);
        }
        if self.flaky > 0 {
            let _ = write!(text, ", {} flaky", self.flaky);
        }
        text
    }
}

/// Reads nextest's JUnit XML: each `testcase` passed unless it holds a `failure` or an
/// `error` (a `flakyFailure` beside a pass counts it flaky), or is `skipped`.
pub fn parse_junit(xml: &str) -> Result<TestResults, String> {
    let mut reader = Reader::from_str(xml);
    let mut junit = TestResults::default();
    // The open testcase: its name and what its children said.
    let mut case: Option<Case> = None;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| format!("JUnit at byte {}: {e}", reader.buffer_position()))?;
        match event {
            Event::Start(e) if e.name().as_ref() == b"testcase" => case = Some(Case::open(&e)?),
            Event::Empty(e) if e.name().as_ref() == b"testcase" => {
                Case::open(&e)?.close(&mut junit)
            }
            Event::End(e) if e.name().as_ref() == b"testcase" => {
                if let Some(done) = case.take() {
                    done.close(&mut junit);
                }
            }
            Event::Start(e) | Event::Empty(e) => {
                if let Some(case) = case.as_mut() {
                    case.child(&e)?;
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    Ok(junit)
}

/// A `testcase` being read.
struct Case {
    name: String,
    failure: Option<String>,
    flaky: bool,
    skipped: bool,
}

impl Case {
    fn open(e: &BytesStart) -> Result<Case, String> {
        Ok(Case {
            name: format!("{} {}", attribute(e, "classname")?, attribute(e, "name")?),
            failure: None,
            flaky: false,
            skipped: false,
        })
    }

    /// A child element: `failure`/`error` (the last attempt's), `flakyFailure` (an
    /// earlier attempt's, the test passed since), `skipped`.
    fn child(&mut self, e: &BytesStart) -> Result<(), String> {
        match e.name().as_ref() {
            kind @ (b"failure" | b"error") => {
                let mut text = String::from_utf8_lossy(kind).into_owned();
                let message = attribute(e, "message")?;
                let ty = attribute(e, "type")?;
                if !ty.is_empty() && ty != message {
                    let _ = write!(text, " ({ty})");
                }
                if !message.is_empty() {
                    let _ = write!(text, ": {message}");
                }
                self.failure = Some(text);
            }
            b"flakyFailure" | b"flakyError" => self.flaky = true,
            b"skipped" => self.skipped = true,
            _ => {}
        }
        Ok(())
    }

    fn close(self, junit: &mut TestResults) {
        match self.failure {
            Some(failure) => junit.failures.push(format!("{}: {failure}", self.name)),
            None if self.skipped => junit.skipped += 1,
            None => {
                junit.passed += 1;
                junit.flaky += usize::from(self.flaky);
            }
        }
    }
}

fn attribute(e: &BytesStart, name: &str) -> Result<String, String> {
    match e.try_get_attribute(name) {
        Ok(Some(a)) => a
            .unescape_value()
            .map(|v| v.into_owned())
            .map_err(|e| format!("JUnit attribute {name}: {e}")),
        Ok(None) => Ok(String::new()),
        Err(e) => Err(format!("JUnit attribute {name}: {e}")),
    }
}

/// How one step ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// Its exit status, or the signal that ended it.
    Failed(String),
    TimedOut(u64),
    /// Not started: the reason.
    NotRun(String),
}

impl Outcome {
    pub fn passed(&self) -> bool {
        *self == Outcome::Passed
    }

    fn text(&self) -> String {
        match self {
            Outcome::Passed => "ok".into(),
            Outcome::Failed(status) => format!("FAILED ({status})"),
            Outcome::TimedOut(s) => format!("TIMED OUT after {s} s"),
            Outcome::NotRun(why) => format!("NOT RUN: {why}"),
        }
    }
}

/// One step's row of the summary.
#[derive(Debug)]
pub struct StepResult {
    pub stage: String,
    pub label: String,
    pub outcome: Outcome,
    pub seconds: f64,
    /// The tests it ran, from nextest's JUnit file or libtest's lines.
    pub tests: Option<Result<TestResults, String>>,
    /// Lines for the summary (a sanitizer's summary line, an example's summary.json).
    pub notes: Vec<String>,
}

/// The run's markdown summary: the machine, one row per step, failed tests, then the
/// benches' tables and the notes.
pub fn markdown(header: &[String], results: &[StepResult], extra: &[String]) -> String {
    let mut out = String::new();
    for line in header {
        let _ = writeln!(out, "{line}  ");
    }
    out.push('\n');
    out.push_str("| stage | step | result | tests | seconds |\n|---|---|---|---|---|\n");
    for r in results {
        let tests = match &r.tests {
            Some(Ok(tests)) => tests.counts(),
            Some(Err(e)) => format!("unreadable: {e}"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} |",
            r.stage,
            r.label,
            r.outcome.text(),
            tests.replace('|', "/"),
            r.seconds
        );
    }
    let failures: Vec<String> = results
        .iter()
        .filter_map(|r| match &r.tests {
            Some(Ok(tests)) => Some(
                tests
                    .failures
                    .iter()
                    .map(move |f| format!("- {}: {f}", r.label)),
            ),
            _ => None,
        })
        .flatten()
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\nFailed tests:\n{}", failures.join("\n"));
    }
    let notes: Vec<String> = results
        .iter()
        .flat_map(|r| r.notes.iter().map(move |n| format!("- {}: {n}", r.label)))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n{}", notes.join("\n"));
    }
    for block in extra {
        let _ = writeln!(out, "\n{}", block.trim_end());
    }
    let failed = results.iter().filter(|r| !r.outcome.passed()).count();
    let _ = writeln!(
        out,
        "\n{} of {} steps passed",
        results.len() - failed,
        results.len()
    );
    out
}

/// The speed bench's tables in a log (from each `| b/t/h` header on; one per process,
/// so one per size), merged: the first table's header, then every table's rows.
pub fn speed_rows(log: &str) -> Vec<String> {
    let mut rows = Vec::new();
    let mut rest = log;
    while let Some(start) = rest.find("| b/t/h") {
        let table: Vec<&str> = (rest[start..].lines())
            .take_while(|l| l.starts_with('|'))
            .collect();
        rest = &rest[start + table.join("\n").len()..];
        let header = if rows.is_empty() { 0 } else { 2 };
        rows.extend(table.iter().skip(header).map(|l| l.to_string()));
    }
    rows
}

/// libtest's results in the log of a test binary run directly (one test at a time, its
/// output captured): `test NAME ... ok|FAILED|ignored` per test. Output that libtest
/// cannot capture (a sanitizer's report, a raw write) may come between the name and the
/// result, which then ends a later line. Reading stops at libtest's `failures:` section,
/// where failed tests' output is quoted (a parity test quotes its child's libtest lines).
/// A test started without a result did not finish (the process was stopped or crashed);
/// with no test at all, the log shows no libtest run.
pub fn parse_libtest(log: &str) -> Result<TestResults, String> {
    let mut tests = TestResults::default();
    let mut ran = false;
    let mut open: Option<&str> = None;
    for line in log.lines() {
        if open.is_none() && line == "failures:" {
            break;
        }
        let (name, rest) = match line
            .strip_prefix("test ")
            .and_then(|l| l.split_once(" ... "))
        {
            Some((name, rest)) => {
                if let Some(unread) = open.take() {
                    tests.failures.push(format!("{unread}: no result read"));
                }
                ran = true;
                (name, rest)
            }
            None => match open.take() {
                Some(name) => (name, line),
                None => continue,
            },
        };
        let rest = rest.trim_end();
        if rest.ends_with("ok") {
            tests.passed += 1;
        } else if rest.ends_with("FAILED") {
            tests.failures.push(format!("{name}: failed"));
        } else if rest.ends_with("ignored") || rest.contains("ignored, ") {
            tests.skipped += 1;
        } else {
            open = Some(name);
        }
    }
    if let Some(name) = open {
        tests.failures.push(format!("{name}: did not finish"));
    }
    match ran {
        true => Ok(tests),
        false => Err("no libtest results in the log".into()),
    }
}

/// compute-sanitizer's closing line (`ERROR SUMMARY`, `RACECHECK SUMMARY`).
pub fn sanitizer_summary(log: &str) -> Option<String> {
    log.lines()
        .rev()
        .find(|l| l.contains(" SUMMARY: "))
        .map(|l| l.trim_start_matches("========= ").trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nextest 0.9.143's JUnit for a failing, a flaky, a passing and a timed-out test
    /// (from a real run; backtraces and outputs cut short), and one passing test of
    /// another binary.
    const SAMPLE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="4" skipped="0" failures="2" errors="0" uuid="eccaa947-6b5f-43d3-b343-0149a3488f70" timestamp="2026-12-04T19:39:25.446+00:00" time="2.229">
    <testsuite name="a::ta" tests="4" skipped="0" errors="0" failures="2">
        <testcase name="fails" classname="a::ta" timestamp="2026-12-04T19:39:25.448+00:00" time="0.217">
            <failure message="thread &apos;fails&apos; (811) panicked at a/tests/ta.rs:2:22" type="test failure with exit code 101">thread &apos;fails&apos; (811) panicked at a/tests/ta.rs:2:22:
assertion `left == right` failed: values differ
   3: core::panicking::assert_failed::&lt;i32, i32&gt;</failure>
            <system-out>
running 1 test
test fails ... FAILED
</system-out>
            <system-err>
thread &apos;fails&apos; (811) panicked at a/tests/ta.rs:2:22:
</system-err>
        </testcase>
        <testcase name="flaky" classname="a::ta" timestamp="2026-12-04T19:39:25.654+00:00" time="0.015">
            <flakyFailure timestamp="2026-12-04T19:39:25.446+00:00" time="0.206" message="thread &apos;flaky&apos; (810) panicked at a/tests/ta.rs:5:56" type="test failure with exit code 101">thread &apos;flaky&apos; (810) panicked at a/tests/ta.rs:5:56:
first attempt
                <system-out>
running 1 test
test flaky ... FAILED
</system-out>
                <system-err>
</system-err>
            </flakyFailure>
            <system-out>
running 1 test
test flaky ... ok
</system-out>
            <system-err></system-err>
        </testcase>
        <testcase name="passes" classname="a::ta" timestamp="2026-12-04T19:39:25.665+00:00" time="0.008">
            <system-out>
running 1 test
graphed vs eager: equal
test passes ... ok
</system-out>
            <system-err></system-err>
        </testcase>
        <testcase name="slow" classname="a::ta" timestamp="2026-12-04T19:39:25.669+00:00" time="2.006">
            <failure type="test timeout"/>
            <system-out>
running 1 test
</system-out>
            <system-err></system-err>
        </testcase>
    </testsuite>
    <testsuite name="xtask::bin/xtask" tests="1" skipped="0" errors="0" failures="0">
        <testcase name="classify::tests::arguments_are_classified" classname="xtask::bin/xtask" timestamp="2026-12-04T19:29:59.284+00:00" time="0.007"/>
    </testsuite>
</testsuites>
"#;

    #[test]
    fn junit_counts_passes_failures_and_flaky_tests() {
        let junit = parse_junit(SAMPLE).unwrap();
        assert_eq!(junit.passed, 3);
        assert_eq!(junit.flaky, 1);
        assert_eq!(
            junit.failures,
            [
                "a::ta fails: failure (test failure with exit code 101): thread 'fails' (811) \
                 panicked at a/tests/ta.rs:2:22",
                "a::ta slow: failure (test timeout)",
            ]
        );
        assert_eq!(junit.counts(), "3 passed, 2 failed, 1 flaky");
    }

    #[test]
    fn broken_junit_is_an_error() {
        assert!(parse_junit("<testsuites><testcase name='a'></testsuites>").is_err());
    }

    #[test]
    fn the_summary_lists_steps_failures_and_notes() {
        let results = vec![
            StepResult {
                stage: "tests".into(),
                label: "tests".into(),
                outcome: Outcome::Failed("exit status: 100".into()),
                seconds: 12.4,
                tests: Some(parse_junit(SAMPLE)),
                notes: vec![],
            },
            StepResult {
                stage: "racecheck".into(),
                label: "racecheck-fused-lstm-40-8-64".into(),
                outcome: Outcome::Passed,
                seconds: 30.0,
                tests: None,
                notes: vec!["RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".into()],
            },
        ];
        let text = markdown(&["machine: H200".into()], &results, &["| b/t/h |".into()]);
        assert!(text.contains(
            "| tests | tests | FAILED (exit status: 100) | 3 passed, 2 failed, 1 flaky | 12 |"
        ));
        assert!(text.contains("- tests: a::ta slow: failure (test timeout)"));
        assert!(text.contains("- racecheck-fused-lstm-40-8-64: RACECHECK SUMMARY: 0 hazards"));
        assert!(text.ends_with("1 of 2 steps passed\n"));
    }

    /// libtest 1.95's lines (one thread, output captured): a failing test, raw writes
    /// before a result, a sanitizer's report between, a result never read, and a test
    /// stopped mid-run; and the `failures:` section, where a parity test quotes its child.
    #[test]
    fn libtest_lines_count_passes_failures_and_a_test_that_did_not_finish() {
        let log = "running 5 tests
test guards::cube::a ... ok
test guards::cube::b ... FAILED
test guards::cube::c ... raw out
ok
test guards::cube::d ... ========= Invalid __global__ read of size 4 bytes
=========     at kernel+0x90
ignored
test guards::cube::f ... raw, no newline ok
test guards::cube::g ... raw out
test guards::cube::e ... ";
        let tests = parse_libtest(log).unwrap();
        assert_eq!(tests.passed, 3);
        assert_eq!(tests.skipped, 1);
        assert_eq!(
            tests.failures,
            [
                "guards::cube::b: failed",
                "guards::cube::g: no result read",
                "guards::cube::e: did not finish"
            ]
        );
        assert_eq!(tests.counts(), "3 passed, 3 failed, 1 skipped");
        // A failed parity test quotes its child's lines; they are not this run's tests.
        let log = "running 2 tests
test t3_op_parity_plain ... FAILED
test t5_lstm_parity_small ... ok

failures:

---- t3_op_parity_plain stdout ----
child ours of t3_op_parity_plain failed or ran no test:

running 1 test
test t3_op_parity_plain ... FAILED

failures:
    t3_op_parity_plain

test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 9 filtered out
";
        let tests = parse_libtest(log).unwrap();
        assert_eq!(tests.failures, ["t3_op_parity_plain: failed"]);
        assert_eq!(tests.counts(), "1 passed, 1 failed");
        let finished = "running 1 test\ntest t2_random_and_sync_work ... ok\n\n\
                        test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 7 filtered out\n";
        assert_eq!(
            parse_libtest(finished).unwrap().counts(),
            "1 passed, 0 failed"
        );
        assert!(parse_libtest("could not start\n").is_err());
    }

    #[test]
    fn tables_and_sanitizer_lines_are_found_in_logs() {
        let log = "{\"bench\":\"speed\"}\n| b/t/h | stack | ms |\n|---|---|---|\n| 32/64/256 | fused | 1.9 |\n\ndone\n\
                   | b/t/h | stack | ms |\n|---|---|---|\n| 8/64/128 | fused | 0.8 |\n";
        assert_eq!(
            speed_rows(log),
            [
                "| b/t/h | stack | ms |",
                "|---|---|---|",
                "| 32/64/256 | fused | 1.9 |",
                "| 8/64/128 | fused | 0.8 |"
            ]
        );
        assert!(speed_rows("no table\n").is_empty());
        let log = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n";
        assert_eq!(
            sanitizer_summary(log).unwrap(),
            "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
        );
    }
}
