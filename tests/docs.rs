//! The documentation's configurations are real: every ```json block in README.md and every `*.json`
//! file under envoy/ parses as a valid `tollgate_core::config::Config`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};

use tollgate_core::config::Config;

/// How many ```json blocks README.md has; fewer means examples were lost (or their fence changed).
const README_JSON_BLOCKS: usize = 10;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Each ```json fenced block of `markdown` as (line number of the opening fence, text). Blocks of
/// other languages (```jsonc, ```text, ```yaml, ...) are not configurations and are skipped.
fn json_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    // The open fence: (its line number, its language, the text so far).
    let mut open: Option<(usize, String, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim();
        match open.take() {
            None => {
                if let Some(lang) = fence.strip_prefix("```") {
                    open = Some((i + 1, lang.trim().to_string(), String::new()));
                }
            }
            Some((start, lang, mut text)) => {
                if fence == "```" {
                    if lang == "json" {
                        blocks.push((start, text));
                    }
                } else {
                    text.push_str(line);
                    text.push('\n');
                    open = Some((start, lang, text));
                }
            }
        }
    }
    if let Some((start, lang, _)) = open {
        panic!("README.md: the ```{lang} block opened on line {start} is never closed");
    }
    blocks
}

/// Every `*.json` file under `dir`, recursively, sorted.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            out.extend(json_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "json") {
            out.push(path);
        }
    }
    out
}

#[test]
fn readme_json_blocks_are_valid_configurations() {
    let path = repo_root().join("README.md");
    let readme =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let blocks = json_blocks(&readme);
    assert!(
        blocks.len() >= README_JSON_BLOCKS,
        "README.md has {} ```json blocks, expected at least {README_JSON_BLOCKS}",
        blocks.len()
    );
    for (line, block) in &blocks {
        if let Err(e) = Config::try_from(block.as_bytes()) {
            panic!(
                "README.md line {line}: ```json block is not a valid configuration: {e}\n{block}"
            );
        }
    }
}

/// Every plugin configuration shipped under envoy/ parses (Webdis configurations are skipped).
#[test]
fn envoy_json_files_are_valid_configurations() {
    let files = json_files(&repo_root().join("envoy"));
    assert!(!files.is_empty(), "no *.json files under envoy/");
    for path in files {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        // Webdis configurations live beside the Envoy ones; everything else is a plugin config.
        let doc: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        if doc.get("redis_host").is_some() {
            continue;
        }
        if let Err(e) = Config::try_from(bytes.as_slice()) {
            panic!(
                "{} is not a valid configuration: {e}\n{}",
                path.display(),
                String::from_utf8_lossy(&bytes)
            );
        }
    }
}

#[test]
fn json_blocks_are_found_and_other_fences_skipped() {
    let md = "text\n```json\n{\"a\": 1}\n```\n```jsonc\n```json\n```\n  ```json\n[2]\n  ```\n";
    assert_eq!(
        json_blocks(md),
        vec![(2, "{\"a\": 1}\n".to_string()), (8, "[2]\n".to_string())]
    );
}
