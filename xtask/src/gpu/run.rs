//! `gpu run` on the GPU machine (no Rust there): unpacks what `gpu pack` wrote, sets up
//! CUDA, NCCL and CubeCL's caches, runs the stages' steps with time limits, and leaves
//! in `$OUT` a summary, one tarball of logs and the cubecl cache for the next machine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::{self, File};
use std::io::{BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::binaries::{self, Kind, PACKAGES};
use super::stages::{self, Dir, Layout, Report, Stage, StageOptions, Step, path_arg};
use super::summary::{self, Outcome, StepResult};
use super::{CACHE, PAYLOAD, io};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The stages, one after another (see `xtask gpu list`).
    #[arg(value_enum, required = true)]
    pub stages: Vec<Stage>,
    /// Run the stages side by side instead (each stage's own steps still in order).
    #[arg(long)]
    pub side_by_side: bool,
    /// The folder `gpu pack` wrote (default: this executable's folder).
    #[arg(long)]
    pub pack: Option<PathBuf>,
    /// Scratch folder (unpacked binaries, caches, nextest workspaces), kept for later
    /// runs on the same machine.
    #[arg(long, default_value = "/tmp/gpu-run")]
    pub work: PathBuf,
    /// Where the summary, the logs' tarball and the cubecl cache go (default $OUT, else
    /// PACK/out).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seconds after the start past which no step runs (the device ends a command at
    /// 600 s; what is left is for the tarballs).
    #[arg(long, default_value_t = 570)]
    pub deadline: u64,
    /// Time limit of every step in seconds (default: each stage's).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Print the planned command lines and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// CubeCL prints each kernel choice it tunes (into the logs).
    #[arg(long)]
    pub autotune_log: bool,
    #[command(flatten)]
    pub opts: StageOptions,
}

/// Grace between SIGTERM and SIGKILL for a step past its limit.
const GRACE: Duration = Duration::from_secs(10);
/// Kept free before the deadline for the summary and the tarballs.
const RESERVE_S: u64 = 20;

