//! `gpu bundle`: the outputs of several `gpu run` invocations of one device call in two
//! files. Invocations side by side need their own `--out` (each writes a summary, a logs'
//! tarball and a kernel cache), but the device brings back at most eight files a call.

use std::fs;
use std::path::{Path, PathBuf};

use super::{CACHE, io, run};

#[derive(clap::Args, Debug)]
pub struct BundleArgs {
    /// The folder whose subfolders are the invocations' `--out` folders (files beside
    /// them, such as each invocation's console log, go in too).
    pub dir: PathBuf,
    /// Where `summary.md` (every invocation's, one after another) and `bundle.tar.gz`
    /// (everything but the kernel caches) go (default $OUT).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn bundle(args: BundleArgs) -> Result<(), String> {
    let out = super::out_dir(args.out).ok_or("gpu bundle: no --out and no $OUT")?;
    let absolute = |p: &Path| std::path::absolute(p).map_err(io(p));
    if absolute(&out)?.starts_with(absolute(&args.dir)?) {
        return Err("gpu bundle: --out must lie outside the folder it bundles".into());
    }
    fs::create_dir_all(&out).map_err(io(&out))?;
    let text = summaries(&args.dir)?;
    println!("{text}");
    let summary = out.join("summary.md");
    fs::write(&summary, &text).map_err(io(&summary))?;
    run::tar_gz(&args.dir, &out.join("bundle.tar.gz"), |path| {
        path.file_name().is_none_or(|name| name != CACHE)
    })
}

/// Each subfolder's `summary.md` under a heading naming the folder, in name order.
fn summaries(dir: &Path) -> Result<String, String> {
    let mut folders: Vec<PathBuf> = (fs::read_dir(dir).map_err(io(dir))?)
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("summary.md").is_file())
        .collect();
    folders.sort();
    if folders.is_empty() {
        return Err(format!("gpu bundle: no summary.md under {}", dir.display()));
    }
    let mut text = String::new();
    for folder in folders {
        let name = folder.file_name().unwrap_or_default().to_string_lossy();
        let summary = folder.join("summary.md");
        let body = fs::read_to_string(&summary).map_err(io(&summary))?;
        text.push_str(&format!("# {name}\n\n{}\n\n", body.trim_end()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_every_summary_and_log_but_not_the_caches() {
        let root = std::env::temp_dir().join(format!("xtask-bundle-{}", std::process::id()));
        let (dir, out) = (root.join("runs"), root.join("out"));
        for (file, body) in [
            ("b-soak/summary.md", "| tests | ok |\n"),
            ("b-soak/logs-tests-1.tar.gz", "logs"),
            ("b-soak/cubecl-cache.tar.gz", "cache"),
            ("a-memcheck/summary.md", "| memcheck | ok |\n"),
            ("soak.log", "console"),
        ] {
            let path = dir.join(file);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, body).unwrap();
        }
        let args = BundleArgs {
            dir: dir.clone(),
            out: Some(out.clone()),
        };
        bundle(args).unwrap();
        let summary = fs::read_to_string(out.join("summary.md")).unwrap();
        let file = fs::File::open(out.join("bundle.tar.gz")).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
        let mut names: Vec<String> = (archive.entries().unwrap())
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        let empty = summaries(&root.join("none"));
        let _ = fs::remove_dir_all(&root);
        assert_eq!(
            summary,
            "# a-memcheck\n\n| memcheck | ok |\n\n# b-soak\n\n| tests | ok |\n\n"
        );
        assert_eq!(
            names,
            [
                "a-memcheck/summary.md",
                "b-soak/logs-tests-1.tar.gz",
                "b-soak/summary.md",
                "soak.log"
            ]
        );
        assert!(empty.is_err());
        let inside = BundleArgs {
            out: Some(dir.join("out")),
            dir,
        };
        assert!(bundle(inside).unwrap_err().contains("outside"));
    }
}
