//! `gpu pack` on the build machine (Rust, no GPU): builds the table's binaries in
//! release (reusing the dependencies' release builds), archives the test targets with
//! `cargo nextest archive`, and writes into `.gpu/` what the GPU machine runs:
//!
//! - `gpu.tar.xz`: the nextest archive's files (`nextest/`), the other binaries
//!   (`bin/`), stripped, `cargo-nextest` and `manifest.json`, as one xz stream (x86
//!   filter, 256 MiB dictionary): the binaries share most of their code, so four of
//!   them (225 MB) take 20.9 MB so, 33.4 MB compressed one by one;
//! - `xtask`: this tool, which unpacks and runs them there.
//!
//! The device carries 64 MiB (working tree and carried folders): the pack fails past it.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use cargo_metadata::Message;

use super::binaries::{self, Binary, DEFAULT_PACK, Kind};
use super::stages::{Stage, StageOptions};
use super::{CACHE, MANIFEST, PAYLOAD, io};

#[derive(clap::Args, Debug)]
pub struct PackArgs {
    /// The binaries to pack (default: those `xtask gpu list` marks).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["stages", "all"])]
    pub bins: Vec<String>,
    /// Pack the binaries these stages run with their default options instead.
    #[arg(long, value_enum, value_delimiter = ',', conflicts_with = "all")]
    pub stages: Vec<Stage>,
    /// Pack every binary of the table (more than the device carries, today).
    #[arg(long)]
    pub all: bool,
    /// The folder to write (relative to the workspace root).
    #[arg(long, default_value = ".gpu")]
    pub dest: PathBuf,
    /// Print the commands and what would be written, and the size left for `.gpu/`.
    #[arg(long)]
    pub dry_run: bool,
    /// xz preset of the payload (0-9).
    #[arg(long, default_value_t = 6)]
    pub preset: u32,
    /// The cargo-nextest that archives the tests and travels (default: PATH's).
    #[arg(long)]
    pub nextest: Option<PathBuf>,
    /// The workspace to build (default: this repository).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
}

/// The device carries the working tree and the carried folders, this much in all.
pub const DEVICE_LIMIT: u64 = 64 << 20;
/// LZMA2 dictionary of the payload: the window in which a binary finds the code it
/// shares with the binaries before it.
const DICTIONARY: u32 = 256 << 20;

/// What the earlier bash packer wrote into `.gpu/`; a pack removes them.
const OBSOLETE: &str = "gpu-check.sh fuzz-trace.sh ncu_sum.py speed_summary.py torch_anchor.py \
    torch_ddp_anchor.py gpu_runtime.xz gpu_precision.xz gpu_capture.xz gpu_trainer.xz \
    gpu_graph_speed.xz gpu_matmul.xz runtime_eager_bench.xz gpu_conformance.xz stock_ddp.xz \
    lstm.xz lstm-learner.xz charlm.xz fuzz.xz threads.xz shared_embedding.xz";

/// A command of the pack, run in the workspace's root: a one-off build, where
/// incremental state only costs disk.
fn command(program: &Path, root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    (command.args(args).current_dir(root)).env("CARGO_INCREMENTAL", "0");
    command
}

/// The command line as printed.
fn line(command: &Command) -> String {
    let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
    let program = Path::new(command.get_program()).display();
    format!("CARGO_INCREMENTAL=0 {program} {}", args.join(" "))
}