pub fn run(args: RunArgs) -> Result<(), String> {
    let started = Instant::now();
    let pack = pack_dir(args.pack.clone());
    let repo = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let work = std::path::absolute(&args.work).map_err(io(&args.work))?;
    let unpacked = work.join("pack");
    if !args.dry_run {
        unpack(&pack, &unpacked)?;
    }
    let (packed, description) = read_manifest(&unpacked);
    let test_binaries = test_binaries(&unpacked).unwrap_or_default();
    let logs = next_free(&work.join("logs"), "run");
    let cache = work.join("cache");
    let env = if args.dry_run {
        Vec::new()
    } else {
        environment(&work, &cache)
    };
    let mut layout = Layout {
        repo: repo.clone(),
        work: work.clone(),
        logs: logs.clone(),
        // `two_gpus::` tests run where there are two.
        gpus: if args.dry_run { 1 } else { count_gpus(&env) },
        ignored_tests: if !args.dry_run && args.stages.iter().any(|s| s.reads_test_lists()) {
            ignored_tests(&test_binaries)
        } else {
            BTreeMap::new()
        },
        test_binaries,
    };
    if args.dry_run && layout.test_binaries.is_empty() {
        // Nothing unpacked yet: name each test binary by its id.
        for b in binaries::BINARIES.iter().filter(|b| b.kind == Kind::Test) {
            let path = layout.nextest_target().join(format!("<{}>", b.binary_id()));
            layout.test_binaries.insert(b.binary_id(), path);
        }
    }

    // Plan everything before anything runs: a bad option fails here, at no GPU time.
    let mut lanes: Vec<VecDeque<Vec<Step>>> = Vec::new();
    for stage in &args.stages {
        if !args.dry_run {
            let names = stage.binaries(&args.opts);
            if let Some(name) = names.iter().find(|n| !packed.iter().any(|b| b == *n)) {
                return Err(format!(
                    "stage {}: {}",
                    stage.name(),
                    stages::not_packed(name)
                ));
            }
        }
        let groups = stages::plan(*stage, &args.opts, &layout)?;
        match lanes.last_mut() {
            Some(lane) if !args.side_by_side => lane.extend(groups),
            _ => lanes.push(groups.into()),
        }
    }
    unique_labels(&mut lanes);
    if args.dry_run {
        for (i, lane) in lanes.iter().enumerate() {
            if lanes.len() > 1 {
                println!("# side by side, lane {}", i + 1);
            }
            for group in lane {
                let prefix = if group.len() > 1 { "& " } else { "" };
                for step in group {
                    println!("{prefix}{}", step.command_line());
                }
            }
        }
        return Ok(());
    }

    let out = super::out_dir(args.out.clone()).unwrap_or_else(|| pack.join("out"));
    fs::create_dir_all(&out).map_err(io(&out))?;
    fs::create_dir_all(&logs).map_err(io(&logs))?;
    restore_cache(&pack, &cache)?;
    let shared = layout.shared();
    fs::create_dir_all(&shared).map_err(io(&shared))?;
    write_cubecl_toml(&shared, &cache, args.autotune_log)?;

    let stage_names: Vec<String> = args.stages.iter().map(|s| s.name()).collect();
    let side_by_side = if args.side_by_side {
        " (side by side)"
    } else {
        ""
    };
    let mut header = vec![format!(
        "## xtask gpu run {}{side_by_side}",
        stage_names.join(" ")
    )];
    header.push(format!("packed: {description}"));
    header.extend(machine(&env));
    fs::write(logs.join("machine.txt"), header.join("\n") + "\n").map_err(|e| e.to_string())?;
    for line in &header {
        println!("{line}");
    }

    let exec = Exec {
        started,
        layout: &layout,
        env: &env,
        cache: &cache,
        deadline: started + Duration::from_secs(args.deadline),
        timeout: args.timeout,
        autotune_log: args.autotune_log,
    };
    let results = exec.lanes(lanes);

    let mut extra = Vec::new();
    let perf = [Stage::Speed, Stage::Ncu, Stage::Torch, Stage::Perf];
    if args.stages.iter().any(|s| perf.contains(s)) {
        extra.extend(speed_summary(&layout, &work, &out));
    }
    extra.extend(tables(&logs));
    let text = summary::markdown(&header, &results, &extra);
    println!("\n{text}");
    append(&out.join("summary.md"), &text)?;
    tar_gz(&cache, &out.join(CACHE), |_| true)?;
    let tarball = next_free(&out, &format!("logs-{}", stage_names.join("-")));
    let tarball = tarball.with_extension("tar.gz");
    // Without models and checkpoints (the device brings back small files).
    tar_gz(&logs, &tarball, |path| {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        !(name.ends_with(".mpk") || name == "checkpoint")
    })?;
    println!("logs: {}", tarball.display());
    let failed = results.iter().filter(|r| !r.outcome.passed()).count();
    if failed > 0 {
        return Err(format!("{failed} of {} steps failed", results.len()));
    }
    Ok(())
}

