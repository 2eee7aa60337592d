//! The one list of the binaries that `gpu pack` builds and `gpu run` runs.
//!
//! Test targets go into one nextest archive (built with the union of their features);
//! benches, binaries and examples are built apart, one `cargo build` per package and
//! feature set, so a bench is timed without the fault-injection hooks of the tests. An
//! entry with a `filter` is a group of modules inside a bigger test binary: its tests are
//! those whose names start with the filter.

/// A workspace package: its name and its directory under the workspace root (nextest
/// runs a package's tests in that directory under the workspace it is given).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Package {
    pub name: &'static str,
    pub dir: &'static str,
}

pub const LIBRARY: Package = Package {
    name: "burn-graph-capture",
    dir: "burn-graph-capture",
};
pub const INTEGRATION_TESTS: Package = Package {
    name: "integration-tests",
    dir: "tests",
};
pub const EXAMPLES: Package = Package {
    name: "lstm-example",
    dir: "examples",
};
/// Every package a packed binary comes from.
pub const PACKAGES: [Package; 3] = [LIBRARY, INTEGRATION_TESTS, EXAMPLES];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A libtest test target: archived by nextest and run through it.
    Test,
    /// A bench (`harness = false`): run directly.
    Bench,
    /// A `[[bin]]` target: run directly.
    Bin,
    /// An example target: run directly.
    Example,
}

impl Kind {
    /// Cargo's name of the kind (`--test`, ...; nextest's `package::bench/target`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Test => "test",
            Kind::Bench => "bench",
            Kind::Bin => "bin",
            Kind::Example => "example",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Binary {
    /// The name stages and `gpu pack --bins` use.
    pub name: &'static str,
    pub package: Package,
    pub kind: Kind,
    /// Cargo's target name (several entries may share one test target).
    pub target: &'static str,
    pub features: &'static [&'static str],
    /// For modules of a bigger test binary: the prefix of their test names.
    pub filter: Option<&'static str>,
}

const CUDA: &[&str] = &["cuda"];

/// A whole target, named as cargo names it.
const fn target(
    name: &'static str,
    package: Package,
    kind: Kind,
    features: &'static [&'static str],
) -> Binary {
    Binary {
        name,
        package,
        kind,
        target: name,
        features,
        filter: None,
    }
}

/// Modules of the CPU integration-test binary whose `gpu::` tests run here.
const fn module(name: &'static str, filter: &'static str) -> Binary {
    Binary {
        name,
        package: INTEGRATION_TESTS,
        kind: Kind::Test,
        target: "integration",
        features: CUDA,
        filter: Some(filter),
    }
}

pub const BINARIES: &[Binary] = &[
    // The runtime's own GPU suites (burn-graph-capture/tests/).
    target("gpu_runtime", LIBRARY, Kind::Test, CUDA),
    target("gpu_capture", LIBRARY, Kind::Test, CUDA),
    target("gpu_precision", LIBRARY, Kind::Test, CUDA),
    // GraphTrainer on the GPU, with the fault-injection hooks its `faults::` tests arm.
    target(
        "gpu_trainer",
        INTEGRATION_TESTS,
        Kind::Test,
        &["cuda", "fault-injection"],
    ),
    module("fuzz", "fuzz::"),
    module("threads", "threads::"),
    module("shared_embedding", "shared_embedding::"),
    // The speed bench (also the target of ncu and racecheck), and CubeCL's matmul
    // against cuBLAS.
    target(
        "gpu_graph_speed",
        INTEGRATION_TESTS,
        Kind::Bench,
        &["cuda", "host-profile"],
    ),
    target("gpu_matmul", INTEGRATION_TESTS, Kind::Bench, CUDA),
    // This runtime's eager step against stock burn-cuda's (issue 3).
    target("runtime_eager_bench", LIBRARY, Kind::Example, CUDA),
    // The examples.
    target("lstm", EXAMPLES, Kind::Bin, CUDA),
    target("lstm-learner", EXAMPLES, Kind::Bin, CUDA),
    target("charlm", EXAMPLES, Kind::Bin, CUDA),
];

/// What `gpu pack` packs when given no list: what smoke, tests, memcheck, racecheck,
/// perf, examples with `lstm`, fuzz and reliability run.
pub const DEFAULT_PACK: &[&str] = &[
    "gpu_runtime",
    "gpu_capture",
    "gpu_trainer",
    "fuzz",
    "threads",
    "shared_embedding",
    "gpu_graph_speed",
    "lstm",
];

pub fn find(name: &str) -> Result<&'static Binary, String> {
    BINARIES.iter().find(|b| b.name == name).ok_or_else(|| {
        let names: Vec<_> = BINARIES.iter().map(|b| b.name).collect();
        format!("no binary named {name} (known: {})", names.join(", "))
    })
}

impl Binary {
    /// Nextest's id of the target: `package::target` for a test target, else
    /// `package::kind/target`.
    pub fn binary_id(&self) -> String {
        match self.kind {
            Kind::Test => format!("{}::{}", self.package.name, self.target),
            kind => format!("{}::{}/{}", self.package.name, kind.name(), self.target),
        }
    }

    /// The nextest filterset that selects this entry's tests (module paths need no
    /// regex escapes).
    pub fn selector(&self) -> String {
        let binary = format!("binary_id({})", self.binary_id());
        match self.filter {
            Some(prefix) => format!("({binary} & test(/^{prefix}/))"),
            None => binary,
        }
    }

    /// Where `gpu pack` puts a non-test binary inside the payload.
    pub fn payload_path(&self) -> String {
        format!("bin/{}", self.target)
    }
}

/// The entries named, each once, in the table's order.
pub fn select(names: &[impl AsRef<str>]) -> Result<Vec<&'static Binary>, String> {
    for name in names {
        find(name.as_ref())?;
    }
    Ok(BINARIES
        .iter()
        .filter(|b| names.iter().any(|n| n.as_ref() == b.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_the_default_pack_is_in_the_table() {
        for (i, a) in BINARIES.iter().enumerate() {
            assert!(
                BINARIES[i + 1..].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
            assert!(PACKAGES.contains(&a.package), "{}'s package", a.name);
            assert!(a.filter.is_none() || a.kind == Kind::Test);
        }
        assert_eq!(select(DEFAULT_PACK).unwrap().len(), DEFAULT_PACK.len());
    }

    #[test]
    fn entries_sharing_a_target_agree_on_package_kind_and_features() {
        for a in BINARIES {
            for b in BINARIES.iter().filter(|b| b.target == a.target) {
                assert_eq!(
                    (a.package, a.kind, a.features),
                    (b.package, b.kind, b.features)
                );
                // Two entries of one target are told apart by their filters.
                assert!(a.name == b.name || (a.filter.is_some() && b.filter.is_some()));
            }
        }
    }

    #[test]
    fn selectors_name_the_binary_and_the_module_prefix() {
        assert_eq!(
            find("gpu_trainer").unwrap().selector(),
            "binary_id(integration-tests::gpu_trainer)"
        );
        assert_eq!(
            find("fuzz").unwrap().selector(),
            "(binary_id(integration-tests::integration) & test(/^fuzz::/))"
        );
        assert_eq!(
            find("gpu_graph_speed").unwrap().binary_id(),
            "integration-tests::bench/gpu_graph_speed"
        );
        assert!(find("nope").is_err());
    }
}
