//! The README's quick start is the guide's (which the crate docs include and rustdoc
//! runs): the first Rust block of each, without rustdoc's hidden `# ` lines, must match.

fn first_rust_block(path: &str) -> Vec<String> {
    let text = std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let start = text
        .find("```rust\n")
        .unwrap_or_else(|| panic!("{path} has no Rust block"));
    let body = &text[start + "```rust\n".len()..];
    let end = body
        .find("```")
        .unwrap_or_else(|| panic!("{path}: unclosed block"));
    body[..end]
        .lines()
        .filter(|line| !line.trim_start().starts_with("# ") && line.trim() != "#")
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_quick_start_is_the_guides() {
    let _rng = crate::common::rng::shared();
    let readme = first_rust_block("README.md");
    let guide = first_rust_block("book/src/quickstart.md");
    assert!(readme.len() > 20, "the quick start is a whole program");
    assert_eq!(readme, guide);
}