/// The folder holding the payload: `--pack`, else this executable's folder when the
/// payload lies beside it, else `.gpu`.
fn pack_dir(arg: Option<PathBuf>) -> PathBuf {
    if let Some(dir) = arg {
        return dir;
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        && dir.join(PAYLOAD).is_file()
    {
        return dir;
    }
    PathBuf::from(".gpu")
}

/// Unpacks the payload unless this very file was unpacked there already.
pub(super) fn unpack(pack: &Path, dest: &Path) -> Result<(), String> {
    let payload = pack.join(PAYLOAD);
    let meta = fs::metadata(&payload).map_err(|e| {
        format!(
            "{}: {e} (build it with `cargo run -q -p xtask -- gpu pack` and carry .gpu)",
            payload.display()
        )
    })?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let stamp = format!("{} {mtime}\n", meta.len());
    let stamp_file = dest.join(".stamp");
    if fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        return Ok(());
    }
    let t0 = Instant::now();
    if dest.exists() {
        fs::remove_dir_all(dest).map_err(io(dest))?;
    }
    fs::create_dir_all(dest).map_err(io(dest))?;
    let file = File::open(&payload).map_err(io(&payload))?;
    let xz = liblzma::bufread::XzDecoder::new_parallel(BufReader::with_capacity(1 << 20, file));
    let mut archive = tar::Archive::new(xz);
    archive.set_preserve_permissions(true);
    archive
        .unpack(dest)
        .map_err(|e| format!("unpacking {}: {e}", payload.display()))?;
    fs::write(&stamp_file, stamp).map_err(|e| e.to_string())?;
    println!(
        "unpacked {} in {:.1} s",
        payload.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What `gpu pack` recorded: the names of the binaries packed, and a line for the summary.
fn read_manifest(unpacked: &Path) -> (Vec<String>, String) {
    let json = fs::read_to_string(unpacked.join(super::MANIFEST)).ok();
    let Some(json) = json.and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok()) else {
        return (Vec::new(), "(no manifest)".into());
    };
    let binaries: Vec<String> = (json["binaries"].as_array().into_iter().flatten())
        .filter_map(|b| b.as_str().map(String::from))
        .collect();
    let text = |key: &str| json[key].as_str().unwrap_or("?").to_string();
    let description = format!(
        "commit {} at {}, {}; {}",
        text("commit"),
        text("packed"),
        text("nextest"),
        binaries.join(" ")
    );
    (binaries, description)
}

/// Nextest's binary ids and the unpacked test binaries, from the archive's
/// binaries-metadata.json (its paths name the build machine's target folder).
pub(super) fn test_binaries(unpacked: &Path) -> Result<BTreeMap<String, PathBuf>, String> {
    let target = unpacked.join("nextest/target");
    let path = target.join("nextest/binaries-metadata.json");
    let text = fs::read_to_string(&path).map_err(io(&path))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let built = json["rust-build-meta"]["target-directory"]
        .as_str()
        .ok_or("binaries-metadata.json names no target directory")?;
    let mut map = BTreeMap::new();
    if let Some(binaries) = json["rust-binaries"].as_object() {
        for (id, binary) in binaries {
            let Some(path) = binary["binary-path"].as_str() else {
                continue;
            };
            if let Ok(relative) = Path::new(path).strip_prefix(built) {
                map.insert(id.clone(), target.join(relative));
            }
        }
    }
    Ok(map)
}

/// Each test binary's `#[ignore]`d tests, from libtest's `--list` (it starts no GPU);
/// a binary that cannot list is left out.
fn ignored_tests(binaries: &BTreeMap<String, PathBuf>) -> BTreeMap<String, Vec<String>> {
    let list = |path: &PathBuf| {
        let output = Command::new(path)
            .args(["--list", "--ignored", "--format", "terse"])
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        Some(listed_tests(&String::from_utf8_lossy(&output.stdout)))
    };
    (binaries.iter())
        .filter_map(|(id, path)| Some((id.clone(), list(path)?)))
        .collect()
}

/// The test names of libtest's terse list (`NAME: test` lines; benches and the count
/// line are not tests).
fn listed_tests(list: &str) -> Vec<String> {
    (list.lines())
        .filter_map(|line| line.strip_suffix(": test"))
        .map(String::from)
        .collect()
}

fn count_gpus(env: &[(String, String)]) -> usize {
    Command::new("nvidia-smi")
        .arg("-L")
        .envs(env.iter().cloned())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU "))
                .count()
        })
        .unwrap_or(0)
}

/// `base-1`, `base-2`, ... : the first name not taken in `dir`.
fn next_free(dir: &Path, base: &str) -> PathBuf {
    (1..)
        .map(|i| dir.join(format!("{base}-{i}")))
        .find(|p| !p.exists() && !p.with_extension("tar.gz").exists())
        .expect("some name is free")
}

/// Labels name logs and folders: a stage run twice gets `-2` on its second labels, and
/// the folders named after a label (a nextest workspace, a fresh folder, an example's
/// `--out`) follow it, with the arguments and the JUnit path that name them.
fn unique_labels(lanes: &mut [VecDeque<Vec<Step>>]) {
    let mut seen = BTreeSet::new();
    for step in lanes.iter_mut().flatten().flatten() {
        let base = step.label.clone();
        let mut n = 1;
        while !seen.insert(step.label.clone()) {
            n += 1;
            step.label = format!("{base}-{n}");
        }
        if n == 1 {
            continue;
        }
        if !step.append {
            step.log = format!("{}.log", step.label);
        }
        match &mut step.dir {
            Dir::Nextest(ws) => {
                let old = follow(ws, &step.label, &mut step.args);
                if let Report::JUnit(junit) = &mut step.report
                    && let Ok(rest) = junit.strip_prefix(&old)
                {
                    *junit = ws.join(rest);
                }
            }
            Dir::Fresh { dir, .. } => {
                follow(dir, &step.label, &mut step.args);
            }
            Dir::Shared => {}
        }
        if let Report::Example(out) = &mut step.report {
            follow(out, &step.label, &mut step.args);
        }
    }
}

/// Renames the folder `path` to `label` in its parent, and the arguments that name it;
/// returns its old path.
fn follow(path: &mut PathBuf, label: &str, args: &mut [String]) -> PathBuf {
    let old = std::mem::replace(path, path.with_file_name(label));
    for arg in args.iter_mut().filter(|arg| Path::new(arg.as_str()) == old) {
        *arg = path_arg(path);
    }
    old
}

