//! Renames one export of a Wasm module in a copy of its bytes, leaving every other byte as it was:
//! the bench's way to run the very build it measures without one callback. Envoy (proxy-wasm-cpp-host)
//! looks each callback up by name and never calls one the module does not export, so a name Envoy
//! does not know (`proxy_on_response_bodx`) is as good as no export, with the same code, data and
//! layout. The new name has the old one's length, so no section size changes; only the export
//! section is read and written, so the same text elsewhere (a data segment, a custom section) stays.

use std::fmt;

/// Why an export could not be renamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportError {
    /// No `\0asm` version 1 header.
    NotWasm,
    /// A section or export runs past the end of the module, or a number does not fit in 32 bits.
    Malformed,
    /// The module exports nothing by that name.
    NotFound(String),
    /// The module already exports the new name.
    Taken(String),
    /// The new name is not as long as the old one.
    LengthDiffers { from: String, to: String },
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::NotWasm => write!(f, "not a Wasm module (version 1)"),
            ExportError::Malformed => write!(f, "malformed Wasm module"),
            ExportError::NotFound(name) => write!(f, "the module exports no {name}"),
            ExportError::Taken(name) => write!(f, "the module already exports {name}"),
            ExportError::LengthDiffers { from, to } => {
                write!(f, "{to} is not as long as {from}")
            }
        }
    }
}

const HEADER: [u8; 8] = *b"\0asm\x01\0\0\0";
const EXPORT_SECTION: u8 = 7;

/// One export: its name's place in the module, and the name.
struct Export {
    at: usize,
    name: Vec<u8>,
}

/// Reads the module's bytes from a position onwards.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, ExportError> {
        let b = *self.bytes.get(self.at).ok_or(ExportError::Malformed)?;
        self.at += 1;
        Ok(b)
    }

    /// An unsigned LEB128 number of at most 32 bits (5 bytes).
    fn u32(&mut self) -> Result<u32, ExportError> {
        let mut value: u64 = 0;
        for shift in (0..35).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return u32::try_from(value).map_err(|_| ExportError::Malformed);
            }
        }
        Err(ExportError::Malformed)
    }

    /// Skips `n` bytes, returning where they start.
    fn skip(&mut self, n: u32) -> Result<usize, ExportError> {
        let start = self.at;
        let n = usize::try_from(n).map_err(|_| ExportError::Malformed)?;
        let end = start.checked_add(n).ok_or(ExportError::Malformed)?;
        if end > self.bytes.len() {
            return Err(ExportError::Malformed);
        }
        self.at = end;
        Ok(start)
    }
}

/// Every export of the module, in order.
fn exports(module: &[u8]) -> Result<Vec<Export>, ExportError> {
    if module.get(..HEADER.len()) != Some(&HEADER[..]) {
        return Err(ExportError::NotWasm);
    }
    let mut r = Reader {
        bytes: module,
        at: HEADER.len(),
    };
    let mut out = Vec::new();
    while r.at < module.len() {
        let id = r.byte()?;
        let size = r.u32()?;
        let start = r.skip(size)?;
        if id != EXPORT_SECTION {
            continue;
        }
        let section = module.get(start..r.at).ok_or(ExportError::Malformed)?;
        let mut s = Reader {
            bytes: section,
            at: 0,
        };
        for _ in 0..s.u32()? {
            let len = s.u32()?;
            let at = s.skip(len)?;
            let name = section.get(at..s.at).ok_or(ExportError::Malformed)?;
            out.push(Export {
                at: start + at,
                name: name.to_vec(),
            });
            let _kind = s.byte()?;
            let _index = s.u32()?;
        }
        if s.at != section.len() {
            return Err(ExportError::Malformed);
        }
    }
    Ok(out)
}

/// The names the module exports, in order (names that are not UTF-8 shown lossily).
pub fn export_names(module: &[u8]) -> Result<Vec<String>, ExportError> {
    Ok(exports(module)?
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect())
}

