//! A small YAML subset parsed into `serde_json::Value`, enough for the manifests the repository ships
//! (docker-compose.yaml, envoy/istio/*.yaml) to be checked by tests without a YAML crate.
//!
//! Supported: block mappings and sequences (a sequence may sit at its key's indentation, as in
//! Kubernetes manifests), plain / single-quoted / double-quoted scalars, flow `[...]` and `{...}`
//! collections (which may span lines, so JSON is accepted), literal block scalars (`|`, `|-`, `|+`),
//! comments and `---` document separators. Plain scalars follow the YAML 1.2 core schema: `true`,
//! `false`, `null`, `~`, integers and floats; everything else is a string.
//!
//! Anything else (anchors, aliases, tags, folded `>` scalars, multi-line plain or quoted scalars,
//! `?` keys, tabs in indentation) is an error naming the line, so a manifest that outgrows the subset
//! makes its test fail loudly instead of being misread.

use serde_json::{Map, Number, Value};

/// Every document of a YAML stream (empty documents are skipped).
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    let mut current: Vec<(usize, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed == "..." || trimmed.starts_with("--- ") {
            if trimmed.starts_with("--- ") {
                return Err(format!(
                    "line {}: content after `---` is not supported",
                    i + 1
                ));
            }
            if let Some(doc) = parse_lines(std::mem::take(&mut current))? {
                docs.push(doc);
            }
            continue;
        }
        if trimmed.starts_with('%') {
            return Err(format!("line {}: directives are not supported", i + 1));
        }
        current.push((i + 1, line.to_string()));
    }
    if let Some(doc) = parse_lines(current)? {
        docs.push(doc);
    }
    Ok(docs)
}

/// A single-document YAML text.
pub fn parse(text: &str) -> Result<Value, String> {
    let mut docs = parse_documents(text)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => Err(format!("expected one YAML document, found {n}")),
    }
}

fn parse_lines(lines: Vec<(usize, String)>) -> Result<Option<Value>, String> {
    let mut p = Parser { lines, pos: 0 };
    let Some((indent, _)) = p.peek()? else {
        return Ok(None);
    };
    let value = p.block(indent)?;
    if let Some((_, _)) = p.peek()? {
        let no = p.line_no();
        return Err(format!("line {no}: unexpected content (bad indentation?)"));
    }
    Ok(Some(value))
}

struct Parser {
    /// (1-based line number, raw line)
    lines: Vec<(usize, String)>,
    pos: usize,
}

fn is_ignorable(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#')
}

fn is_seq_item(content: &str) -> bool {
    content == "-" || content.starts_with("- ")
}

/// `content` without a trailing comment (a `#` at the start or after whitespace, outside quotes).
fn strip_comment(content: &str) -> &str {
    let (mut single, mut double, mut prev_space) = (false, false, true);
    let mut escaped = false;
    for (i, c) in content.char_indices() {
        match c {
            '\\' if double => {
                escaped = !escaped;
                prev_space = false;
                continue;
            }
            '"' if !single && !escaped => double = !double,
            '\'' if !double => single = !single,
            '#' if !single && !double && prev_space => return content[..i].trim_end(),
            _ => {}
        }
        escaped = false;
        prev_space = c == ' ' || c == '\t';
    }
    content.trim_end()
}

/// Where a mapping key ends: `Some((key, rest_after_colon))` if `content` is `key: value` / `key:`.
fn split_key(content: &str) -> Result<Option<(String, String)>, String> {
    if content.starts_with('[') || content.starts_with('{') || is_seq_item(content) {
        return Ok(None);
    }
    if content.starts_with('?') {
        return Err("complex keys (`?`) are not supported".into());
    }
    if let Some(q) = content.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let (key, used) = quoted(content, q)?;
        let rest = &content[used..];
        return Ok(rest
            .strip_prefix(':')
            .filter(|r| r.is_empty() || r.starts_with(' '))
            .map(|r| (key, r.trim().to_string())));
    }
    let bytes = content.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b':' && (i + 1 == bytes.len() || bytes.get(i + 1) == Some(&b' ')) {
            let key = content[..i].trim();
            if key.is_empty() {
                return Err("empty mapping key".into());
            }
            return Ok(Some((key.to_string(), content[i + 1..].trim().to_string())));
        }
    }
    Ok(None)
}

/// A quoted scalar at the start of `s` (opening quote `q`); (value, bytes used).
fn quoted(s: &str, q: char) -> Result<(String, usize), String> {
    if q == '\'' {
        let mut out = String::new();
        let mut chars = s.char_indices().skip(1).peekable();
        while let Some((i, c)) = chars.next() {
            if c == '\'' {
                if chars.peek().map(|&(_, n)| n) == Some('\'') {
                    out.push('\'');
                    chars.next();
                } else {
                    return Ok((out, i + 1));
                }
            } else {
                out.push(c);
            }
        }
        return Err(
            "unterminated single-quoted scalar (multi-line scalars are not supported)".into(),
        );
    }
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            let value: String = serde_json::from_str(&s[..=i])
                .map_err(|e| format!("double-quoted scalar {}: {e}", &s[..=i]))?;
            return Ok((value, i + 1));
        }
    }
    Err("unterminated double-quoted scalar (multi-line scalars are not supported)".into())
}