/// CubeCL finds `cubecl.toml` walking up from the working directory; no environment
/// variable sets its cache locations.
fn write_cubecl_toml(dir: &Path, cache: &Path, autotune_log: bool) -> Result<(), String> {
    let mut text = format!(
        "[autotune]\ncache = {{ file = \"{}\" }}\n",
        cache.join("autotune").display()
    );
    if autotune_log {
        text.push_str("logger = { stdout = true, level = \"minimal\" }\n");
    }
    text.push_str(&format!(
        "\n[compilation]\ncache = {{ file = \"{}\" }}\n",
        cache.join("ptx").display()
    ));
    fs::create_dir_all(cache).map_err(io(cache))?;
    fs::write(dir.join("cubecl.toml"), text).map_err(io(dir))
}

/// The environment of every step: CUDA's tools and libraries, NCCL as `libnccl.so`
/// (cudarc opens that name; PyTorch's wheel ships `libnccl.so.2` only), NVLink
/// multicast off, and this runtime's caches in the run's.
fn environment(work: &Path, cache: &Path) -> Vec<(String, String)> {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let cuda = std::env::var("CUDA_PATH").unwrap_or_else(|_| "/usr/local/cuda".into());
    let mut libraries = Vec::new();
    if let Some(nccl) = nccl_dir() {
        let link_dir = work.join("nccl-lib");
        let link = link_dir.join("libnccl.so");
        let _ = fs::create_dir_all(&link_dir);
        let _ = fs::remove_file(&link);
        if std::os::unix::fs::symlink(nccl.join("libnccl.so.2"), &link).is_ok() {
            libraries.push(link_dir.display().to_string());
        }
        libraries.push(nccl.display().to_string());
    }
    libraries.push(format!("{cuda}/lib64"));
    libraries.extend(Some(var("LD_LIBRARY_PATH")).filter(|v| !v.is_empty()));
    vec![
        ("CUDA_PATH".into(), cuda.clone()),
        ("PATH".into(), format!("{cuda}/bin:{}", var("PATH"))),
        ("LD_LIBRARY_PATH".into(), libraries.join(":")),
        ("NCCL_NVLS_ENABLE".into(), "0".into()),
    ]
    .into_iter()
    .chain(cache_env(cache))
    .collect()
}

/// This runtime's caches in `cache`, beside CubeCL's: its PTX, and the autotune results
/// parity tests' children keep (so each shape is tuned once).
fn cache_env(cache: &Path) -> [(String, String); 2] {
    [
        ("BURN_GRAPH_CAPTURE_KERNEL_CACHE", "ptx"),
        ("GPU_OURS_AUTOTUNE", "autotune"),
    ]
    .map(|(k, dir)| (k.into(), path_arg(&cache.join(dir))))
}

/// The folder of `libnccl.so.2`: PyTorch's nvidia-nccl wheel, else the linker cache.
fn nccl_dir() -> Option<PathBuf> {
    let python =
        "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))";
    let from_python = Command::new("python3")
        .args(["-c", python])
        .stderr(Stdio::null())
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|dir| dir.join("libnccl.so.2").is_file());
    from_python.or_else(|| {
        let out = Command::new("ldconfig").arg("-p").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text.lines().find(|l| l.contains("libnccl.so.2 "))?;
        let path = line.rsplit(" => ").next()?;
        Path::new(path.trim()).parent().map(Path::to_path_buf)
    })
}

/// The machine's lines of the summary: GPUs, driver, CUDA, date.
fn machine(env: &[(String, String)]) -> Vec<String> {
    let run = |program: &str, args: &[&str]| -> Option<String> {
        let out = Command::new(program)
            .args(args)
            .envs(env.iter().cloned())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let mut lines = Vec::new();
    let gpus = run(
        "nvidia-smi",
        &[
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ],
    );
    lines.push(format!(
        "GPUs: {}",
        gpus.unwrap_or_else(|| "none found".into())
            .replace('\n', "; ")
    ));
    if let Some(nvcc) = run("nvcc", &["--version"]) {
        lines.push(format!("nvcc: {}", nvcc.lines().last().unwrap_or_default()));
    }
    if let Some(date) = run("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"]) {
        lines.push(format!("date: {date}"));
    }
    lines
}

