//! The `log` crate's records, and a panic's message, go to the host's log; the host's level
//! becomes `log`'s filter.
//!
//! Invariant: logging never panics and never fails a caller (a refused `proxy_log` is dropped);
//! nothing is formatted for a level the host would not show.

use crate::LogLevel;

/// The `log` crate's records go to the host's log (nothing is formatted above `log`'s max level).
struct HostLogger;

static LOGGER: HostLogger = HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let _ = crate::log(level_of(record.level()), &record.args().to_string());
    }

    fn flush(&self) {}
}

/// The host's level for a `log` record.
fn level_of(level: log::Level) -> LogLevel {
    match level {
        log::Level::Trace => LogLevel::Trace,
        log::Level::Debug => LogLevel::Debug,
        log::Level::Info => LogLevel::Info,
        log::Level::Warn => LogLevel::Warn,
        log::Level::Error => LogLevel::Error,
    }
}

/// `log`'s filter for the host's level: what the host shows and nothing more (`log` has no
/// critical: errors; `off` and a level this module does not know turn logging off).
pub fn filter_for(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::Trace => log::LevelFilter::Trace,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Error | LogLevel::Critical => log::LevelFilter::Error,
        LogLevel::Off | LogLevel::Unknown(_) => log::LevelFilter::Off,
    }
}

/// `log`'s filter for the host's current level (info if the host will not say).
pub fn log_filter() -> log::LevelFilter {
    crate::log_level().map_or(log::LevelFilter::Info, filter_for)
}

/// Sends `log` records to the host, and a panic's message too (before the VM aborts).
pub fn install_logger() {
    if log::set_logger(&LOGGER).is_ok() {
        std::panic::set_hook(Box::new(|info| {
            let _ = crate::log(LogLevel::Critical, &info.to_string());
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_shows_what_the_host_shows() {
        let cases = [
            (LogLevel::Trace, log::LevelFilter::Trace),
            (LogLevel::Debug, log::LevelFilter::Debug),
            (LogLevel::Info, log::LevelFilter::Info),
            (LogLevel::Warn, log::LevelFilter::Warn),
            (LogLevel::Error, log::LevelFilter::Error),
            (LogLevel::Critical, log::LevelFilter::Error),
            (LogLevel::Off, log::LevelFilter::Off),
            (LogLevel::Unknown(7), log::LevelFilter::Off),
        ];
        for (host, want) in cases {
            assert_eq!(filter_for(host), want, "{host:?}");
        }
    }

    #[test]
    fn a_record_goes_out_at_its_own_level_and_passes_the_filter_for_it() {
        for level in [
            log::Level::Trace,
            log::Level::Debug,
            log::Level::Info,
            log::Level::Warn,
            log::Level::Error,
        ] {
            let host = level_of(level);
            assert_eq!(format!("{host:?}"), format!("{level:?}"));
            assert!(
                level <= filter_for(host),
                "{level} filtered out at its own level"
            );
        }
    }
}