/// A plain scalar under the YAML 1.2 core schema.
fn plain(s: &str) -> Result<Value, String> {
    if let Some(c) = s.chars().next().filter(|c| "&*!|>%@`".contains(*c)) {
        return Err(format!(
            "`{c}` at the start of a scalar is not supported: {s}"
        ));
    }
    Ok(match s {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ => {
            let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                match s.parse::<i64>() {
                    Ok(n) => Value::Number(n.into()),
                    Err(_) => Value::String(s.to_string()),
                }
            } else if is_float(digits) {
                s.parse::<f64>()
                    .ok()
                    .and_then(Number::from_f64)
                    .map_or_else(|| Value::String(s.to_string()), Value::Number)
            } else {
                Value::String(s.to_string())
            }
        }
    })
}

/// `1.5`, `.5`, `1.`, `1e3`, `1.5E-3` (no sign: the caller stripped it).
fn is_float(s: &str) -> bool {
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => {
            (!a.is_empty() || !b.is_empty())
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => {
            exp.is_some() && !mantissa.is_empty() && mantissa.bytes().all(|c| c.is_ascii_digit())
        }
    };
    let exp_ok = exp.map_or(true, |e| {
        let d = e.strip_prefix(['-', '+']).unwrap_or(e);
        !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit())
    });
    mantissa_ok && exp_ok
}

impl Parser {
    fn line_no(&self) -> usize {
        self.lines.get(self.pos).map_or(0, |l| l.0)
    }

    /// The next significant line as (indent, content without comment); skips blank and comment lines.
    fn peek(&mut self) -> Result<Option<(usize, String)>, String> {
        while self.lines.get(self.pos).is_some_and(|l| is_ignorable(&l.1)) {
            self.pos += 1;
        }
        let Some((no, line)) = self.lines.get(self.pos) else {
            return Ok(None);
        };
        let indent = line.len() - line.trim_start_matches(' ').len();
        if line[indent..].starts_with('\t') {
            return Err(format!("line {no}: tabs in indentation are not supported"));
        }
        Ok(Some((indent, strip_comment(&line[indent..]).to_string())))
    }

    fn err<T>(&self, what: impl std::fmt::Display) -> Result<T, String> {
        Err(format!("line {}: {what}", self.line_no()))
    }

    /// The block node whose first line is the next significant line, at `indent`.
    fn block(&mut self, indent: usize) -> Result<Value, String> {
        match self.peek()? {
            Some((_, content)) if is_seq_item(&content) => self.sequence(indent),
            Some(_) => self.mapping(indent),
            None => Ok(Value::Null),
        }
    }

    fn sequence(&mut self, indent: usize) -> Result<Value, String> {
        let mut items = Vec::new();
        while let Some((ind, content)) = self.peek()? {
            if ind < indent || (ind == indent && !is_seq_item(&content)) {
                break;
            }
            if ind > indent {
                return self.err("unexpected indentation in a sequence");
            }
            let rest = content[1..].trim_start();
            if rest.is_empty() {
                self.pos += 1;
                items.push(self.nested(indent)?);
                continue;
            }
            if split_key(rest)
                .map_err(|e| format!("line {}: {e}", self.line_no()))?
                .is_some()
            {
                // `- key: value`: a mapping whose keys line up with `key`.
                let offset = indent + (content.len() - rest.len());
                let no = self.line_no();
                if let Some(slot) = self.lines.get_mut(self.pos) {
                    *slot = (no, format!("{}{rest}", " ".repeat(offset)));
                }
                items.push(self.mapping(offset)?);
                continue;
            }
            let rest = rest.to_string();
            items.push(self.inline_value(&rest, indent)?);
        }
        Ok(Value::Array(items))
    }

