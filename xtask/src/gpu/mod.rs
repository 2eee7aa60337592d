//! `xtask gpu`: the GPU checks, built here and run on the GPU machine (which has CUDA,
//! compute-sanitizer, ncu and Python, but no Rust).
//!
//! - `cargo run -q -p xtask -- gpu pack` (here): builds the binaries of
//!   [`binaries::BINARIES`] and writes `.gpu/gpu.tar.xz` and `.gpu/xtask`;
//! - `.gpu/xtask gpu run STAGE...` (there, in the repository's root, with `.gpu`
//!   carried): unpacks them and runs the stages of [`stages::Stage`];
//! - `.gpu/xtask gpu bundle DIR` (there, last in a call): the outputs of several runs
//!   side by side as one summary and one tarball;
//! - `xtask gpu list`: the stages and the binaries.

mod binaries;
mod bundle;
mod pack;
mod run;
mod stages;
mod summary;

use std::path::{Path, PathBuf};

use clap::ValueEnum as _;

/// The packed binaries, in `.gpu/`.
const PAYLOAD: &str = "gpu.tar.xz";
/// CubeCL's autotune and PTX caches and this runtime's PTX cache, saved by each run into
/// `$OUT` and restored from `.gpu/` (copy it there to start the next machine warm).
const CACHE: &str = "cubecl-cache.tar.gz";
/// What was packed, inside the payload.
const MANIFEST: &str = "manifest.json";

/// Where a command on the GPU machine writes what comes back: `--out`, else the device's
/// `$OUT`.
fn out_dir(arg: Option<PathBuf>) -> Option<PathBuf> {
    arg.or_else(|| std::env::var_os("OUT").map(PathBuf::from))
}

/// Names the file an I/O error concerns.
fn io(what: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: {e}", what.display())
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Build the GPU binaries (release, stripped) and pack them into .gpu/.
    Pack(pack::PackArgs),
    /// On the GPU machine: run stages of the packed binaries.
    Run(Box<run::RunArgs>),
    /// The stages and the binaries.
    List,
    /// On the GPU machine, last in a call: several runs' outputs as one summary and one
    /// tarball (the device brings back eight files).
    Bundle(bundle::BundleArgs),
}

pub fn main(command: Command) -> Result<(), String> {
    match command {
        Command::Pack(args) => pack::pack(args),
        Command::Run(args) => run::run(*args),
        Command::Bundle(args) => bundle::bundle(args),
        Command::List => {
            list();
            Ok(())
        }
    }
}

fn list() {
    println!("stages (xtask gpu run STAGE...):");
    for stage in stages::Stage::value_variants() {
        let help = stage
            .to_possible_value()
            .and_then(|v| v.get_help().map(ToString::to_string))
            .unwrap_or_default();
        println!("  {:<12} {help}", stage.name());
    }
    println!("\nbinaries (xtask gpu pack --bins NAME,...; * packed by default):");
    println!(
        "  {:<18} {:<20} {:<8} {:<16} {:<24} filter",
        "name", "package", "kind", "target", "features"
    );
    for b in binaries::BINARIES {
        let default = if binaries::DEFAULT_PACK.contains(&b.name) {
            "*"
        } else {
            " "
        };
        println!(
            "{default} {:<20} {:<20} {:<8} {:<20} {:<22} {}",
            b.name,
            b.package.name,
            b.kind.name(),
            b.target,
            b.features.join(","),
            b.filter.unwrap_or("")
        );
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;

    /// A payload written by `pack` unpacks as `run` expects: the nextest archive's files
    /// under `nextest/` (test binaries found through its metadata), the other binaries
    /// under `bin/`, executable.
    #[test]
    fn a_payload_unpacks_where_run_looks() {
        let dir = std::env::temp_dir().join(format!("xtask-gpu-payload-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // A nextest archive as `cargo nextest archive` lays it out (.tar.zst).
        let metadata = r#"{"rust-build-meta": {"target-directory": "/build/target"},
            "rust-binaries": {"integration-tests::gpu_trainer": {
                "binary-path": "/build/target/gpu/deps/gpu_trainer-0123"}}}"#;
        let mut archive = tar::Builder::new(Vec::new());
        for (path, body, mode) in [
            ("target/nextest/binaries-metadata.json", metadata, 0o644),
            ("target/gpu/deps/gpu_trainer-0123", "#!/bin/sh\n", 0o755),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(mode);
            header.set_cksum();
            archive
                .append_data(&mut header, path, body.as_bytes())
                .unwrap();
        }
        let tar = archive.into_inner().unwrap();
        let zst = ruzstd::encoding::compress_to_vec(
            &tar[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let archive_file = dir.join("tests.tar.zst");
        fs::write(&archive_file, zst).unwrap();
        let bench = dir.join("gpu_graph_speed");
        fs::write(&bench, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&bench, fs::Permissions::from_mode(0o755)).unwrap();
        let nextest = dir.join("cargo-nextest");
        fs::write(&nextest, "nextest").unwrap();

        let pack = dir.join("pack");
        fs::create_dir_all(&pack).unwrap();
        let built = vec![super::pack::Built::new(bench, "bin/gpu_graph_speed", &[])];
        super::pack::write_payload(
            &pack.join(super::PAYLOAD),
            Some(&archive_file),
            &built,
            &nextest,
            r#"{"binaries": ["gpu_trainer", "gpu_graph_speed"]}"#,
            0,
            1 << 20,
        )
        .unwrap();

        let unpacked = dir.join("work/pack");
        super::run::unpack(&pack, &unpacked).unwrap();
        let tests = super::run::test_binaries(&unpacked).unwrap();
        let trainer = &tests["integration-tests::gpu_trainer"];
        assert_eq!(
            trainer,
            &unpacked.join("nextest/target/gpu/deps/gpu_trainer-0123")
        );
        assert!(trainer.is_file());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&unpacked.join("bin/gpu_graph_speed")) & 0o111, 0o111);
        assert!(unpacked.join("cargo-nextest").is_file());
        assert!(unpacked.join(super::MANIFEST).is_file());
        // Unpacked once: a second run finds the stamp.
        assert!(super::run::unpack(&pack, &unpacked).is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }
}
