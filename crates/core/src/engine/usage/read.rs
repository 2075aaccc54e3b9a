//! Reading what a response says it used: a header value, a dotted field of a JSON body, or of the
//! last server-sent event that carries it; or why that cannot be read.
//!
//! Invariant: memory per response is bounded (a reader's buffer never holds or reserves more than
//! `WINDOW` bytes, whatever the size of a chunk; the readers alive at once in a worker are capped
//! by [`Readers`]), every body chunk is only looked at (never held back), and whatever the
//! upstream sends, the result is a usage (a JSON integer `>= 0`) or the reason there is none.

use super::readers::{Readers, Slot};
use crate::metrics::Counter;
use crate::rule::{reading, Read, RequestView};

/// Most bytes kept per response: the current SSE line, or the tail of a JSON body.
pub const WINDOW: usize = 16 * 1024;

/// How much of each chunk of a body its readers look at: the filter copies no more of it into the
/// VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Its last `WINDOW` bytes: a JSON body is read from its tail.
    Tail,
    /// All of it: an event stream is read line by line.
    Whole,
}

impl Look {
    /// The part of a chunk of `size` bytes to read: how many bytes before it are skipped, and
    /// its length.
    pub fn part(self, size: usize) -> (usize, usize) {
        let len = match self {
            Look::Tail => size.min(WINDOW),
            Look::Whole => size,
        };
        (size - len, len)
    }

    /// What readers of both looks need.
    pub fn and(self, other: Look) -> Look {
        if self == Look::Whole || other == Look::Whole {
            Look::Whole
        } else {
            Look::Tail
        }
    }
}

/// A chunk of a body as the filter read it: its last `bytes.len()` bytes, after `skipped` bytes
/// it did not read ([`Look::Tail`]).
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    pub skipped: usize,
    pub bytes: &'a [u8],
}

impl<'a> Chunk<'a> {
    /// A chunk read whole.
    pub fn whole(bytes: &'a [u8]) -> Chunk<'a> {
        Chunk { skipped: 0, bytes }
    }
}

/// Most digits of a usage header: `u64::MAX` has 20.
const MAX_USAGE_DIGITS: usize = 20;

/// Why a response's usage could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// The value is not a non-negative integer (or was given twice).
    Invalid,
    /// The body is neither JSON nor an event stream, or not well-formed JSON.
    Body,
    /// The response ended without a usage: no header or trailer, no field in the JSON body or in
    /// any event of the stream.
    Missing,
    /// The body has a `content-encoding` the reader does not decode.
    Encoded,
    /// The field was not within the window: a JSON body's last `WINDOW` bytes, or an event line
    /// of at most `WINDOW` bytes.
    TooLarge,
    /// The request ended before its response did (the client left, or the stream was reset),
    /// and no usage had been seen.
    Unfinished,
    /// The worker was already reading as many bodies as it may at once ([`Readers`]).
    ReadersFull,
}

impl Unreadable {
    /// The counter of responses whose usage was unreadable for this reason.
    pub fn counter(self) -> Counter {
        match self {
            Unreadable::Invalid | Unreadable::Body => Counter::UsageInvalid,
            Unreadable::Missing => Counter::UsageMissing,
            Unreadable::Encoded => Counter::UsageEncoded,
            Unreadable::TooLarge => Counter::UsageTooLarge,
            Unreadable::Unfinished => Counter::UsageUnfinished,
            Unreadable::ReadersFull => Counter::UsageReadersFull,
        }
    }
}

/// Whether a response's body is encoded (`content-encoding` other than `identity`): the filter
/// asks the upstream for identity, and reads nothing else.
pub fn encoded(view: &dyn RequestView) -> bool {
    view.header("content-encoding").is_some_and(|v| {
        let v = v.trim_ascii();
        !v.is_empty() && !v.eq_ignore_ascii_case(b"identity")
    })
}

/// Whether a response's body is only part of the answer: a `206`, or any response with a
/// `content-range` (a client that sends `Range` picks the bytes, and so which usage a body reader
/// would find in them). Such a body is never read for usage.
pub fn partial(view: &dyn RequestView) -> bool {
    view.header(":status").as_deref() == Some(b"206") || view.header("content-range").is_some()
}