    fn mapping(&mut self, indent: usize) -> Result<Value, String> {
        let mut map = Map::new();
        while let Some((ind, content)) = self.peek()? {
            if ind < indent || (ind == indent && is_seq_item(&content)) {
                break;
            }
            if ind > indent {
                return self.err("unexpected indentation in a mapping");
            }
            let Some((key, rest)) =
                split_key(&content).map_err(|e| format!("line {}: {e}", self.line_no()))?
            else {
                return self.err(format!("expected `key: value`, got `{content}`"));
            };
            if map.contains_key(&key) {
                return self.err(format!("duplicate key `{key}`"));
            }
            let value = if rest.is_empty() {
                self.pos += 1;
                match self.peek()? {
                    Some((ind2, c2)) if ind2 == indent && is_seq_item(&c2) => {
                        self.sequence(indent)?
                    }
                    _ => self.nested(indent)?,
                }
            } else if let Some(chomp) = rest.strip_prefix('|') {
                self.pos += 1;
                self.literal(indent, chomp)?
            } else {
                self.inline_value(&rest, indent)?
            };
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }

    /// The node indented deeper than `indent` that follows, or null if there is none.
    fn nested(&mut self, indent: usize) -> Result<Value, String> {
        match self.peek()? {
            Some((ind, _)) if ind > indent => self.block(ind),
            _ => Ok(Value::Null),
        }
    }

    /// A value written on the current line (after `key:` or `- `), whose parent sits at `indent`.
    /// Flow collections may continue on the following lines until their brackets close.
    fn inline_value(&mut self, first: &str, indent: usize) -> Result<Value, String> {
        let start = self.line_no();
        self.pos += 1;
        let value = if first.starts_with('[') || first.starts_with('{') {
            let mut text = first.to_string();
            while !flow_closed(&text) {
                let Some((_, line)) = self.lines.get(self.pos) else {
                    return Err(format!("line {start}: unterminated flow collection"));
                };
                text.push(' ');
                text.push_str(strip_comment(line.trim()));
                self.pos += 1;
            }
            let mut f = Flow {
                s: text.as_bytes(),
                text: &text,
                i: 0,
            };
            let v = f
                .value()
                .map_err(|e| format!("line {start}: flow collection: {e}"))?;
            f.ws();
            if f.i != text.len() {
                return Err(format!("line {start}: text after a flow collection"));
            }
            v
        } else if let Some(q) = first.chars().next().filter(|c| *c == '"' || *c == '\'') {
            let (s, used) = quoted(first, q).map_err(|e| format!("line {start}: {e}"))?;
            if !first[used..].trim().is_empty() {
                return Err(format!("line {start}: text after a quoted scalar"));
            }
            Value::String(s)
        } else {
            plain(first).map_err(|e| format!("line {start}: {e}"))?
        };
        if let Some((ind, _)) = self.peek()? {
            if ind > indent && !value.is_array() && !value.is_object() {
                return self.err("multi-line plain scalars are not supported");
            }
        }
        Ok(value)
    }

    /// A literal block scalar (`|`, `|-`, `|+`) under a key at `indent`.
    fn literal(&mut self, indent: usize, chomp: &str) -> Result<Value, String> {
        if !["", "-", "+"].contains(&chomp) {
            return self.err(format!("block scalar header `|{chomp}` is not supported"));
        }
        let mut body: Vec<String> = Vec::new();
        let mut block_indent = None;
        while let Some((_, line)) = self.lines.get(self.pos) {
            let ind = line.len() - line.trim_start_matches(' ').len();
            if line.trim().is_empty() {
                body.push(String::new());
            } else if ind > indent {
                let bi = *block_indent.get_or_insert(ind);
                if ind < bi {
                    break;
                }
                body.push(line[bi..].to_string());
            } else {
                break;
            }
            self.pos += 1;
        }
        let trailing = body.iter().rev().take_while(|l| l.is_empty()).count();
        let kept = body.len() - trailing;
        let mut text = body[..kept].join("\n");
        match chomp {
            "-" => {}
            "+" => text.push_str(&"\n".repeat(trailing + 1)),
            _ if kept > 0 => text.push('\n'),
            _ => {}
        }
        Ok(Value::String(text))
    }
}

/// Whether every `[`/`{` outside quotes in `text` is closed.
fn flow_closed(text: &str) -> bool {
    let (mut depth, mut single, mut double, mut escaped) = (0i32, false, false, false);
    for c in text.chars() {
        match c {
            '\\' if double && !escaped => {
                escaped = true;
                continue;
            }
            '"' if !single && !escaped => double = !double,
            '\'' if !double => single = !single,
            '[' | '{' if !single && !double => depth += 1,
            ']' | '}' if !single && !double => depth -= 1,
            _ => {}
        }
        escaped = false;
    }
    depth <= 0
}

/// A flow collection (JSON is one).
struct Flow<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Flow<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|b| b.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn value(&mut self) -> Result<Value, String> {
        self.ws();
        match self.peek() {
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                        return Ok(Value::Array(items));
                    }
                    items.push(self.value()?);
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {}
                        _ => return Err(format!("expected `,` or `]` at byte {}", self.i)),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut map = Map::new();
                loop {
                    self.ws();
                    if self.peek() == Some(b'}') {
                        self.i += 1;
                        return Ok(Value::Object(map));
                    }
                    let key = match self.scalar(b":")? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.ws();
                    if self.peek() != Some(b':') {
                        return Err(format!("expected `:` after key `{key}`"));
                    }
                    self.i += 1;
                    let value = self.value()?;
                    map.insert(key, value);
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {}
                        _ => return Err(format!("expected `,` or `}}` at byte {}", self.i)),
                    }
                }
            }
            _ => self.scalar(b""),
        }
    }

    /// A quoted or plain scalar; a plain one ends at `,`, `]`, `}` or any byte in `stop`.
    fn scalar(&mut self, stop: &[u8]) -> Result<Value, String> {
        self.ws();
        let rest = self.text.get(self.i..).unwrap_or("");
        if let Some(q) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') {
            let (s, used) = quoted(rest, q)?;
            self.i += used;
            return Ok(Value::String(s));
        }
        let start = self.i;
        while let Some(b) = self.peek() {
            if b == b',' || b == b']' || b == b'}' || stop.contains(&b) {
                break;
            }
            self.i += 1;
        }
        plain(self.text[start..self.i].trim())
    }
}
