//! Reading Markdown the way GitHub renders it, as far as the docs checks need: fenced code blocks,
//! headings and their anchors, and the relative links of the prose.
//!
//! Invariant: text inside a fenced block or an inline code span is never taken for a heading or a
//! link, and a heading's anchor is the slug GitHub gives it (lower case; letters, digits, `-` and
//! `_` kept, each space a `-`, everything else dropped; a repeated slug gets `-1`, `-2`, ...).

use std::collections::BTreeSet;

/// A fenced code block: the line of its opening fence (1-based), its info string, its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub line: usize,
    pub info: String,
    pub text: String,
}

/// What a line of a Markdown file is, as far as fences go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Prose (or a heading): links and headings count.
    Prose,
    /// A fence line or a line inside a fenced block: nothing counts.
    Code,
}

/// An opening fence: a line (indented at most 3 spaces, or anywhere in a list item: we accept any
/// indentation) starting with 3 or more backticks or tildes. Returns (the fence character, the
/// run's length, the info string).
fn opening(line: &str) -> Option<(char, usize, &str)> {
    let t = line.trim_start();
    let c = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let run = t.chars().take_while(|x| *x == c).count();
    if run < 3 {
        return None;
    }
    let info = t[run..].trim();
    // A backtick fence's info string has no backtick (CommonMark): ```a`b``` is a code span.
    if c == '`' && info.contains('`') {
        return None;
    }
    Some((c, run, info))
}

/// Whether `line` closes a fence of `c` opened with `run` characters.
fn closes(line: &str, c: char, run: usize) -> bool {
    let t = line.trim();
    t.len() >= run && t.chars().all(|x| x == c)
}

/// A file read line by line: each line with its kind, and the fenced blocks.
struct Scan<'a> {
    lines: Vec<(Kind, &'a str)>,
    fences: Vec<Fence>,
}

/// Each line of `md` with its kind, and the fenced blocks. An unclosed fence is an error (GitHub
/// would render the rest of the file as code).
fn scan(md: &str) -> Result<Scan<'_>, String> {
    let mut lines = Vec::new();
    let mut fences = Vec::new();
    let mut open: Option<(char, usize, Fence)> = None;
    for (i, line) in md.lines().enumerate() {
        match open.take() {
            None => match opening(line) {
                Some((c, run, info)) => {
                    lines.push((Kind::Code, line));
                    let fence = Fence {
                        line: i + 1,
                        info: info.to_string(),
                        text: String::new(),
                    };
                    open = Some((c, run, fence));
                }
                None => lines.push((Kind::Prose, line)),
            },
            Some((c, run, mut fence)) => {
                lines.push((Kind::Code, line));
                if closes(line, c, run) {
                    fences.push(fence);
                } else {
                    fence.text.push_str(line);
                    fence.text.push('\n');
                    open = Some((c, run, fence));
                }
            }
        }
    }
    if let Some((c, run, fence)) = open {
        let marker: String = std::iter::repeat_n(c, run).collect();
        return Err(format!(
            "the {marker}{} block opened on line {} is never closed",
            fence.info, fence.line
        ));
    }
    Ok(Scan { lines, fences })
}

/// The fenced code blocks of `md`, in order.
pub fn fences(md: &str) -> Result<Vec<Fence>, String> {
    scan(md).map(|scan| scan.fences)
}

/// `line` without its inline code spans (a run of n backticks up to the next run of exactly n);
/// each span becomes one space, so the words around it stay apart.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let run = after.chars().take_while(|c| *c == '`').count();
        let body = &after[run..];
        // The closing run: exactly `run` backticks.
        let mut search = 0;
        let mut close = None;
        while let Some(pos) = body[search..].find('`') {
            let at = search + pos;
            let len = body[at..].chars().take_while(|c| *c == '`').count();
            if len == run {
                close = Some(at + len);
                break;
            }
            search = at + len;
        }
        match close {
            Some(end) => {
                out.push(' ');
                rest = &body[end..];
            }
            // No closing run: the backticks are literal.
            None => {
                out.push_str(&after[..run]);
                rest = body;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A heading's text as GitHub renders it, for its slug: links become their text, images their
/// alt text, HTML tags and emphasis go (the slug drops their punctuation anyway).
fn rendered(text: &str) -> String {
    let text = text.replace('`', "");
    let mut out = String::new();
    let mut rest = text.as_str();
    // `[label](target)` and `![alt](target)` read as `label` / `alt`.
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        out.push_str(rest[..open].trim_end_matches('!'));
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    // HTML tags: `<a id="x"></a>` and the like render as nothing.
    let mut plain = String::new();
    let mut in_tag = false;
    for c in out.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => plain.push(c),
            _ => {}
        }
    }
    plain
}

