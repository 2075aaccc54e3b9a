//! The documentation is true to the code, across every tracked Markdown file (`git ls-files`):
//! - every ```` ```json ```` block is a complete configuration that `Config::parse` loads for
//!   tollgate.wasm, and every ```` ```json higress ```` block one it loads for the Higress build;
//!   and there are at least [`MIN_JSON_BLOCKS`] of them, so examples cannot silently vanish;
//! - the configuration reference (docs/reference/configuration.md) has a field table for every
//!   object of the document, listing exactly its fields (`config::schema()`), no more, no fewer;
//! - every relative link and image resolves to a tracked file or directory, and every anchor to a
//!   heading of its target (`docs/links.rs`).
//!
//! And every plugin configuration shipped under envoy/ loads.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "docs/links.rs"]
mod links;
#[path = "docs/markdown.rs"]
mod markdown;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tollgate_core::config::{schema, Artifact, Config};

use links::Tree;
use markdown::Fence;

/// How many ```json and ```json higress blocks the tracked Markdown files hold together, at
/// least: fewer means examples were lost (or their fence changed). Raise it when you add some.
const MIN_JSON_BLOCKS: usize = 20;

/// The configuration reference.
const REFERENCE: &str = "docs/reference/configuration.md";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file git tracks (checked out or not), relative to the root.
fn tracked() -> BTreeSet<String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo_root())
        .output()
        .expect("run git ls-files (the docs checks need the repository's git metadata)");
    assert!(
        out.status.success(),
        "git ls-files failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8(p.to_vec()).expect("a tracked path that is not UTF-8"))
        .collect()
}