fn restore_cache(pack: &Path, cache: &Path) -> Result<(), String> {
    let tarball = pack.join(CACHE);
    let empty = fs::read_dir(cache).map_or(true, |mut d| d.next().is_none());
    if !empty || !tarball.is_file() {
        return Ok(());
    }
    let file = File::open(&tarball).map_err(io(&tarball))?;
    fs::create_dir_all(cache).map_err(|e| e.to_string())?;
    tar::Archive::new(flate2::read::GzDecoder::new(BufReader::new(file)))
        .unpack(cache)
        .map_err(io(&tarball))?;
    println!("cubecl cache restored from {}", tarball.display());
    Ok(())
}

/// `dir`'s files that `keep` accepts (by path inside `dir`) as a gzipped tarball.
pub(super) fn tar_gz(
    dir: &Path,
    tarball: &Path,
    keep: impl Fn(&Path) -> bool,
) -> Result<(), String> {
    let file = File::create(tarball).map_err(io(tarball))?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let entries = fs::read_dir(dir.join(&relative)).map_err(|e| e.to_string())?;
        for entry in entries.flatten() {
            let path = relative.join(entry.file_name());
            if !keep(&path) {
                continue;
            }
            let full = dir.join(&path);
            if full.is_dir() {
                stack.push(path);
            } else {
                tar.append_path_with_name(&full, &path).map_err(io(&full))?;
            }
        }
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .map_err(io(tarball))?;
    Ok(())
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(path))?;
    writeln!(file, "{text}").map_err(|e| e.to_string())
}

/// scripts/speed_summary.py over the latest speed, ncu and torch logs of this machine
/// (kept in WORK/results, so stages run by separate commands on one warm machine still
/// meet in one table).
fn speed_summary(layout: &Layout, work: &Path, out: &Path) -> Option<String> {
    let results = work.join("results");
    fs::create_dir_all(&results).ok()?;
    for name in ["speed.log", "ncu.log", "torch.log"] {
        let log = layout.logs.join(name);
        if log.is_file() {
            let _ = fs::copy(&log, results.join(name));
        }
    }
    let script = layout.repo.join("scripts/speed_summary.py");
    let output = Command::new("python3")
        .arg(&script)
        .args(["speed.log", "ncu.log", "torch.log"].map(|n| results.join(n)))
        .output()
        .ok()?;
    let mut table = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        table.push_str(&format!(
            "\nspeed_summary.py failed ({}): {last}\n",
            output.status
        ));
    }
    let _ = fs::write(out.join("speed-summary.md"), &table);
    Some(format!(
        "### speed summary (scripts/speed_summary.py)\n\n{table}"
    ))
}

/// The speed bench's tables and PyTorch's JSON lines, from this run's logs.
fn tables(logs: &Path) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut names: Vec<PathBuf> = fs::read_dir(logs)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    for path in names {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        if name.starts_with("speed") && name.ends_with(".log") {
            let rows = summary::speed_rows(&text);
            if !rows.is_empty() {
                blocks.push(format!("### {name}\n\n{}", rows.join("\n")));
            }
        } else if name.starts_with("ncu") && name.ends_with(".log") && !name.starts_with("ncu-run")
        {
            let lines: Vec<String> = text
                .lines()
                .map(|l| l.chars().take(200).collect())
                .collect();
            blocks.push(format!("### {name}\n\n{}", lines.join("\n")));
        } else if name == "torch.log" {
            let lines: Vec<&str> = text.lines().filter(|l| l.contains("\"ms\"")).collect();
            blocks.push(format!("### {name}\n\n{}", lines.join("\n")));
        }
    }
    blocks
}

struct Exec<'a> {
    started: Instant,
    layout: &'a Layout,
    env: &'a [(String, String)],
    cache: &'a Path,
    deadline: Instant,
    timeout: Option<u64>,
    autotune_log: bool,
}

struct Running {
    index: usize,
    lane: usize,
    step: Step,
    child: Child,
    started: Instant,
    limit: Duration,
    terminated: Option<Instant>,
}