/// A copy of `module` whose export `from` is named `to` (as long as `from`); nothing else changes.
pub fn rename_export(module: &[u8], from: &str, to: &str) -> Result<Vec<u8>, ExportError> {
    if from.len() != to.len() {
        return Err(ExportError::LengthDiffers {
            from: from.into(),
            to: to.into(),
        });
    }
    let all = exports(module)?;
    if all.iter().any(|e| e.name == to.as_bytes()) {
        return Err(ExportError::Taken(to.into()));
    }
    let found = all
        .iter()
        .find(|e| e.name == from.as_bytes())
        .ok_or_else(|| ExportError::NotFound(from.into()))?;
    let mut out = module.to_vec();
    let name = out
        .get_mut(found.at..found.at + to.len())
        .ok_or(ExportError::Malformed)?;
    name.copy_from_slice(to.as_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "proxy_on_response_body";
    const RENAMED: &str = "proxy_on_response_bodx";

    fn section(id: u8, payload: &[u8]) -> Vec<u8> {
        assert!(payload.len() < 128, "one-byte sizes only");
        let mut s = vec![id, payload.len() as u8];
        s.extend_from_slice(payload);
        s
    }

    fn name(text: &str) -> Vec<u8> {
        let mut n = vec![text.len() as u8];
        n.extend_from_slice(text.as_bytes());
        n
    }

    /// A valid module of one function `() -> ()`, exported as each of `names`, with a custom
    /// section holding the body callback's name as data.
    fn module(names: &[&str]) -> Vec<u8> {
        let mut m = HEADER.to_vec();
        m.extend(section(1, &[1, 0x60, 0, 0]));
        m.extend(section(3, &[1, 0]));
        let mut exports = vec![names.len() as u8];
        for n in names {
            exports.extend(name(n));
            exports.extend([0, 0]);
        }
        m.extend(section(EXPORT_SECTION, &exports));
        m.extend(section(10, &[1, 2, 0, 0x0b]));
        let mut custom = name("note");
        custom.extend_from_slice(BODY.as_bytes());
        m.extend(section(0, &custom));
        m
    }

    #[test]
    fn renames_only_the_export_and_nothing_else() {
        let before = module(&["proxy_on_request_headers", BODY]);
        let after = rename_export(&before, BODY, RENAMED).unwrap();
        assert_eq!(
            export_names(&after).unwrap(),
            ["proxy_on_request_headers", RENAMED]
        );
        assert_eq!(after.len(), before.len());
        let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 1, "one letter of one export's name");
        // The same text in the custom section is left alone.
        assert!(after.ends_with(BODY.as_bytes()));
    }

    #[test]
    fn refuses_what_it_cannot_rename_cleanly() {
        let m = module(&["proxy_on_request_headers"]);
        assert_eq!(
            rename_export(&m, BODY, RENAMED),
            Err(ExportError::NotFound(BODY.into()))
        );
        let both = module(&[BODY, RENAMED]);
        assert_eq!(
            rename_export(&both, BODY, RENAMED),
            Err(ExportError::Taken(RENAMED.into()))
        );
        assert!(matches!(
            rename_export(&m, BODY, "proxy_on_response_bod"),
            Err(ExportError::LengthDiffers { .. })
        ));
        assert_eq!(
            rename_export(b"\x7fELF\x02\x01\x01\0", BODY, RENAMED),
            Err(ExportError::NotWasm)
        );
    }

    #[test]
    fn a_cut_short_module_is_an_error_not_a_panic() {
        let m = module(&[BODY]);
        for len in HEADER.len()..m.len() {
            let cut = &m[..len];
            // Cut after a whole section, what is left is a valid prefix; anywhere else, malformed.
            match exports(cut) {
                Ok(_) | Err(ExportError::Malformed) => {}
                Err(e) => panic!("{len}: {e}"),
            }
        }
    }
}
