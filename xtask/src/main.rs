//! Generates the forwarding table of `GraphCapture<B>` from burn-backend's op traits.
//!
//! Burn 0.21's backend traits have about 430 methods. Writing their forwarding by hand
//! would be error-prone and would silently miss default methods, which must be forwarded
//! too so that the inner backend's own kernels run. This tool parses the trait
//! definitions in the exact burn-backend source that Cargo resolved, and writes one
//! `forward_ops!` invocation per trait. The macro (in `backend/forward.rs`) turns each
//! line into a method that records the op and calls the inner backend.
//!
//! Usage: `cargo run -p xtask -- gen-forward` rewrites the table;
//! `cargo run -p xtask -- gen-forward --check` fails if it is stale.
//!
//! Its other tasks: `imports` checks that the library's modules import one way, and
//! `gpu` builds the GPU checks here and runs them on the GPU machine (`gpu/mod.rs`).

mod classify;
mod gpu;
mod imports;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use classify::{ArgKind, ReturnKind, classify_arg, classify_op, classify_return, rewrite_type};
use syn::{FnArg, Item, Pat, ReturnType, TraitItem};

/// The op traits that `Backend` requires, in the order they are emitted.
const TRAITS: [&str; 7] = [
    "FloatTensorOps",
    "IntTensorOps",
    "BoolTensorOps",
    "ModuleOps",
    "ActivationOps",
    "QTensorOps",
    "TransactionOps",
];

const OUTPUT: &str = "burn-graph-capture/src/backend/ops/generated.rs";

#[derive(clap::Parser)]
#[command(about = "Project tasks for burn-graph-capture")]
enum Task {
    /// Writes the decorator's forwarding table from burn-backend's op traits.
    GenForward {
        /// Fail if the table is stale instead of writing it.
        #[arg(long)]
        check: bool,
    },
    /// Checks that the library's files and folders import one way.
    Imports,
    /// GPU checks: `gpu pack` here, `gpu run STAGE...` on the GPU machine.
    #[command(subcommand)]
    Gpu(gpu::Command),
}

fn main() -> ExitCode {
    let task = <Task as clap::Parser>::parse();
    let result = match task {
        Task::GenForward { check } => run(check),
        Task::Imports => check_imports(),
        Task::Gpu(command) => gpu::main(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(check: bool) -> Result<(), String> {
    let root = workspace_root()?;
    let (version, ops_dir) = burn_backend_ops_dir(&root)?;
    let generated = generate(&version, &ops_dir)?;
    let output = root.join(OUTPUT);
    if check {
        let current = std::fs::read_to_string(&output).unwrap_or_default();
        if current != generated {
            return Err(format!(
                "{OUTPUT} is stale; run `cargo run -p xtask -- gen-forward`"
            ));
        }
        println!("{OUTPUT} is up to date");
    } else {
        std::fs::write(&output, generated).map_err(|e| format!("writing {OUTPUT}: {e}"))?;
        println!("wrote {OUTPUT}");
    }
    Ok(())
}

/// The library's modules import one way (`imports`'s rules).
fn check_imports() -> Result<(), String> {
    let src = workspace_root()?.join("burn-graph-capture/src");
    let edges = imports::check(&src).map_err(|cycles| format!("import cycles:\n{cycles}"))?;
    println!("no import cycles among the library's files and folders ({edges} edges)");
    Ok(())
}

pub(crate) fn workspace_root() -> Result<PathBuf, String> {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "xtask has no parent directory".to_string())
}

/// Finds the burn-backend sources that this workspace actually builds against.
fn burn_backend_ops_dir(root: &Path) -> Result<(String, PathBuf), String> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .exec()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    let package = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "burn-backend")
        .ok_or("burn-backend is not in the dependency graph")?;
    let manifest = package.manifest_path.as_std_path();
    let dir = manifest
        .parent()
        .ok_or("burn-backend manifest has no parent")?
        .join("src/backend/ops");
    Ok((package.version.to_string(), dir))
}