/// Parses a usage header value: digits only (a header's lines joined with a comma are not a
/// number, and so are invalid).
pub fn parse_header(value: &[u8]) -> Result<u64, Unreadable> {
    if value.is_empty() || value.len() > MAX_USAGE_DIGITS || !value.iter().all(u8::is_ascii_digit) {
        return Err(Unreadable::Invalid);
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(Unreadable::Invalid)
}

/// The header of `name` in a response view (response headers and trailers are read through the
/// same trait as requests): None when no line has it; two lines, however spelled (`x_usage` for
/// `x-usage`, [`RequestView::header_lines`]), are [`Unreadable::Invalid`], so a client that gets
/// a low line put before the upstream's is charged the worst case, not the low line.
pub fn from_headers(view: &dyn RequestView, name: &str) -> Option<Result<u64, Unreadable>> {
    match reading::header(view.header_lines(name)) {
        Read::Missing => None,
        Read::Ambiguous => Some(Err(Unreadable::Invalid)),
        Read::Value(v) => Some(parse_header(&v)),
    }
}

fn field<'a>(doc: &'a serde_json::Value, path: &[String]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(doc, |v, seg| v.get(seg.as_str()))
}

fn as_usage(v: &serde_json::Value) -> Result<u64, Unreadable> {
    v.as_u64().ok_or(Unreadable::Invalid)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Json,
    EventStream,
}

/// Follows one response body, chunk by chunk.
#[derive(Debug)]
pub struct BodyReader {
    kind: Kind,
    path: Vec<String>,
    /// JSON: the last `WINDOW` bytes seen (and whether anything was cut off before them).
    /// Event stream: the current line (and whether it overflowed).
    window: Vec<u8>,
    cut: bool,
    /// Event stream: a line longer than the window was skipped since the last event that carried
    /// the field (it may have carried a later usage, which would win).
    skipped: bool,
    /// Event stream: the usage of the last event that carried the field.
    found: Option<Result<u64, Unreadable>>,
    /// A chunk the host could not give was lost: what is read around the hole is not the body.
    lost: bool,
    /// This reader's place among the worker's readers, given back when it is dropped.
    _slot: Slot,
}

impl Kind {
    /// The kind of a body of `content_type`, or None if it is neither JSON nor an event stream.
    fn of(content_type: Option<&[u8]>) -> Option<Kind> {
        let ct = content_type?.to_ascii_lowercase();
        let essence = ct
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if essence == b"text/event-stream" {
            Some(Kind::EventStream)
        } else if essence == b"application/json" || essence.ends_with(b"+json") {
            Some(Kind::Json)
        } else {
            None
        }
    }
}

/// Makes room in `buf` for `more` bytes (`buf.len() + more <= WINDOW`) without letting its
/// capacity pass `WINDOW`: `Vec`'s own growth doubles, which could reserve up to twice that.
fn reserve(buf: &mut Vec<u8>, more: usize) {
    let needed = buf.len().saturating_add(more);
    if needed > buf.capacity() {
        let target = buf.capacity().saturating_mul(2).min(WINDOW).max(needed);
        buf.reserve_exact(target.saturating_sub(buf.len()));
    }
}

impl BodyReader {
    /// A reader for a body of `content_type` (`Body` if it is neither JSON nor an event stream),
    /// if `readers` has room for one more (`ReadersFull` if not).
    pub fn new(
        content_type: Option<&[u8]>,
        path: &[String],
        readers: &Readers,
    ) -> Result<BodyReader, Unreadable> {
        let kind = Kind::of(content_type).ok_or(Unreadable::Body)?;
        let slot = readers.take().ok_or(Unreadable::ReadersFull)?;
        Ok(BodyReader {
            kind,
            path: path.to_vec(),
            window: Vec::new(),
            cut: false,
            skipped: false,
            found: None,
            lost: false,
            _slot: slot,
        })
    }

    /// A chunk of the body the host could not give: the body is charged the worst case.
    pub fn lose(&mut self) {
        self.lost = true;
    }

    /// How much of each chunk this reader looks at.
    pub fn look(&self) -> Look {
        match self.kind {
            Kind::Json => Look::Tail,
            Kind::EventStream => Look::Whole,
        }
    }