impl Exec<'_> {
    /// Runs each lane's groups in order, the lanes side by side, every step of a group
    /// at once; the results in the order of the plan.
    fn lanes(&self, lanes: Vec<VecDeque<Vec<Step>>>) -> Vec<StepResult> {
        // Each step numbered in the plan's order: lane by lane, group by group.
        let mut count = 0;
        let mut number = |step| {
            count += 1;
            (count - 1, step)
        };
        let mut queues: Vec<VecDeque<Vec<(usize, Step)>>> = (lanes.into_iter())
            .map(|lane| {
                (lane.into_iter())
                    .map(|g| g.into_iter().map(&mut number).collect())
                    .collect()
            })
            .collect();
        let mut results: Vec<Option<StepResult>> = (0..count).map(|_| None).collect();
        let mut running: Vec<Running> = Vec::new();
        loop {
            for (lane, queue) in queues.iter_mut().enumerate() {
                if running.iter().any(|r| r.lane == lane) {
                    continue;
                }
                let Some(group) = queue.pop_front() else {
                    continue;
                };
                for (index, step) in group {
                    match self.start(&step) {
                        Ok((child, limit)) => running.push(Running {
                            index,
                            lane,
                            step,
                            child,
                            started: Instant::now(),
                            limit,
                            terminated: None,
                        }),
                        Err(outcome) => results[index] = Some(not_run(&step, outcome)),
                    }
                }
            }
            if running.is_empty() && queues.iter().all(VecDeque::is_empty) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            let mut i = 0;
            while i < running.len() {
                let r = &mut running[i];
                match r.child.try_wait() {
                    Ok(Some(status)) => {
                        let r = running.swap_remove(i);
                        let outcome = if r.terminated.is_some() {
                            Outcome::TimedOut(r.limit.as_secs())
                        } else if status.success() {
                            Outcome::Passed
                        } else {
                            Outcome::Failed(status.to_string())
                        };
                        let seconds = r.started.elapsed().as_secs_f64();
                        results[r.index] = Some(self.finish(&r.step, outcome, seconds));
                        continue;
                    }
                    Ok(None) => {
                        let over = r.started.elapsed() > r.limit;
                        match r.terminated {
                            None if over => {
                                signal_group(&r.child, libc::SIGTERM);
                                r.terminated = Some(Instant::now());
                            }
                            Some(at) if at.elapsed() > GRACE => {
                                signal_group(&r.child, libc::SIGKILL)
                            }
                            _ => {}
                        }
                    }
                    Err(e) => {
                        let r = running.swap_remove(i);
                        let outcome = Outcome::Failed(format!("wait: {e}"));
                        results[r.index] = Some(self.finish(&r.step, outcome, 0.0));
                        continue;
                    }
                }
                i += 1;
            }
        }
        results.into_iter().flatten().collect()
    }

    /// Prepares the step's folder and log and starts it in a process group of its own
    /// (so a time limit ends nextest's or the sanitizer's children too).
    fn start(&self, step: &Step) -> Result<(Child, Duration), Outcome> {
        let left = self
            .deadline
            .saturating_duration_since(Instant::now())
            .as_secs();
        if left < RESERVE_S + 10 {
            return Err(Outcome::NotRun("the run's deadline is near".into()));
        }
        let limit = self.timeout.unwrap_or(step.timeout_s).min(left - RESERVE_S);
        let mut env: Vec<(String, String)> = self.env.to_vec();
        let cwd = match &step.dir {
            Dir::Shared => self.layout.shared(),
            Dir::Nextest(ws) => {
                self.nextest_workspace(ws).map_err(Outcome::NotRun)?;
                ws.clone()
            }
            Dir::Fresh { dir, autotune_log } => {
                let _ = fs::remove_dir_all(dir);
                let cache = dir.join("cache");
                write_cubecl_toml(dir, &cache, *autotune_log || self.autotune_log)
                    .map_err(Outcome::NotRun)?;
                env.extend(cache_env(&cache));
                dir.clone()
            }
        };
        env.extend(step.env.iter().cloned());
        let log_path = self.layout.logs.join(&step.log);
        let mut log = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(step.append)
            .truncate(!step.append)
            .open(&log_path)
            .map_err(|e| Outcome::NotRun(format!("{}: {e}", log_path.display())))?;
        let line = step.command_line();
        let _ = writeln!(log, "==== {} (limit {limit} s): {line}", step.label);
        let err = log
            .try_clone()
            .map_err(|e| Outcome::NotRun(e.to_string()))?;
        println!("[{:>4} s] start {}: {line}", self.elapsed(), step.label);
        let child = Command::new(&step.program)
            .args(&step.args)
            .current_dir(&cwd)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| {
                Outcome::Failed(format!("could not start {}: {e}", step.program.display()))
            })?;
        Ok((child, Duration::from_secs(limit)))
    }

    /// A nextest workspace root of the step's own: the shared cubecl.toml, a Cargo.toml
    /// (nextest checks that one exists) and the packages' folders, where nextest runs
    /// their tests.
    fn nextest_workspace(&self, ws: &Path) -> Result<(), String> {
        let _ = fs::remove_dir_all(ws);
        for package in PACKAGES {
            fs::create_dir_all(ws.join(package.dir)).map_err(io(ws))?;
        }
        write_cubecl_toml(ws, self.cache, self.autotune_log)?;
        std::os::unix::fs::symlink(self.layout.repo.join("Cargo.toml"), ws.join("Cargo.toml"))
            .map_err(io(ws))
    }

    /// Reads what the step reports beside its exit status.
    fn finish(&self, step: &Step, outcome: Outcome, seconds: f64) -> StepResult {
        println!(
            "[{:>4} s] done  {}: {:?} in {seconds:.0} s",
            self.elapsed(),
            step.label,
            outcome
        );
        let mut result = StepResult::new(step, outcome, seconds);
        let logs = &self.layout.logs;
        match &step.report {
            Report::Exit => {}
            Report::JUnit(path) => {
                let _ = fs::copy(path, logs.join(format!("{}-junit.xml", step.label)));
                result.tests = Some(
                    fs::read_to_string(path)
                        .map_err(io(path))
                        .and_then(|xml| summary::parse_junit(&xml)),
                );
            }
            Report::Sanitizer | Report::SanitizedTests => {
                let log = fs::read_to_string(logs.join(&step.log)).unwrap_or_default();
                result.notes.extend(summary::sanitizer_summary(&log));
                if step.report == Report::SanitizedTests {
                    result.tests = Some(summary::parse_libtest(&log));
                }
            }
            Report::Ncu { csv, label, size } => {
                let script = self.layout.repo.join("scripts/ncu_sum.py");
                let out = Command::new("python3")
                    .arg(&script)
                    .arg(csv)
                    .args([label, size, &format!("{seconds:.0}")])
                    .output();
                match out {
                    Ok(out) => {
                        let text = String::from_utf8_lossy(&out.stdout).into_owned();
                        let _ = append(&logs.join("ncu.log"), text.trim_end());
                    }
                    Err(e) => result.notes.push(format!("ncu_sum.py: {e}")),
                }
            }
            Report::Example(dir) => {
                let json = fs::read_to_string(dir.join("summary.json"))
                    .ok()
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
                result
                    .notes
                    .push(json.map_or("no summary.json".into(), |j| j.to_string()));
            }
        }
        result
    }

    fn elapsed(&self) -> u64 {
        self.started.elapsed().as_secs()
    }
}