fn generate(version: &str, ops_dir: &Path) -> Result<String, String> {
    let mut traits: Vec<(String, Vec<String>)> = Vec::new();
    for file in rust_files(ops_dir)? {
        let source =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let parsed = syn::parse_file(&source).map_err(|e| format!("{}: {e}", file.display()))?;
        for item in parsed.items {
            let Item::Trait(item) = item else { continue };
            let name = item.ident.to_string();
            if TRAITS.contains(&name.as_str()) {
                let methods = item
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        TraitItem::Fn(f) => Some(method_line(&name, f)),
                        _ => None,
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                traits.push((name, methods));
            }
        }
    }
    traits.sort_by_key(|(name, _)| TRAITS.iter().position(|t| t == name));
    if traits.len() != TRAITS.len() {
        let found: Vec<_> = traits.iter().map(|(n, _)| n.as_str()).collect();
        return Err(format!("expected traits {TRAITS:?}, found {found:?}"));
    }

    let total: usize = traits.iter().map(|(_, m)| m.len()).sum();
    let mut out = format!(
        "// @generated by `cargo run -p xtask -- gen-forward` from burn-backend {version}.\n\
         // Do not edit: {total} methods, default methods included.\n\
         // Each line: [class] fn name(arg: Type as arg_kind, ..) -> Return as return_kind;\n\n\
         use super::prelude::*;\n"
    );
    for (name, methods) in traits {
        out.push_str(&format!("\nforward_ops! {{\n    {name};\n"));
        for method in methods {
            out.push_str("    ");
            out.push_str(&method);
            out.push('\n');
        }
        out.push_str("}\n");
    }
    Ok(out)
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// One table line for a trait method, or an error naming what the macro cannot forward.
fn method_line(trait_name: &str, method: &syn::TraitItemFn) -> Result<String, String> {
    let sig = &method.sig;
    let name = sig.ident.to_string();
    let context = format!("{trait_name}::{name}");
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(format!("{context}: generic methods are not supported"));
    }
    if sig.asyncness.is_some() {
        return Err(format!("{context}: async fn is not supported"));
    }
    let mut args = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(arg) = input else {
            return Err(format!(
                "{context}: methods with a receiver are not supported"
            ));
        };
        let Pat::Ident(ident) = arg.pat.as_ref() else {
            return Err(format!("{context}: argument patterns are not supported"));
        };
        let ty = rewrite_type(&arg.ty);
        let kind = classify_arg(&ty);
        if kind == ArgKind::Unsupported {
            return Err(format!(
                "{context}: argument `{}` has a backend-generic type that needs a Relabel impl",
                ident.ident
            ));
        }
        args.push(format!(
            "{}: {} as {}",
            ident.ident,
            type_text(&ty),
            kind.as_str()
        ));
    }
    let (ret, ret_kind) = match &sig.output {
        ReturnType::Default => ("()".to_string(), ReturnKind::Plain),
        ReturnType::Type(_, ty) => {
            let ty = rewrite_type(ty);
            (type_text(&ty), classify_return(&ty))
        }
    };
    if ret_kind == ReturnKind::Unsupported {
        return Err(format!(
            "{context}: return type has a backend-generic type that needs a Relabel impl"
        ));
    }
    Ok(format!(
        "[{}] fn {name}({}) -> {ret} as {};",
        classify_op(&name).table_text(&name),
        args.join(", "),
        ret_kind.as_str()
    ))
}

/// Prints a type the way rustfmt would, by unparsing it inside a type alias.
fn type_text(ty: &syn::Type) -> String {
    let file: syn::File = syn::parse_quote!(type T = #ty;);
    let text = prettyplease::unparse(&file);
    text.trim()
        .trim_start_matches("type T = ")
        .trim_end_matches(';')
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