/// The builds of a pack: one nextest archive of the test targets, one `cargo build`
/// per package and feature set of the rest, and xtask itself.
struct Builds {
    archive: Option<Command>,
    others: Vec<(Command, Vec<&'static Binary>)>,
    xtask: Command,
}

fn builds(
    selection: &[&'static Binary],
    root: &Path,
    cargo: &Path,
    nextest: &Path,
    archive_file: &Path,
) -> Builds {
    let tests: Vec<&Binary> = selection
        .iter()
        .copied()
        .filter(|b| b.kind == Kind::Test)
        .collect();
    let archive = (!tests.is_empty()).then(|| {
        let archive = ["nextest", "archive", "--cargo-profile", "release"];
        let mut cmd = command(nextest, root, &archive);
        let packages: BTreeSet<&str> = tests.iter().map(|b| b.package.name).collect();
        for package in packages {
            cmd.args(["-p", package]);
        }
        let mut targets: Vec<&str> = tests.iter().map(|b| b.target).collect();
        targets.dedup();
        for target in targets {
            cmd.args(["--test", target]);
        }
        // One build for every test target: cargo unifies the features anyway.
        let features: BTreeSet<&str> = tests
            .iter()
            .flat_map(|b| b.features.iter().copied())
            .collect();
        if !features.is_empty() {
            cmd.arg("--features")
                .arg(features.into_iter().collect::<Vec<_>>().join(","));
        }
        cmd.arg("--archive-file").arg(archive_file);
        // It is unpacked and packed again into the payload: compress it little.
        cmd.args(["--zstd-level", "1"]);
        cmd
    });
    let mut groups: Vec<(&str, &[&str], Vec<&'static Binary>)> = Vec::new();
    for binary in selection.iter().copied().filter(|b| b.kind != Kind::Test) {
        match groups
            .iter_mut()
            .find(|(p, f, _)| *p == binary.package.name && *f == binary.features)
        {
            Some((_, _, list)) => list.push(binary),
            None => groups.push((binary.package.name, binary.features, vec![binary])),
        }
    }
    let json = ["--message-format", "json-render-diagnostics"];
    let mut others = Vec::new();
    for (package, features, list) in groups {
        let mut cmd = command(cargo, root, &["build", "--release", "-p", package]);
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        for binary in &list {
            cmd.arg(format!("--{}", binary.kind.name()))
                .arg(binary.target);
        }
        cmd.args(json);
        others.push((cmd, list));
    }
    let mut xtask = command(cargo, root, &["build", "--release", "-p", "xtask"]);
    xtask.args(json);
    Builds {
        archive,
        others,
        xtask,
    }
}

pub fn pack(args: PackArgs) -> Result<(), String> {
    let root = match &args.workspace {
        Some(dir) => std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?,
        None => crate::workspace_root()?,
    };
    let names: Vec<String> = if args.all {
        binaries::BINARIES
            .iter()
            .map(|b| b.name.to_string())
            .collect()
    } else if !args.stages.is_empty() {
        let defaults = StageOptions::parse(&[]);
        args.stages
            .iter()
            .flat_map(|s| s.binaries(&defaults))
            .map(String::from)
            .collect()
    } else if !args.bins.is_empty() {
        args.bins.clone()
    } else {
        DEFAULT_PACK.iter().map(|s| s.to_string()).collect()
    };
    let selection = binaries::select(&names)?;
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let nextest = match (args.nextest.clone(), on_path("cargo-nextest")) {
        (Some(path), _) | (None, Some(path)) => path,
        // A dry run prints the commands still.
        (None, None) if args.dry_run => PathBuf::from("cargo-nextest"),
        (None, None) => return Err("cargo-nextest is not on PATH (or pass --nextest)".into()),
    };
    let dest = root.join(&args.dest);
    let scratch = root.join("target/gpu-pack");
    let archive_file = scratch.join("tests.tar.zst");
    let mut builds = builds(&selection, &root, &cargo, &nextest, &archive_file);
    let selected: Vec<&str> = selection.iter().map(|b| b.name).collect();
    println!("# packing {}", selected.join(" "));

    if args.dry_run {
        for cmd in builds
            .archive
            .iter()
            .chain(builds.others.iter().map(|(c, _)| c))
        {
            println!("{}", line(cmd));
        }
        println!("{}", line(&builds.xtask));
        let mut entries = Vec::new();
        if builds.archive.is_some() {
            entries.push(format!("nextest/<{}>", archive_file.display()));
        }
        for (_, list) in &builds.others {
            entries.extend(list.iter().map(|b| b.payload_path()));
        }
        entries.push(format!("cargo-nextest <{}>", nextest.display()));
        entries.push(MANIFEST.into());
        println!(
            "# {} (xz preset {}, x86 filter, {} dictionary): {}",
            dest.join(PAYLOAD).display(),
            args.preset,
            mib(DICTIONARY.into()),
            entries.join(", ")
        );
        println!("# {}", dest.join("xtask").display());
        let tree = tree_size(&root)?;
        println!(
            "# the working tree that travels: {}; {}/ may take {} of the device's {}",
            mib(tree),
            args.dest.display(),
            mib(DEVICE_LIMIT.saturating_sub(tree)),
            mib(DEVICE_LIMIT)
        );
        return Ok(());
    }

    let t0 = Instant::now();
    fs::create_dir_all(&scratch).map_err(io(&scratch))?;
    fs::create_dir_all(&dest).map_err(io(&dest))?;
    if let Some(cmd) = &mut builds.archive {
        let _ = fs::remove_file(&archive_file);
        run(cmd)?;
    }
    let mut built: Vec<Built> = Vec::new();
    for (cmd, list) in &mut builds.others {
        let executables = build(cmd)?;
        for binary in list.iter() {
            let path = executables
                .iter()
                .find(|(target, _)| target == binary.target)
                .map(|(_, p)| p.clone())
                .ok_or_else(|| format!("cargo built no executable for {}", binary.target))?;
            built.push(Built::new(path, &binary.payload_path(), binary.features));
        }
    }
    let xtask = build(&mut builds.xtask)?
        .into_iter()
        .find(|(target, _)| target == "xtask")
        .map(|(_, p)| p)
        .ok_or("cargo built no xtask executable")?;
    println!("built in {:.0} s", t0.elapsed().as_secs_f64());

    for name in OBSOLETE.split_whitespace() {
        if fs::remove_file(dest.join(name)).is_ok() {
            println!("removed {} (the bash packer's)", dest.join(name).display());
        }
    }
    let manifest = manifest(&root, &selected, &nextest);
    let t1 = Instant::now();
    let payload = dest.join(PAYLOAD);
    write_payload(
        &payload,
        builds.archive.is_some().then_some(archive_file.as_path()),
        &built,
        &nextest,
        &manifest,
        args.preset,
        DICTIONARY,
    )?;
    println!(
        "wrote {} in {:.0} s",
        payload.display(),
        t1.elapsed().as_secs_f64()
    );
    let xtask_dest = dest.join("xtask");
    let _ = fs::remove_file(&xtask_dest);
    let xtask = stripped(
        fs::read(&xtask).map_err(io(&xtask))?,
        &xtask_dest,
        Strip::All,
    )?;
    fs::write(&xtask_dest, xtask).map_err(io(&xtask_dest))?;
    let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    fs::set_permissions(&xtask_dest, executable).map_err(io(&xtask_dest))?;
    check_size(&root, &dest)
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    println!("$ {}", line(cmd));
    let status = cmd.status().map_err(io(Path::new(cmd.get_program())))?;
    (status.success())
        .then_some(())
        .ok_or_else(|| format!("{} failed: {status}", line(cmd)))
}

/// Runs a `cargo build --message-format json...` and returns each built executable's
/// target name and path.
fn build(cmd: &mut Command) -> Result<Vec<(String, PathBuf)>, String> {
    println!("$ {}", line(cmd));
    let mut child =
        (cmd.stdout(Stdio::piped()).spawn()).map_err(io(Path::new(cmd.get_program())))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut executables = Vec::new();
    for message in Message::parse_stream(BufReader::new(stdout)) {
        if let Ok(Message::CompilerArtifact(artifact)) = message
            && let Some(path) = artifact.executable
        {
            executables.push((artifact.target.name.to_string(), path.into_std_path_buf()));
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("{} failed: {status}", line(cmd)));
    }
    Ok(executables)
}

/// What was packed, from which commit, when, with which nextest.
fn manifest(root: &Path, binaries: &[&str], nextest: &Path) -> String {
    let output = |program: &Path, args: &[&str]| {
        Command::new(program)
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let git = Path::new("git");
    let mut commit = output(git, &["rev-parse", "--short=12", "HEAD"]);
    if !output(git, &["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        commit.push_str(" with uncommitted changes");
    }
    let version = output(nextest, &["nextest", "--version"]);
    serde_json::json!({
        "commit": commit,
        "packed": output(Path::new("date"), &["-u", "+%Y-%m-%d %H:%M:%S UTC"]),
        "nextest": version.lines().next().unwrap_or_default(),
        "profile": "release, stripped",
        "binaries": binaries,
    })
    .to_string()
}

pub(super) fn write_payload(
    payload: &Path,
    archive: Option<&Path>,
    built: &[Built],
    nextest: &Path,
    manifest: &str,
    preset: u32,
    dictionary: u32,
) -> Result<(), String> {
    // The archive's binaries compress about 3.5x at its level: enough to split the
    // work evenly over the threads, each of which compresses one block.
    let mut estimate: u64 = archive
        .and_then(|a| fs::metadata(a).ok())
        .map_or(0, |m| m.len() * 7 / 2);
    for Built { path, .. } in built {
        estimate += fs::metadata(path).map_err(io(path))?.len();
    }
    estimate += fs::metadata(nextest).map_err(io(nextest))?.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let block = (estimate / threads + 1).max(u64::from(dictionary));
    let mut options =
        liblzma::stream::LzmaOptions::new_preset(preset).map_err(|e| e.to_string())?;
    options.dict_size(dictionary);
    let mut filters = liblzma::stream::Filters::new();
    filters.x86().lzma2(&options);
    let stream = liblzma::stream::MtStreamBuilder::new()
        .threads(threads as u32)
        .block_size(block)
        .filters(filters)
        .check(liblzma::stream::Check::Crc64)
        .encoder()
        .map_err(|e| format!("xz encoder: {e}"))?;
    let partial = payload.with_extension("xz.part");
    let file = File::create(&partial).map_err(io(&partial))?;
    let xz = liblzma::write::XzEncoder::new_stream(BufWriter::with_capacity(1 << 20, file), stream);
    let mut tar = tar::Builder::new(xz);
    if let Some(archive) = archive {
        let file = File::open(archive).map_err(io(archive))?;
        let zstd = ruzstd::decoding::StreamingDecoder::new(BufReader::new(file))
            .map_err(|e| format!("{}: {e}", archive.display()))?;
        let mut nextest_archive = tar::Archive::new(zstd);
        for entry in nextest_archive.entries().map_err(io(archive))? {
            let mut entry = entry.map_err(io(archive))?;
            let path = entry.path().map_err(io(archive))?.into_owned();
            // The standard library nextest adds in case a test links it dynamically;
            // these link it statically.
            let kind = entry.header().entry_type();
            if path.starts_with("target/nextest/libdirs")
                || !(kind.is_file() || kind.is_gnu_sparse())
            {
                continue;
            }
            // A fresh header of the expanded file: the archive stores binaries with
            // holes as GNU sparse entries, whose reader yields the whole file.
            let mut data = Vec::new();
            entry.read_to_end(&mut data).map_err(io(&path))?;
            let data = stripped(data, payload, Strip::All)?;
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(entry.header().mode().map_err(io(&path))?);
            header.set_mtime(entry.header().mtime().map_err(io(&path))?);
            header.set_entry_type(tar::EntryType::Regular);
            let path = Path::new("nextest").join(path);
            tar.append_data(&mut header, &path, &data[..])
                .map_err(io(&path))?;
        }
    }
    for Built { path, name, strip } in built {
        let data = stripped(fs::read(path).map_err(io(path))?, payload, *strip)?;
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o755);
        tar.append_data(&mut header, name, &data[..])
            .map_err(io(path))?;
    }
    tar.append_path_with_name(nextest, "cargo-nextest")
        .map_err(io(nextest))?;
    let mut header = tar::Header::new_gnu();
    header.set_size(manifest.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, MANIFEST, manifest.as_bytes())
        .map_err(io(payload))?;
    let mut writer = tar
        .into_inner()
        .and_then(|xz| xz.finish())
        .map_err(io(&partial))?;
    std::io::Write::flush(&mut writer).map_err(io(&partial))?;
    drop(writer);
    fs::rename(&partial, payload).map_err(io(payload))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Bytes the device tool carries of the working tree: tracked files and untracked ones
/// git does not ignore.
fn tree_size(root: &Path) -> Result<u64, String> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("git ls-files: {e}"))?;
    if !out.status.success() {
        return Err("git ls-files failed".into());
    }
    let mut total = 0;
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name);
        if let Ok(meta) = fs::symlink_metadata(root.join(name.as_ref())) {
            total += meta.len();
        }
    }
    Ok(total)
}

/// The files of `dir`, recursively, with their sizes.
fn files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => stack.push(path),
                Ok(meta) => found.push((path, meta.len())),
                Err(_) => {}
            }
        }
    }
    found.sort();
    found
}