    /// Looks at the next chunk of the body.
    pub fn feed(&mut self, chunk: Chunk<'_>) {
        let Chunk {
            skipped,
            bytes: chunk,
        } = chunk;
        match self.kind {
            Kind::Json => {
                // What came before the skipped bytes is no longer the body's tail.
                if skipped > 0 {
                    self.window.clear();
                    self.cut = true;
                }
                // Only the chunk's last `WINDOW` bytes can be in the tail: copy no more.
                let skip = chunk.len().saturating_sub(WINDOW);
                let tail = chunk.get(skip..).unwrap_or_default();
                let excess = (self.window.len() + tail.len()).saturating_sub(WINDOW);
                if skip > 0 || excess > 0 {
                    self.cut = true;
                }
                self.window.drain(..excess.min(self.window.len()));
                reserve(&mut self.window, tail.len());
                self.window.extend_from_slice(tail);
            }
            // Every line is read: a chunk not read whole has a hole (never asked for, see
            // `look`), charged the worst case.
            Kind::EventStream if skipped > 0 => self.lose(),
            Kind::EventStream => {
                for line in chunk.split_inclusive(|&b| b == b'\n') {
                    let complete = line.last() == Some(&b'\n');
                    if self.window.len() + line.len() > WINDOW {
                        self.cut = true;
                    } else if !self.cut {
                        reserve(&mut self.window, line.len());
                        self.window.extend_from_slice(line);
                    }
                    if complete {
                        if self.cut {
                            self.skipped = true;
                        } else {
                            let line = std::mem::take(&mut self.window);
                            self.event_line(&line);
                        }
                        self.window.clear();
                        self.cut = false;
                    }
                }
            }
        }
    }

