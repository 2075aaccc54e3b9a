//! The documentation's configurations are real: every ```json block in README.md and every `*.json`
//! file under envoy/ parses as a valid `tollgate_core::config::Config`; and the README's
//! configuration reference documents exactly the fields of the serde-derived document
//! (`tollgate_core::config::schema`), no more, no fewer.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};

use tollgate_core::config::{schema, Config};

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
    let path = repo_root().join("docs/reference/configuration.md");
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

/// The README's configuration reference: from its heading to the next `## ` heading.
fn reference() -> String {
    let path = repo_root().join("docs/reference/configuration.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The rows of the first `| field | …` table under the `### {heading}` heading of `reference`:
/// (the backticked names of the first cell, the whole row).
fn field_rows(reference: &str, heading: &str) -> Vec<(Vec<String>, String)> {
    let marker = format!("\n### {heading}\n");
    let start = reference
        .find(&marker)
        .unwrap_or_else(|| panic!("README.md: no `### {heading}` in the configuration reference"));
    let section = &reference[start + marker.len()..];
    let section = &section[..section.find("\n### ").unwrap_or(section.len())];
    let mut lines = section
        .lines()
        .skip_while(|l| !l.starts_with("| field |"))
        .skip(2);
    let mut rows = Vec::new();
    for line in lines.by_ref().take_while(|l| l.starts_with('|')) {
        let first = line.split(" | ").next().unwrap_or_default();
        let names = first
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        rows.push((names, line.to_string()));
    }
    assert!(
        !rows.is_empty(),
        "README.md: `### {heading}` has no field table"
    );
    rows
}

/// Where the reference documents each object of the document: its own field table, or (for the
/// small objects) the row of the field that holds it.
const TABLES: &[(&str, &str)] = &[
    ("top level", "Top level"),
    ("backend", "backend"),
    ("deny", "deny"),
    ("rules[]", "Rules"),
    ("match", "match"),
    ("overrides[]", "Overrides"),
];
const IN_A_ROW: &[(&str, &str, &str)] = &[
    ("match.headers[]", "match", "headers"),
    ("usage", "Rules", "usage"),
    ("fallback", "Rules", "fallback"),
];

#[test]
fn the_reference_documents_exactly_the_document_s_fields() {
    let reference = reference();
    let schema = schema();
    for (object, fields) in &schema {
        let mut fields: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        fields.sort();
        if let Some((_, heading)) = TABLES.iter().find(|(o, _)| o == object) {
            let mut documented: Vec<String> = field_rows(&reference, heading)
                .into_iter()
                .flat_map(|(names, _)| names)
                .collect();
            documented.sort();
            assert_eq!(
                documented, fields,
                "README.md `### {heading}` documents these fields, the document ({object}) has those"
            );
        } else if let Some((_, heading, holder)) = IN_A_ROW.iter().find(|(o, ..)| o == object) {
            let row = field_rows(&reference, heading)
                .into_iter()
                .find(|(names, _)| names == &[holder.to_string()])
                .map(|(_, row)| row)
                .unwrap_or_else(|| panic!("README.md `### {heading}` has no `{holder}` row"));
            for field in &fields {
                assert!(
                    row.contains(&format!("\"{field}\"")) || row.contains(&format!("`{field}`")),
                    "README.md `### {heading}`, row `{holder}`: {object} field `{field}` is not documented"
                );
            }
        } else {
            panic!("the document's {object} is documented nowhere in README.md (add it to TABLES)");
        }
    }
}

#[test]
fn field_rows_read_the_first_cell_s_names() {
    let md = "## Configuration reference\n\n### Things\n\ntext\n\n| field | type | default | allowed |\n\
              |---|---|---|---|\n| `a` | integer | `1` | `b` is not a field |\n\
              | `c`, `d` | integers | — | x |\n\nafter\n| `e` | no |\n";
    let rows = field_rows(md, "Things");
    let names: Vec<Vec<String>> = rows.into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        vec![
            vec!["a".to_string()],
            vec!["c".to_string(), "d".to_string()]
        ]
    );
}