fn read(path: &str) -> String {
    let full = repo_root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

/// The tracked files, with the text of each tracked Markdown file.
fn tree() -> Tree {
    let files = tracked();
    let markdown = files
        .iter()
        .filter(|f| f.ends_with(".md"))
        .map(|f| (f.clone(), read(f)))
        .collect();
    Tree { files, markdown }
}

/// The artifact a fence's info string says its block is a configuration for: `json` is
/// tollgate.wasm's, `json higress` the Higress build's; any other `json …` is a mistake (a
/// fragment or another program's JSON is fenced `jsonc` or `text`). None: not a configuration.
fn artifact_of(info: &str) -> Option<Result<Artifact, String>> {
    let mut words = info.split_whitespace();
    if words.next() != Some("json") {
        return None;
    }
    Some(match (words.next(), words.next()) {
        (None, _) => Ok(Artifact::Envoy),
        (Some("higress"), None) => Ok(Artifact::Higress),
        _ => Err(format!(
            "```{info}: a configuration is fenced ```json or ```json higress; other JSON ```jsonc"
        )),
    })
}

/// The configurations of `md` (file `name`): (line, artifact, text), or what is wrong.
fn configurations(
    name: &str,
    md: &str,
    problems: &mut Vec<String>,
) -> Vec<(usize, Artifact, String)> {
    let fences = markdown::fences(md).unwrap_or_else(|e| {
        problems.push(format!("{name}: {e}"));
        Vec::new()
    });
    let mut out = Vec::new();
    for Fence { line, info, text } in fences {
        match artifact_of(&info) {
            None => {}
            Some(Ok(artifact)) => out.push((line, artifact, text)),
            Some(Err(e)) => problems.push(format!("{name}:{line}: {e}")),
        }
    }
    out
}

#[test]
fn every_json_block_of_the_docs_is_a_valid_configuration() {
    let tree = tree();
    let mut problems = Vec::new();
    let mut count = 0;
    let mut per_file = BTreeMap::new();
    for (name, md) in &tree.markdown {
        for (line, artifact, text) in configurations(name, md, &mut problems) {
            count += 1;
            *per_file.entry(name.clone()).or_insert(0) += 1;
            if let Err(e) = Config::parse(text.as_bytes(), artifact) {
                problems.push(format!(
                    "{name}:{line}: not a valid configuration for {artifact:?}: {e}\n{text}"
                ));
            }
        }
    }
    println!("```json blocks per file: {per_file:?}; {count} in all");
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(
        count >= MIN_JSON_BLOCKS,
        "the tracked Markdown files hold {count} ```json blocks, expected at least \
         {MIN_JSON_BLOCKS}: {per_file:?}"
    );
}

#[test]
fn fences_of_json_configurations_are_told_apart() {
    let md = "text\n```json\n{\"a\": 1}\n```\n```jsonc\n{}\n```\n  ```json higress\n[2]\n  ```\n\
              ````text\n```json\nnot a fence\n```\n````\n```json5\n```\n";
    let mut problems = Vec::new();
    let found = configurations("t.md", md, &mut problems);
    assert_eq!(
        found,
        vec![
            (2, Artifact::Envoy, "{\"a\": 1}\n".to_string()),
            (8, Artifact::Higress, "[2]\n".to_string()),
        ]
    );
    assert!(problems.is_empty(), "{problems:?}");

    let mut problems = Vec::new();
    configurations("t.md", "```json envoy\n{}\n```\n", &mut problems);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("t.md:1: ```json envoy"),
        "{problems:?}"
    );

    let mut problems = Vec::new();
    let found = configurations("t.md", "```json\n{}\n```\n```json\n{}\n", &mut problems);
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(
        problems,
        ["t.md: the ```json block opened on line 4 is never closed"]
    );
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

/// The columns every field table of the reference has, in this order after `Field`.
const COLUMNS: &[&str] = &["Field", "Type", "Required", "Default", "Bounds"];

/// The rows of the field table under the heading `heading` (any level) of `reference`: the table
/// whose header starts `| Field | Type | Required | Default | Bounds |`, before the next heading.
/// Each row as (the backticked names of its first cell, the whole row).
fn field_rows(reference: &str, heading: &str) -> Vec<(Vec<String>, String)> {
    let is_heading = |l: &str| l.starts_with('#');
    let mut lines = reference
        .lines()
        .skip_while(|l| !(is_heading(l) && l.trim_start_matches('#').trim() == heading));
    assert!(
        lines.next().is_some(),
        "{REFERENCE}: no heading `{heading}`"
    );
    let section: Vec<&str> = lines.take_while(|l| !is_heading(l)).collect();
    let header = section
        .iter()
        .position(|l| l.starts_with("| Field |"))
        .unwrap_or_else(|| panic!("{REFERENCE}: `{heading}` has no `| Field | …` table"));
    let columns: Vec<&str> = section[header]
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .collect();
    assert!(
        columns.starts_with(COLUMNS),
        "{REFERENCE}: `{heading}`'s table has the columns {columns:?}, expected {COLUMNS:?} first"
    );
    let mut rows = Vec::new();
    for line in section[header + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
    {
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
        "{REFERENCE}: `{heading}`'s table is empty"
    );
    rows
}

/// The heading in the reference under which each object of the document has its field table.
const TABLES: &[(&str, &str)] = &[
    ("top level", "Top level"),
    ("backend", "backend"),
    ("deny", "deny"),
    ("rules[]", "Rules"),
    ("match", "match"),
    ("match.headers[]", "match.headers"),
    ("usage", "Usage-based limits"),
    ("charge_on", "charge_on"),
    ("fallback", "fallback"),
    ("overrides[]", "Overrides"),
    ("tiers", "Tiers"),
    ("tiers.limits.*", "Tier limits"),
    ("penalty", "Penalty"),
];

#[test]
fn the_reference_documents_exactly_the_document_s_fields() {
    let reference = read(REFERENCE);
    let schema = schema();
    for (object, fields) in &schema {
        let mut fields: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        fields.sort();
        let (_, heading) = TABLES
            .iter()
            .find(|(o, _)| o == object)
            .unwrap_or_else(|| panic!("the document's {object} has no table (add it to TABLES)"));
        let mut documented: Vec<String> = field_rows(&reference, heading)
            .into_iter()
            .flat_map(|(names, _)| names)
            .collect();
        documented.sort();
        assert_eq!(
            documented, fields,
            "{REFERENCE} `{heading}` documents these fields, the document ({object}) has those"
        );
    }
    assert_eq!(
        TABLES.len(),
        schema.len(),
        "TABLES names an object the document does not have"
    );
}

#[test]
fn field_rows_read_the_first_cell_s_names() {
    let md = "# Reference\n\n## Things\n\ntext\n\n\
              | Field | Type | Required | Default | Bounds | Description |\n\
              |---|---|---|---|---|---|\n| `a` | integer | no | `1` | 1–5 | `b` is not a field |\n\
              | `c`, `d` | integers | yes | — | — | x |\n\nafter\n| `e` | no |\n## Next\n";
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

#[test]
#[should_panic(expected = "expected [\"Field\", \"Type\", \"Required\", \"Default\", \"Bounds\"]")]
fn field_rows_insist_on_the_reference_s_columns() {
    let md = "## Things\n| Field | Type | Default |\n|---|---|---|\n| `a` | integer | `1` |\n";
    field_rows(md, "Things");
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let tree = tree();
    let broken = tree.broken_links();
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn slugs_are_github_s() {
    assert_eq!(markdown::slug("Failure modes"), "failure-modes");
    assert_eq!(
        markdown::slug("Cost and `cost_header`"),
        "cost-and-cost_header"
    );
    assert_eq!(markdown::slug("match.headers"), "matchheaders");
    assert_eq!(
        markdown::slug("Sizing: exact vs lease"),
        "sizing-exact-vs-lease"
    );
    assert_eq!(markdown::slug("Why Webdis?"), "why-webdis");
    assert_eq!(markdown::slug("A [link](x.md) here"), "a-link-here");
    assert_eq!(markdown::slug("Bounds × 2 — now"), "bounds--2--now");
    let anchors =
        markdown::anchors("# A\n## A\n```\n# A\n```\n### A ##\n<a id=\"x\"></a>\n").unwrap();
    let want: BTreeSet<String> = ["a", "a-1", "a-2", "x"].map(String::from).into();
    assert_eq!(anchors, want);
}

/// The checker finds every kind of broken link in a small tree, and passes every good one.
#[test]
fn the_link_checker_fails_on_broken_links() {
    let md = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    };
    let markdown = md(&[
        (
            "README.md",
            "# Top\n\
             [ok](docs/a.md) [ok](docs/a.md#a-heading) [ok](#top) [ok](docs/) [ok](docs)\n\
             ![ok](docs/img/x.svg) [ok](https://example.com/nope.md) [ok](src/lib.rs#L3-L9)\n\
             `[not a link](nowhere.md)`\n\
             ```\n[not a link](nowhere.md)\n```\n\
             [bad file](docs/b.md) [bad anchor](docs/a.md#no-such) [bad self](#nope)\n\
             ![bad image](docs/img/y.svg) [bad dir anchor](docs#x) [bad rs anchor](src/lib.rs#top)\n\
             [ref]: docs/c.md\n",
        ),
        (
            "docs/a.md",
            "# A heading\n## Twice\n## Twice\n\
             [ok](../README.md#top) [ok](#twice-1) [ok](./a.md#twice) [ok](<a.md>)\n\
             [bad up](../../x.md) [bad dup](#twice-2) [ok](../docs/img/) [empty]()\n",
        ),
    ]);
    let files: BTreeSet<String> = ["README.md", "docs/a.md", "docs/img/x.svg", "src/lib.rs"]
        .map(String::from)
        .into();
    let broken = Tree { files, markdown }.broken_links();
    let targets: Vec<&str> = broken
        .iter()
        .map(|b| b.split_once(" (").unwrap().1.split_once("):").unwrap().0)
        .collect();
    assert_eq!(
        targets,
        vec![
            "docs/b.md",
            "docs/a.md#no-such",
            "#nope",
            "docs/img/y.svg",
            "docs#x",
            "src/lib.rs#top",
            "docs/c.md",
            "../../x.md",
            "#twice-2",
            "",
        ],
        "{broken:#?}"
    );
    assert!(
        broken[0].starts_with("README.md:8: (docs/b.md): no tracked file"),
        "{broken:#?}"
    );
}

/// The commands lua/token_bucket.lua calls (`redis.call('NAME'`), lower-cased.
fn script_commands() -> BTreeSet<String> {
    let script = read("lua/token_bucket.lua");
    script
        .split("redis.call('")
        .skip(1)
        .filter_map(|rest| rest.split('\'').next())
        .map(str::to_ascii_lowercase)
        .collect()
}

/// The commands an `ACL SETUSER` line grants (`+name`), lower-cased.
fn granted(line: &str) -> BTreeSet<String> {
    line.split_whitespace()
        .filter_map(|a| a.strip_prefix('+'))
        .map(|a| a.trim_end_matches('`').to_ascii_lowercase())
        .collect()
}

/// Redis applies the caller's ACL to every command a script calls: the user the docs create must
/// be granted each one, or the script fails partway (after it has written the bucket). The
/// operator's user of docs/cli.md runs the same script.
#[test]
fn the_documented_acl_user_may_run_every_command_the_script_calls() {
    let commands = script_commands();
    assert!(
        commands.contains("hmget") && commands.contains("pexpire"),
        "read the script's commands: {commands:?}"
    );
    for page in ["docs/deploy/redis.md", "docs/operations.md"] {
        let text = read(page);
        let line = text
            .lines()
            .find(|l| l.contains("ACL SETUSER") && l.contains("+evalsha"))
            .unwrap_or_else(|| panic!("{page}: no ACL SETUSER line with +evalsha"));
        let granted = granted(line);
        let missing: Vec<&String> = commands.difference(&granted).collect();
        assert!(missing.is_empty(), "{page}: the ACL line lacks {missing:?}");
    }
    for page in ["docs/operations.md", "docs/cli.md"] {
        let text = read(page);
        let named: Vec<&String> = commands
            .iter()
            .filter(|c| !text.contains(&format!("`{}`", c.to_ascii_uppercase())))
            .collect();
        assert!(
            named.is_empty(),
            "{page} names the script's commands; it lacks {named:?}"
        );
    }
}

/// The docs name the shared-data prefix `tollgate|v<N>|<key_prefix>` with the layout version the
/// filter uses (`SHARED_LAYOUT`), so an operator looks for keys that exist.
#[test]
fn the_docs_name_the_shared_data_layout_the_filter_uses() {
    let plugin = read("crates/core/src/engine/plugin.rs");
    let version = plugin
        .split("SHARED_LAYOUT: &str = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("crates/core/src/engine/plugin.rs defines SHARED_LAYOUT");
    let tree = tree();
    let mut wrong = Vec::new();
    for (path, text) in &tree.markdown {
        for rest in text.replace("\\|", "|").split("tollgate|").skip(1) {
            let named = rest.split('|').next().unwrap_or_default();
            if named.starts_with('v') && named != version {
                wrong.push(format!("{path}: tollgate|{named}|"));
            }
        }
    }
    assert!(wrong.is_empty(), "the layout is {version}: {wrong:?}");
}