    fn event_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data.trim_ascii()) else {
            return; // e.g. "data: [DONE]"
        };
        if let Some(v) = field(&doc, &self.path) {
            self.found = Some(as_usage(v));
            self.skipped = false;
        }
    }

    /// What the body said it used, once it has ended.
    pub fn finish(mut self) -> Result<u64, Unreadable> {
        if self.lost {
            return Err(Unreadable::TooLarge);
        }
        match self.kind {
            Kind::EventStream => {
                let last = std::mem::take(&mut self.window);
                if self.cut {
                    self.skipped = true;
                } else {
                    self.event_line(&last);
                }
                match self.found {
                    _ if self.skipped => Err(Unreadable::TooLarge),
                    Some(found) => found,
                    None => Err(Unreadable::Missing),
                }
            }
            Kind::Json if self.cut => self.read_tail(),
            Kind::Json if self.window.trim_ascii().is_empty() => Err(Unreadable::Missing),
            Kind::Json => match serde_json::from_slice::<serde_json::Value>(&self.window) {
                Ok(doc) => field(&doc, &self.path).map_or(Err(Unreadable::Missing), as_usage),
                Err(_) => Err(Unreadable::Body),
            },
        }
    }

    /// What the body has said so far, for a response that will not end: the last event that
    /// carried the field, unless a line too long to read came after it (a JSON body is read only
    /// whole).
    pub fn seen(&self) -> Option<Result<u64, Unreadable>> {
        if self.lost {
            return Some(Err(Unreadable::TooLarge));
        }
        match self.kind {
            Kind::EventStream if self.skipped => self.found.map(|_| Err(Unreadable::TooLarge)),
            Kind::EventStream => self.found,
            Kind::Json => None,
        }
    }

    /// A JSON body larger than the window: find the last `"<first segment>":` that is not inside
    /// a string's escape, and read the value that follows it. It is not checked to be a key of
    /// the top-level object: the tail starts at an unknown depth (the README says so).
    fn read_tail(&self) -> Result<u64, Unreadable> {
        let (first, rest) = self.path.split_first().ok_or(Unreadable::TooLarge)?;
        let needle = format!("\"{first}\"");
        let w = &self.window;
        let mut end = w.len();
        while let Some(pos) = find_last(w.get(..end).unwrap_or_default(), needle.as_bytes()) {
            end = pos;
            // A quote inside a string is escaped; one at the very start of the tail may be too,
            // by a backslash that was cut off, so it is never taken for a key.
            if pos == 0 || w.get(pos - 1) == Some(&b'\\') {
                continue;
            }
            let after = w.get(pos + needle.len()..).unwrap_or_default();
            let after = after.trim_ascii_start();
            let Some(value) = after.strip_prefix(b":") else {
                continue;
            };
            let mut stream =
                serde_json::Deserializer::from_slice(value).into_iter::<serde_json::Value>();
            if let Some(Ok(v)) = stream.next() {
                // A number ends where the body does if the body was cut in it (`40` sent as
                // `4` to a `Range` request): a value is whole only with a delimiter after it.
                let next = value.get(stream.byte_offset()..).unwrap_or_default();
                if !matches!(next.trim_ascii_start().first(), Some(b',' | b'}' | b']')) {
                    return Err(Unreadable::TooLarge);
                }
                return field(&v, rest).map_or(Err(Unreadable::TooLarge), as_usage);
            }
        }
        Err(Unreadable::TooLarge)
    }
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| hay.get(i..i + needle.len()) == Some(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<String> {
        p.split('.').map(str::to_owned).collect()
    }

    /// A reader of its own worker (the cap is tested in `readers` and the engine's tests).
    fn new(ct: Option<&[u8]>, p: &str) -> Result<BodyReader, Unreadable> {
        BodyReader::new(ct, &path(p), &Readers::default())
    }

    fn reader(ct: &str, chunks: &[&[u8]], p: &str) -> BodyReader {
        let mut r = new(Some(ct.as_bytes()), p).unwrap();
        for c in chunks {
            r.feed(Chunk::whole(c));
        }
        r
    }

    fn read(ct: &str, chunks: &[&[u8]], p: &str) -> Result<u64, Unreadable> {
        reader(ct, chunks, p).finish()
    }

    #[test]
    fn header_values() {
        assert_eq!(parse_header(b"40"), Ok(40));
        assert_eq!(parse_header(b"0"), Ok(0));
        for bad in [
            &b""[..],
            b"-1",
            b"1.5",
            b"40, 40",
            b" 4",
            b"99999999999999999999999",
        ] {
            assert_eq!(parse_header(bad), Err(Unreadable::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn a_json_body_in_any_chunks() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":3,"total_tokens":40}}"#;
        for split in 0..body.len() {
            let (a, b) = body.split_at(split);
            assert_eq!(
                read(
                    "application/json; charset=utf-8",
                    &[a, b],
                    "usage.total_tokens"
                ),
                Ok(40)
            );
        }
        assert_eq!(
            read("application/json", &[br#"{"a":1}"#], "usage.total_tokens"),
            Err(Unreadable::Missing)
        );
        assert_eq!(
            read("application/json", &[b"", b" \r\n"], "usage.total_tokens"),
            Err(Unreadable::Missing),
            "an empty body"
        );
        assert_eq!(
            read(
                "application/json",
                &[br#"{"usage":{"total_tokens":-3}}"#],
                "usage.total_tokens"
            ),
            Err(Unreadable::Invalid)
        );
        assert_eq!(
            read("application/json", &[b"{not json"], "usage.total_tokens"),
            Err(Unreadable::Body)
        );
        assert_eq!(new(Some(b"text/html"), "a").err(), Some(Unreadable::Body));
        assert_eq!(new(None, "a").err(), Some(Unreadable::Body));
    }

    #[test]
    fn a_large_json_body_is_read_from_its_tail_only() {
        let filler = "\\\"usage\\\": {\\\"total_tokens\\\": 999} ".repeat(2000);
        let body =
            format!(r#"{{"choices":[{{"text":"{filler}"}}],"usage":{{"total_tokens":40}}}}"#);
        assert!(body.len() > 4 * WINDOW);
        let chunks: Vec<&[u8]> = body.as_bytes().chunks(1000).collect();
        let mut r = new(Some(b"application/json"), "usage.total_tokens").unwrap();
        for c in &chunks {
            r.feed(Chunk::whole(c));
            assert!(r.window.len() <= WINDOW);
        }
        assert_eq!(r.finish(), Ok(40));
        // The field before the tail: too large to read (not missing, not invalid).
        let body = format!(
            r#"{{"usage":{{"total_tokens":40}},"text":"{}"}}"#,
            "x".repeat(WINDOW)
        );
        assert_eq!(
            read("application/json", &[body.as_bytes()], "usage.total_tokens"),
            Err(Unreadable::TooLarge)
        );
        let r = reader("application/json", &[body.as_bytes()], "usage.total_tokens");
        assert_eq!(r.seen(), None, "a JSON body is read only whole");
    }

    /// A large body cut in its usage (an upstream answering a `Range` request, `206`, with the
    /// body up to a chosen byte) is not read as the number it was cut to.
    #[test]
    fn a_large_body_cut_in_its_usage_is_not_read() {
        let pad = "x".repeat(2 * WINDOW);
        let whole = format!(r#"{{"pad":"{pad}","tokens_used":40}}"#);
        assert_eq!(
            read("application/json", &[whole.as_bytes()], "tokens_used"),
            Ok(40)
        );
        for cut in [
            r#","tokens_used":4"#,
            r#","tokens_used":40"#,
            r#","tokens_used":40 "#,
        ] {
            let body = format!(r#"{{"pad":"{pad}"{cut}"#);
            assert_eq!(
                read("application/json", &[body.as_bytes()], "tokens_used"),
                Err(Unreadable::TooLarge),
                "{cut}"
            );
        }
        // Cut after the value's delimiter, it was whole.
        let body = format!(r#"{{"pad":"{pad}","tokens_used":40,"more"#);
        assert_eq!(
            read("application/json", &[body.as_bytes()], "tokens_used"),
            Ok(40)
        );
    }

    /// Whatever the chunks, a JSON reader keeps exactly the body's last `WINDOW` bytes, never
    /// holds or reserves more, and so never copies a whole large chunk.
    #[test]
    fn a_json_reader_keeps_the_last_window_bytes_of_any_chunks() {
        let body: Vec<u8> = (0..5 * WINDOW + 123).map(|i| (i % 251) as u8).collect();
        let sizes: [&[usize]; 5] = [
            &[5 * WINDOW + 123],
            &[WINDOW + 1, 7, 3 * WINDOW],
            &[10, WINDOW - 5, WINDOW, 2 * WINDOW + 1],
            &[1000],
            &[WINDOW / 2, 3 * WINDOW + 7],
        ];
        for pattern in sizes {
            let mut r = new(Some(b"application/json"), "usage.total_tokens").unwrap();
            let mut fed = 0;
            for &size in pattern.iter().cycle() {
                if fed == body.len() {
                    break;
                }
                let end = (fed + size).min(body.len());
                r.feed(Chunk::whole(&body[fed..end]));
                fed = end;
                let kept = fed.min(WINDOW);
                assert_eq!(r.window, body[fed - kept..fed], "{pattern:?} at {fed}");
                assert_eq!(r.cut, fed > WINDOW, "{pattern:?} at {fed}");
                assert!(r.window.capacity() <= WINDOW, "{pattern:?} at {fed}");
            }
        }
        // One chunk of a large body, read from its tail.
        let body = format!(
            r#"{{"text":"{}","usage":{{"total_tokens":40}}}}"#,
            "x".repeat(3 * WINDOW)
        );
        let mut r = new(Some(b"application/json"), "usage.total_tokens").unwrap();
        r.feed(Chunk::whole(body.as_bytes()));
        assert!(r.window.capacity() <= WINDOW);
        assert_eq!(r.finish(), Ok(40));
    }

    /// Fed only what `Look::Tail` asks the filter to copy of each chunk, a JSON reader keeps
    /// what it keeps when fed whole chunks; an event stream, which looks at whole chunks, is
    /// charged the worst case if it ever gets a part.
    #[test]
    fn a_json_reader_fed_chunk_tails_keeps_what_whole_chunks_give() {
        let body: Vec<u8> = (0..5 * WINDOW + 123).map(|i| (i % 251) as u8).collect();
        let sizes: [&[usize]; 4] = [
            &[5 * WINDOW + 123],
            &[WINDOW + 1, 7, 3 * WINDOW],
            &[10, WINDOW - 5, WINDOW, 2 * WINDOW + 1],
            &[WINDOW / 2, 3 * WINDOW + 7],
        ];
        for pattern in sizes {
            let mut whole = new(Some(b"application/json"), "u").unwrap();
            let mut tails = new(Some(b"application/json"), "u").unwrap();
            assert_eq!(tails.look(), Look::Tail);
            let mut fed = 0;
            for &size in pattern.iter().cycle() {
                if fed == body.len() {
                    break;
                }
                let chunk = &body[fed..(fed + size).min(body.len())];
                fed += chunk.len();
                whole.feed(Chunk::whole(chunk));
                let (skipped, len) = Look::Tail.part(chunk.len());
                assert_eq!(skipped + len, chunk.len());
                assert!(len <= WINDOW);
                tails.feed(Chunk {
                    skipped,
                    bytes: &chunk[skipped..],
                });
                assert_eq!(tails.window, whole.window, "{pattern:?} at {fed}");
                assert_eq!(tails.cut, whole.cut, "{pattern:?} at {fed}");
            }
        }
        let body = format!(
            r#"{{"text":"{}","usage":{{"total_tokens":40}}}}"#,
            "x".repeat(3 * WINDOW)
        );
        let mut r = new(Some(b"application/json"), "usage.total_tokens").unwrap();
        let (skipped, _) = Look::Tail.part(body.len());
        r.feed(Chunk {
            skipped,
            bytes: &body.as_bytes()[skipped..],
        });
        assert_eq!(r.finish(), Ok(40));
        let mut r = new(Some(b"text/event-stream"), "u").unwrap();
        assert_eq!(r.look(), Look::Whole);
        assert_eq!(Look::Whole.part(3 * WINDOW), (0, 3 * WINDOW));
        r.feed(Chunk {
            skipped: 1,
            bytes: b"data: {\"u\":5}\n\n",
        });
        assert_eq!(r.finish(), Err(Unreadable::TooLarge));
        assert_eq!(Look::Tail.and(Look::Whole), Look::Whole);
        assert_eq!(Look::Tail.and(Look::Tail), Look::Tail);
    }

    /// A key that starts the tail may be the end of a longer key whose backslash was cut off
    /// (`"x\"usage"`): it is not read.
    #[test]
    fn a_key_at_the_very_start_of_the_tail_is_not_taken() {
        let pad = "x".repeat(WINDOW);
        let body = format!(
            r#"{{"usage":{{"total_tokens":40}},"text":"{pad}","meta":{{"x\"usage":{{"total_tokens":0}}}}}}"#
        );
        let start = body.find(r#"\"usage""#).unwrap() + 1;
        let total = start + WINDOW;
        // Pad the end so that the tail starts right after the backslash.
        let body = format!("{body}{}", " ".repeat(total - body.len()));
        assert_eq!(&body[body.len() - WINDOW..][..7], r#""usage""#);
        assert_eq!(
            read("application/json", &[body.as_bytes()], "usage.total_tokens"),
            Err(Unreadable::TooLarge)
        );
    }

    #[test]
    fn the_last_event_that_carries_the_field_wins() {
        let stream = b"data: {\"choices\":[{\"delta\":\"hi\"}]}\n\n\
            data: {\"usage\":{\"total_tokens\":7}}\n\n\
            data: {\"choices\":[]}\n\n\
            data: {\"usage\":{\"total_tokens\":40}}\n\n\
            data: [DONE]\n\n";
        for size in [1, 3, 17, stream.len()] {
            let chunks: Vec<&[u8]> = stream.chunks(size).collect();
            assert_eq!(
                read("text/event-stream", &chunks, "usage.total_tokens"),
                Ok(40),
                "{size}"
            );
        }
        // A line longer than the window is skipped, not kept.
        let long = format!("data: {}\n", "x".repeat(WINDOW * 2));
        let mut r = new(Some(b"text/event-stream"), "u").unwrap();
        r.feed(Chunk::whole(long.as_bytes()));
        r.feed(Chunk::whole(b"data: {\"u\":5}"));
        assert_eq!(r.finish(), Ok(5), "the last event needs no newline");
        // A line that grows to the window in small chunks reserves no more than the window.
        let mut r = new(Some(b"text/event-stream"), "u").unwrap();
        let line = format!(
            "data: {{\"u\":7,\"pad\":\"{}\"}}\n",
            "x".repeat(WINDOW - 23)
        );
        assert_eq!(line.len(), WINDOW);
        let (text, newline) = line.as_bytes().split_at(WINDOW - 1);
        for piece in text.chunks(1000) {
            r.feed(Chunk::whole(piece));
            assert!(r.window.capacity() <= WINDOW);
        }
        assert_eq!(r.window.len(), WINDOW - 1, "kept whole");
        r.feed(Chunk::whole(newline));
        assert_eq!(r.finish(), Ok(7));
    }

    #[test]
    fn a_stream_without_a_usage_event_is_missing_or_too_large() {
        let plain = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(
            read("text/event-stream", &[plain], "usage.total_tokens"),
            Err(Unreadable::Missing)
        );
        // The usage in a line longer than the window: skipped, so too large.
        let long = format!(
            "data: {{\"pad\":\"{}\",\"usage\":{{\"total_tokens\":40}}}}\n\n",
            "x".repeat(WINDOW)
        );
        assert_eq!(
            read(
                "text/event-stream",
                &[long.as_bytes()],
                "usage.total_tokens"
            ),
            Err(Unreadable::TooLarge)
        );
        // After a usage event, a line too long to read may carry a later one: too large, also
        // for a client gone before the end.
        let mut r = new(Some(b"text/event-stream"), "usage.total_tokens").unwrap();
        r.feed(Chunk::whole(b"data: {\"usage\":{\"total_tokens\":1}}\n\n"));
        r.feed(Chunk::whole(long.as_bytes()));
        assert_eq!(r.seen(), Some(Err(Unreadable::TooLarge)));
        assert_eq!(r.finish(), Err(Unreadable::TooLarge));
        // Cut at the very end, with no newline after it: too large as well.
        assert_eq!(
            read(
                "text/event-stream",
                &[&long.as_bytes()[..WINDOW + 10]],
                "usage.total_tokens"
            ),
            Err(Unreadable::TooLarge)
        );
    }

    #[test]
    fn what_a_stream_showed_before_it_was_cut_off() {
        let mut r = reader("text/event-stream", &[b"data: {\"u\":1}\n\n"], "u");
        assert_eq!(r.seen(), Some(Ok(1)));
        r.feed(Chunk::whole(b"data: {\"u\":40}\n\ndata: {\"u\""));
        assert_eq!(r.seen(), Some(Ok(40)), "the last complete event");
        let r = reader("text/event-stream", &[b"data: {\"choices\":[]}\n"], "u");
        assert_eq!(r.seen(), None);
    }

    #[test]
    fn only_identity_is_not_encoded() {
        struct Headers(&'static [(&'static str, &'static str)]);
        impl RequestView for Headers {
            fn header(&self, name: &str) -> Option<std::borrow::Cow<'_, [u8]>> {
                self.0
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| std::borrow::Cow::Borrowed(v.as_bytes()))
            }
            fn client_ip(&self) -> Option<Vec<u8>> {
                None
            }
        }
        assert!(!encoded(&Headers(&[])));
        assert!(!encoded(&Headers(&[("content-encoding", "identity")])));
        assert!(!encoded(&Headers(&[("content-encoding", " Identity ")])));
        assert!(!encoded(&Headers(&[("content-encoding", "")])));
        assert!(encoded(&Headers(&[("content-encoding", "gzip")])));
        assert!(encoded(&Headers(&[("content-encoding", "br")])));
        assert!(encoded(&Headers(&[("content-encoding", "identity, gzip")])));
    }

    /// A usage header given twice, however spelled, is charged as invalid (the worst case): a
    /// low line put before the upstream's is never the one read.
    #[test]
    fn a_usage_header_on_two_lines_is_invalid() {
        struct Lined(&'static [(&'static str, &'static str)]);
        impl RequestView for Lined {
            fn header(&self, _: &str) -> Option<std::borrow::Cow<'_, [u8]>> {
                unreachable!("usage is read by its lines")
            }
            fn header_lines(&self, name: &str) -> crate::rule::Lines<'_> {
                let mut lines = crate::rule::Lines::None;
                for (n, v) in self.0 {
                    if reading::is_header_name(n.as_bytes(), name) {
                        lines.push(std::borrow::Cow::Borrowed(v.as_bytes()));
                    }
                }
                lines
            }
            fn client_ip(&self) -> Option<Vec<u8>> {
                None
            }
        }
        let usage = |lines| from_headers(&Lined(lines), "x-usage");
        assert_eq!(
            usage(&[("x-usage", "1"), ("x-usage", "4000")]),
            Some(Err(Unreadable::Invalid))
        );
        assert_eq!(
            usage(&[("X-Usage", "1"), ("x_usage", "4000")]),
            Some(Err(Unreadable::Invalid))
        );
        assert_eq!(
            usage(&[("x-usage", "4000"), ("x-usage", "4000")]),
            Some(Err(Unreadable::Invalid))
        );
        assert_eq!(
            usage(&[("x-usage", "4000"), ("x-other", "1")]),
            Some(Ok(4000))
        );
        assert_eq!(usage(&[("x-other", "1")]), None);
    }

    #[test]
    fn each_reason_has_its_counter() {
        use Unreadable::*;
        for (why, counter) in [
            (Invalid, Counter::UsageInvalid),
            (Body, Counter::UsageInvalid),
            (Missing, Counter::UsageMissing),
            (Encoded, Counter::UsageEncoded),
            (TooLarge, Counter::UsageTooLarge),
            (Unfinished, Counter::UsageUnfinished),
            (ReadersFull, Counter::UsageReadersFull),
        ] {
            assert_eq!(why.counter(), counter);
        }
    }
}