/// GitHub's slug of a heading's rendered text (github-slugger, without the duplicate suffix).
pub fn slug(text: &str) -> String {
    rendered(text.trim())
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The text of an ATX heading line (`## Text ##`), or None.
fn heading(line: &str) -> Option<&str> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let level = t.chars().take_while(|c| *c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &t[level..];
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    // A closing run of `#` preceded by a space is not part of the text.
    let rest = rest.trim();
    let closing = rest.trim_end_matches('#');
    let text = if closing.is_empty() || closing.ends_with(' ') {
        closing
    } else {
        rest
    };
    Some(text.trim())
}

/// Every anchor a link may name in `md`: each heading's slug (a repeated one with `-1`, `-2`,
/// ...), and the `id`/`name` of HTML anchors written in the prose.
pub fn anchors(md: &str) -> Result<BTreeSet<String>, String> {
    let lines = scan(md)?.lines;
    let mut seen = BTreeSet::new();
    for (kind, line) in lines {
        if kind == Kind::Code {
            continue;
        }
        if let Some(text) = heading(line) {
            let base = slug(text);
            let mut candidate = base.clone();
            let mut n = 0;
            while seen.contains(&candidate) {
                n += 1;
                candidate = format!("{base}-{n}");
            }
            seen.insert(candidate);
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let value = &rest[at + attr.len()..];
                if let Some(end) = value.find('"') {
                    seen.insert(value[..end].to_string());
                }
                rest = &rest[at + attr.len()..];
            }
        }
    }
    Ok(seen)
}

/// A link of the prose: the line it is on (1-based) and its target as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub line: usize,
    pub target: String,
}

/// The target of a link destination `(…)` starting at `s` (just after the `(`): `<a b>` or a
/// run without spaces (balanced parentheses allowed), an optional title after it ignored.
fn destination(s: &str) -> Option<String> {
    if let Some(inner) = s.strip_prefix('<') {
        let end = inner.find('>')?;
        return Some(inner[..end].to_string());
    }
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(s[..i].to_string()),
            ')' => depth -= 1,
            c if c.is_whitespace() => return Some(s[..i].to_string()),
            _ => {}
        }
    }
    None
}

/// The target of a reference definition line, `[label]: target` (footnotes `[^1]:` are not).
fn reference_definition(line: &str) -> Option<String> {
    let t = line.trim_start();
    let label = t.strip_prefix('[')?;
    let end = label.find("]:")?;
    let name = &label[..end];
    if name.is_empty() || name.starts_with('^') || name.contains(['[', ']']) {
        return None;
    }
    let def = label[end + 2..].trim();
    if let Some(inner) = def.strip_prefix('<') {
        return inner.find('>').map(|e| inner[..e].to_string());
    }
    def.split_whitespace().next().map(str::to_string)
}

/// Every link and image of `md`'s prose: inline `[text](target)` / `![alt](target)` and reference
/// definitions `[label]: target`. Links inside fenced blocks and code spans are not links.
pub fn links(md: &str) -> Result<Vec<Link>, String> {
    let lines = scan(md)?.lines;
    let mut out = Vec::new();
    for (i, (kind, line)) in lines.into_iter().enumerate() {
        if kind == Kind::Code {
            continue;
        }
        let prose = without_code_spans(line);
        if let Some(target) = reference_definition(&prose) {
            out.push(Link {
                line: i + 1,
                target,
            });
            continue;
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            if let Some(target) = destination(after.trim_start()) {
                out.push(Link {
                    line: i + 1,
                    target,
                });
            }
            rest = after;
        }
    }
    Ok(out)
}
