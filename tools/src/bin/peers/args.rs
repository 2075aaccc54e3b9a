//! `make peers`' command line: every option has a default, and a value that makes no sense (a zero
//! count, a `--compare-wasm` file that is not there) is refused before anything starts.

use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
usage: cargo run --release -p tollgate-tools --bin peers -- [options]   (make peers PEERS_ARGS='[options]')

  --rounds N          interleaved rounds; each figure is the median over them    (default 3)
  --duration SECS     length of each measured load, whole seconds                (default 5)
  --warmup SECS       unmeasured load on each fresh system before its load, whole
                      seconds; 0: none                                           (default 1)
  --connections N     wrk connections, one request in flight on each             (default 16)
  --one-key           every request the same x-user-id (default: every request a new one)
  --compare-wasm PATH adds tollgate-exact-b: tollgate-exact with the filter built at PATH
  --limitador PATH    the limitador-server binary (default: $LIMITADOR_SERVER, else PATH)

Without limitador-server it prints SKIPPED and why, and exits 0.
";

#[derive(Debug, Clone)]
pub struct Settings {
    pub rounds: u32,
    pub duration: Duration,
    pub warmup: Duration,
    pub connections: u32,
    /// Every request the same key, instead of a new one each.
    pub one_key: bool,
    /// The filter tollgate-exact-b runs (the system runs only with it).
    pub compare_wasm: Option<PathBuf>,
    /// `--limitador`, if given (else the environment and PATH decide).
    pub limitador: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rounds: 3,
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            connections: 16,
            one_key: false,
            compare_wasm: None,
            limitador: None,
        }
    }
}

/// Parses `args` (without the program name); Err("") for --help.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Settings, String> {
    let mut s = Settings::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        match flag.as_str() {
            "--help" | "-h" => return Err(String::new()),
            "--one-key" => {
                s.one_key = true;
                continue;
            }
            "--rounds" | "--duration" | "--warmup" | "--connections" | "--compare-wasm"
            | "--limitador" => {}
            _ => return Err(format!("unknown option {flag}")),
        }
        let value = match inline {
            Some(v) => v,
            None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
        };
        let count = |v: &str| -> Result<u32, String> {
            v.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag}: expected a positive integer, got {v:?}"))
        };
        // Whole seconds: wrk's -d takes no smaller unit.
        let secs = |v: &str, zero_ok: bool| -> Result<Duration, String> {
            v.trim_end_matches('s')
                .parse::<u64>()
                .ok()
                .filter(|x| (*x > 0 || zero_ok) && *x < 3600)
                .map(Duration::from_secs)
                .ok_or_else(|| format!("{flag}: expected whole seconds, got {v:?}"))
        };
        let file = |v: &str| -> Result<PathBuf, String> {
            let path = PathBuf::from(v);
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!("{flag}: no file at {}", path.display()))
            }
        };
        match flag.as_str() {
            "--rounds" => s.rounds = count(&value)?,
            "--duration" => s.duration = secs(&value, false)?,
            "--warmup" => s.warmup = secs(&value, true)?,
            "--connections" => s.connections = count(&value)?,
            "--compare-wasm" => s.compare_wasm = Some(file(&value)?),
            _ => s.limitador = Some(file(&value)?),
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &str) -> Result<Settings, String> {
        parse(args.split_whitespace().map(String::from))
    }

    #[test]
    fn defaults_options_and_refusals() {
        let d = parse_str("").unwrap_or_default();
        assert_eq!((d.rounds, d.connections, d.one_key), (3, 16, false));
        assert_eq!(d.duration, Duration::from_secs(5));
        let s = parse_str("--rounds 4 --duration=2s --warmup 0 --connections 8 --one-key")
            .unwrap_or_default();
        assert_eq!((s.rounds, s.connections, s.one_key), (4, 8, true));
        assert_eq!(s.duration, Duration::from_secs(2));
        assert!(s.warmup.is_zero());
        assert_eq!(parse_str("--help").err(), Some(String::new()));
        for bad in [
            "--rounds 0",
            "--duration 0",
            "--duration 2.5",
            "--connections x",
            "--compare-wasm /nonexistent/x.wasm",
            "--limitador /nonexistent/limitador-server",
            "--rounds",
            "--fast",
        ] {
            assert!(parse_str(bad).is_err(), "{bad}");
        }
    }
}