/// Prints what travels and fails when it exceeds the device's limit.
fn check_size(root: &Path, dest: &Path) -> Result<(), String> {
    let tree = tree_size(root)?;
    let files = files(dest);
    let carried: u64 = files.iter().map(|(_, size)| size).sum();
    println!("\n| what travels | size |\n|---|---|");
    for (path, size) in &files {
        let name = path.strip_prefix(root).unwrap_or(path);
        let note = match path.file_name().and_then(|n| n.to_str()) {
            Some(PAYLOAD | "xtask" | CACHE) => "",
            _ => " (not written by the pack)",
        };
        println!("| {}{note} | {} |", name.display(), mib(*size));
    }
    println!(
        "| the working tree (tracked and unignored files) | {} |",
        mib(tree)
    );
    let total = tree + carried;
    println!(
        "| total, with carry [\"{}\"] | {} of {} |",
        dest.strip_prefix(root).unwrap_or(dest).display(),
        mib(total),
        mib(DEVICE_LIMIT)
    );
    check_limit(total)
}

fn check_limit(total: u64) -> Result<(), String> {
    if total > DEVICE_LIMIT {
        return Err(format!(
            "{} is more than the device carries ({}): pack fewer binaries (--bins) or remove \
             other files from the folder",
            mib(total),
            mib(DEVICE_LIMIT)
        ));
    }
    Ok(())
}

