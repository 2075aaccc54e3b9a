//! The link checker: every relative link of a tree of Markdown files resolves.
//!
//! Invariant: a relative link (`[..](path)`, `[..](path#anchor)`, `[..](#anchor)`, an image, a
//! reference definition) is accepted only if its path, taken from the linking file's directory,
//! is a file of the tree or a directory holding one, and its anchor (if any) is an anchor of the
//! target Markdown file ([`markdown::anchors`]) or a GitHub line anchor (`#L12`, `#L12-L20`) of
//! another file. Links with a scheme (`https:`, `mailto:`) are not fetched. The tree is given, not
//! read from disk, so the checker is tested on a tree in memory.

use std::collections::{BTreeMap, BTreeSet};

use super::markdown;

/// A tree: each tracked file's path (relative to the root, `/`-separated) and, for Markdown files,
/// its text (other files' contents are not needed).
pub struct Tree {
    pub files: BTreeSet<String>,
    pub markdown: BTreeMap<String, String>,
}

/// Whether `target` has a URI scheme (`https:`, `mailto:`): not a path in the tree.
fn has_scheme(target: &str) -> bool {
    match target.find(':') {
        Some(at) => {
            let scheme = &target[..at];
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && scheme
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic())
        }
        None => false,
    }
}

/// `%XX` escapes decoded (GitHub resolves `my%20file.md` to `my file.md`).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` relative to the directory `dir` (both `/`-separated, relative to the root), with `.`
/// and `..` resolved; None if it climbs above the root.
fn resolve(dir: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = if path.starts_with('/') {
        Vec::new()
    } else {
        dir.split('/').filter(|p| !p.is_empty()).collect()
    };
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

/// A GitHub line anchor: `L12` or `L12-L20`.
fn is_line_anchor(anchor: &str) -> bool {
    let line = |s: &str| {
        s.strip_prefix('L')
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    match anchor.split_once('-') {
        Some((a, b)) => line(a) && line(b),
        None => line(anchor),
    }
}

impl Tree {
    fn is_dir(&self, path: &str) -> bool {
        path.is_empty() || {
            let prefix = format!("{path}/");
            self.files
                .range(prefix.clone()..)
                .next()
                .is_some_and(|f| f.starts_with(&prefix))
        }
    }

    /// Why `target`, linked from `from`, does not resolve; None if it does (or is external).
    fn broken(
        &self,
        from: &str,
        target: &str,
        anchors: &mut BTreeMap<String, BTreeSet<String>>,
    ) -> Option<String> {
        if target.is_empty() {
            return Some("empty link".to_string());
        }
        if has_scheme(target) || target.starts_with("//") {
            return None;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target, None),
        };
        // A query (`?raw=true`) does not change the file.
        let path = path.split('?').next().unwrap_or_default();
        let dir = from.rsplit_once('/').map_or("", |(d, _)| d);
        let file = if path.is_empty() {
            from.to_string()
        } else {
            match resolve(dir, &percent_decoded(path)) {
                Some(f) => f,
                None => return Some("climbs above the repository root".to_string()),
            }
        };
        let is_file = self.files.contains(&file);
        if !is_file && !self.is_dir(&file) {
            return Some(format!("no tracked file or directory `{file}`"));
        }
        let anchor = anchor?;
        let anchor = percent_decoded(anchor);
        if !is_file {
            return Some(format!(
                "`{file}` is a directory: it has no anchor `#{anchor}`"
            ));
        }
        match self.markdown.get(&file) {
            Some(text) => {
                let known = anchors
                    .entry(file.clone())
                    .or_insert_with(|| markdown::anchors(text).unwrap_or_default());
                (!known.contains(&anchor))
                    .then(|| format!("`{file}` has no heading with the anchor `#{anchor}`"))
            }
            None => (!is_line_anchor(&anchor)).then(|| {
                format!("`{file}` is not Markdown: only line anchors (#L12) reach into it")
            }),
        }
    }

    /// Every broken relative link of every Markdown file, as `file:line: target: why`.
    pub fn broken_links(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut anchors = BTreeMap::new();
        for (from, text) in &self.markdown {
            let links = match markdown::links(text) {
                Ok(links) => links,
                Err(e) => {
                    out.push(format!("{from}: {e}"));
                    continue;
                }
            };
            for link in links {
                if let Some(why) = self.broken(from, &link.target, &mut anchors) {
                    out.push(format!("{from}:{}: ({}): {why}", link.line, link.target));
                }
            }
        }
        out
    }
}