fn not_run(step: &Step, outcome: Outcome) -> StepResult {
    println!("        not run {}: {outcome:?}", step.label);
    StepResult::new(step, outcome, 0.0)
}

impl StepResult {
    fn new(step: &Step, outcome: Outcome, seconds: f64) -> StepResult {
        StepResult {
            stage: step.stage.name(),
            label: step.label.clone(),
            outcome,
            seconds,
            tests: None,
            notes: Vec::new(),
        }
    }
}

fn signal_group(child: &Child, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) with the negated id of the process group this child leads
    // (spawned with `process_group(0)`); it touches no memory.
    unsafe {
        libc::kill(-pid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dir: &Path) -> Layout {
        Layout {
            repo: dir.into(),
            work: dir.into(),
            logs: dir.join("logs"),
            gpus: 1,
            test_binaries: Default::default(),
            ignored_tests: Default::default(),
        }
    }

    /// `sh -c SCRIPT` as a step of its own.
    fn sh(label: &str, script: &str, timeout_s: u64) -> Step {
        Step {
            stage: Stage::Smoke,
            label: label.into(),
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("STEP".into(), label.into())],
            dir: Dir::Shared,
            timeout_s,
            log: format!("{label}.log"),
            append: false,
            report: Report::Exit,
        }
    }

    #[test]
    fn lanes_run_side_by_side_and_report_in_the_plans_order() {
        let dir = std::env::temp_dir().join(format!("xtask-gpu-lanes-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let layout = layout(&dir);
        fs::create_dir_all(&layout.logs).unwrap();
        fs::create_dir_all(layout.shared()).unwrap();
        let now = Instant::now();
        let exec = Exec {
            started: now,
            layout: &layout,
            env: &[("RUN".into(), "1".into())],
            cache: &dir.join("cache"),
            deadline: now + Duration::from_secs(100),
            timeout: None,
            autotune_log: false,
        };
        // Lane 1: two steps at once, then one past its limit (its group stopped with
        // it: SIGTERM reaches the sleep); lane 2 beside them.
        let lane1 = VecDeque::from([
            vec![sh("a", "exit 0", 60), sh("b", "exit 3", 60)],
            vec![sh("c", "sleep 30 & wait", 1)],
        ]);
        let lane2 = VecDeque::from([vec![sh("d", "echo $STEP $RUN", 60)]]);
        let results = exec.lanes(vec![lane1, lane2]);
        let labels: Vec<&str> = results.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["a", "b", "c", "d"]);
        let outcomes: Vec<&Outcome> = results.iter().map(|r| &r.outcome).collect();
        assert_eq!(
            outcomes,
            [
                &Outcome::Passed,
                &Outcome::Failed("exit status: 3".into()),
                &Outcome::TimedOut(1),
                &Outcome::Passed
            ]
        );
        assert!(results[2].seconds < 10.0, "stopped at its limit");
        let log = fs::read_to_string(layout.logs.join("d.log")).unwrap();
        assert!(
            log.starts_with("==== d (limit 60 s): STEP=d sh -c"),
            "{log}"
        );
        assert!(log.ends_with("d 1\n"), "{log}");

        // Too close to the deadline, nothing starts.
        let exec = Exec {
            deadline: Instant::now() + Duration::from_secs(RESERVE_S + 5),
            ..exec
        };
        let results = exec.lanes(vec![VecDeque::from([vec![sh("e", "exit 0", 60)]])]);
        assert!(matches!(&results[0].outcome, Outcome::NotRun(_)));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A stage run twice: its second steps get their own labels, logs, workspaces and
    /// JUnit files.
    #[test]
    fn a_stage_run_twice_gets_labels_of_its_own() {
        let layout = layout(Path::new("/w"));
        let opts = StageOptions::parse(&[]);
        let mut lanes = vec![VecDeque::new()];
        for _ in 0..2 {
            lanes[0].extend(stages::plan(Stage::Smoke, &opts, &layout).unwrap());
        }
        unique_labels(&mut lanes);
        let second = &lanes[0][1][0];
        assert_eq!(second.label, "smoke-2");
        assert_eq!(second.log, "smoke-2.log");
        assert_eq!(second.dir, Dir::Nextest("/w/nextest/smoke-2".into()));
        assert_eq!(
            second.report,
            Report::JUnit("/w/nextest/smoke-2/target/nextest/gpu/junit.xml".into())
        );
        assert!(second.args.contains(&"/w/nextest/smoke-2".to_string()));
        assert_eq!(lanes[0][0][0].label, "smoke");
    }

    /// libtest's terse list, as the trainer binary prints it: only `: test` lines are tests.
    #[test]
    fn listed_tests_are_the_names_of_test_lines() {
        let list = "correctness::cube::adam_replays_equal_eager: test\n\
                    two_gpus::rank_process: test\n\
                    speed: bench\n\n\
                    2 tests, 1 benchmark\n";
        assert_eq!(
            listed_tests(list),
            [
                "correctness::cube::adam_replays_equal_eager",
                "two_gpus::rank_process"
            ]
        );
    }

    /// Fresh folders and an example's `--out` follow a repeated stage's labels too.
    #[test]
    fn a_repeated_stage_gets_fresh_and_out_folders_of_its_own() {
        let mut layout = layout(Path::new("/w"));
        let trainer = binaries::find("gpu_trainer").unwrap().binary_id();
        layout
            .test_binaries
            .insert(trainer, "/w/t/gpu_trainer".into());
        let mut lanes = vec![VecDeque::new()];
        for stage in [Stage::Cold, Stage::Cold, Stage::Examples, Stage::Examples] {
            let opts = StageOptions::parse(&["--examples", "lstm"]);
            lanes[0].extend(stages::plan(stage, &opts, &layout).unwrap());
        }
        unique_labels(&mut lanes);
        let steps: Vec<&Step> = lanes[0].iter().flatten().collect();
        let mut folders = BTreeSet::new();
        for step in &steps {
            let folder = match (&step.dir, &step.report) {
                (Dir::Fresh { dir, .. }, _) | (_, Report::Example(dir)) => dir,
                _ => continue,
            };
            assert_eq!(folder.file_name().unwrap(), step.label.as_str());
            assert!(folders.insert(folder.clone()), "{} twice", folder.display());
        }
        let examples: Vec<&&Step> = steps
            .iter()
            .filter(|s| matches!(s.report, Report::Example(_)))
            .collect();
        assert_eq!(examples.len(), 2);
        let out = "/w/logs/examples/example-lstm-2".to_string();
        assert!(examples[1].args.contains(&out), "{:?}", examples[1].args);
    }
}