/// A binary built for the pack, and where it goes in it.
pub(super) struct Built {
    path: PathBuf,
    name: String,
    strip: Strip,
}

impl Built {
    pub(super) fn new(path: PathBuf, name: &str, features: &[&str]) -> Self {
        Self {
            path,
            name: name.to_owned(),
            strip: Strip::for_features(features),
        }
    }
}

/// What `strip` takes out of a packed binary.
#[derive(Clone, Copy)]
enum Strip {
    /// Symbols and debug info: release binaries of this workspace are about half
    /// symbols.
    All,
    /// Debug info only: a binary that samples its own host time (`host-profile`) needs
    /// its symbol table to name the functions in its profiles.
    DebugInfo,
}

impl Strip {
    fn for_features(features: &[&str]) -> Self {
        if features.contains(&"host-profile") {
            Strip::DebugInfo
        } else {
            Strip::All
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Strip::All => "--strip-all",
            Strip::DebugInfo => "--strip-debug",
        }
    }
}

/// An ELF executable stripped as `strip` says (binutils). Anything else, or a machine
/// without `strip`, keeps its bytes.
/// `beside` names where the temporary copy goes (its name plus `.strip`).
fn stripped(data: Vec<u8>, beside: &Path, strip: Strip) -> Result<Vec<u8>, String> {
    if !data.starts_with(b"\x7fELF") {
        return Ok(data);
    }
    let mut file = beside.as_os_str().to_owned();
    file.push(".strip");
    let file = PathBuf::from(file);
    fs::write(&file, &data).map_err(io(&file))?;
    let status = Command::new("strip")
        .arg(strip.flag())
        .arg(&file)
        .stderr(Stdio::null())
        .status();
    let out = match status {
        Ok(status) if status.success() => fs::read(&file).map_err(io(&file))?,
        _ => {
            eprintln!("strip failed or is missing: packing a binary with its symbols");
            data
        }
    };
    let _ = fs::remove_file(&file);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(names: &[&str]) -> Vec<String> {
        let selection = binaries::select(names).unwrap();
        let b = builds(
            &selection,
            Path::new("/w"),
            Path::new("cargo"),
            Path::new("/bin/cargo-nextest"),
            Path::new("/t/tests.tar.zst"),
        );
        b.archive
            .iter()
            .chain(b.others.iter().map(|(c, _)| c))
            .chain([&b.xtask])
            .map(line)
            .collect()
    }

    #[test]
    fn tests_share_one_archive_and_benches_build_without_the_test_features() {
        let lines = lines(DEFAULT_PACK);
        assert_eq!(
            lines,
            [
                "CARGO_INCREMENTAL=0 /bin/cargo-nextest nextest archive --cargo-profile release \
                 -p burn-graph-capture -p integration-tests --test gpu_runtime --test gpu_capture \
                 --test gpu_trainer --test integration --features cuda,fault-injection \
                 --archive-file /t/tests.tar.zst --zstd-level 1",
                "CARGO_INCREMENTAL=0 cargo build --release -p integration-tests --features \
                 cuda,host-profile --bench gpu_graph_speed --message-format json-render-diagnostics",
                "CARGO_INCREMENTAL=0 cargo build --release -p lstm-example --features cuda \
                 --bin lstm --message-format json-render-diagnostics",
                "CARGO_INCREMENTAL=0 cargo build --release -p xtask \
                 --message-format json-render-diagnostics",
            ]
        );
    }

    #[test]
    fn a_pack_without_tests_archives_nothing() {
        let lines = lines(&["charlm", "lstm"]);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("-p lstm-example --features cuda --bin lstm --bin charlm"));
    }

    #[test]
    fn the_limit_is_the_devices() {
        assert!(check_limit(DEVICE_LIMIT).is_ok());
        assert!(check_limit(DEVICE_LIMIT + 1).is_err());
    }
}
