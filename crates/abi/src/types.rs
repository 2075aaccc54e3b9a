//! The ABI's enumerations: the statuses the host answers with, and the map, buffer, stream,
//! metric and log-level numbers the module names things by, as the proxy-wasm ABI 0.2.1 defines
//! them (Higress' extensions marked as such).
//!
//! Invariant: a number the host hands the module (a status, a log level) always decodes, to a
//! variant or to `Unknown(n)`, never to a panic; a number the module hands the host is the
//! discriminant of a closed `#[repr(u32)]` enum, so no other number can be sent. Every
//! discriminant is pinned to the proxy-wasm SDK's `types` (or, for Higress' extensions, to
//! envoy/higress/ABI.md) by the tests in `pinned.rs`.

/// A host call that did not succeed: the `WasmResult` it answered, other than `Ok`. Numbers from
/// proxy-wasm-cpp-host's `proxy_wasm_common.h`; the SDK names the subset it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The key, queue or attribute does not exist.
    NotFound,
    /// An argument is out of range: an unknown cluster, a missing pseudo-header, a context gone.
    BadArgument,
    SerializationFailure,
    ParseFailure,
    BadExpression,
    InvalidMemoryAccess,
    /// Nothing to take (an empty shared queue).
    Empty,
    /// Shared data changed since it was read (a compare-and-swap lost).
    CasMismatch,
    ResultMismatch,
    InternalFailure,
    BrokenConnection,
    Unimplemented,
    /// A status this module does not know (never 0, which is `Ok`, nor a known one).
    Unknown(u32),
}

/// `WasmResult::Ok`.
const OK: u32 = 0;

/// The parent `proxy_on_context_create` names for a root context (a plugin configuration's):
/// HTTP contexts name their root.
pub const NO_PARENT: u32 = 0;

impl Status {
    /// Every known status, for the tests that pin them.
    pub const KNOWN: [Status; 12] = [
        Status::NotFound,
        Status::BadArgument,
        Status::SerializationFailure,
        Status::ParseFailure,
        Status::BadExpression,
        Status::InvalidMemoryAccess,
        Status::Empty,
        Status::CasMismatch,
        Status::ResultMismatch,
        Status::InternalFailure,
        Status::BrokenConnection,
        Status::Unimplemented,
    ];

    /// A host call's result: `Ok` for `WasmResult::Ok`, the status otherwise.
    #[inline]
    pub fn check(raw: u32) -> Result<(), Status> {
        if raw == OK {
            return Ok(());
        }
        Err(Status::failed(raw))
    }

    /// A status other than Ok. Out of line: every host call checks its status, and most succeed.
    #[cold]
    #[inline(never)]
    fn failed(raw: u32) -> Status {
        match raw {
            1 => Status::NotFound,
            2 => Status::BadArgument,
            3 => Status::SerializationFailure,
            4 => Status::ParseFailure,
            5 => Status::BadExpression,
            6 => Status::InvalidMemoryAccess,
            7 => Status::Empty,
            8 => Status::CasMismatch,
            9 => Status::ResultMismatch,
            10 => Status::InternalFailure,
            11 => Status::BrokenConnection,
            12 => Status::Unimplemented,
            other => Status::Unknown(other),
        }
    }

    /// The number the host used.
    pub fn raw(self) -> u32 {
        match self {
            Status::NotFound => 1,
            Status::BadArgument => 2,
            Status::SerializationFailure => 3,
            Status::ParseFailure => 4,
            Status::BadExpression => 5,
            Status::InvalidMemoryAccess => 6,
            Status::Empty => 7,
            Status::CasMismatch => 8,
            Status::ResultMismatch => 9,
            Status::InternalFailure => 10,
            Status::BrokenConnection => 11,
            Status::Unimplemented => 12,
            Status::Unknown(n) => n,
        }
    }
}

impl Status {
    /// The status' name in proxy-wasm's headers; None for an unknown one.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Status::NotFound => "NotFound",
            Status::BadArgument => "BadArgument",
            Status::SerializationFailure => "SerializationFailure",
            Status::ParseFailure => "ParseFailure",
            Status::BadExpression => "BadExpression",
            Status::InvalidMemoryAccess => "InvalidMemoryAccess",
            Status::Empty => "Empty",
            Status::CasMismatch => "CasMismatch",
            Status::ResultMismatch => "ResultMismatch",
            Status::InternalFailure => "InternalFailure",
            Status::BrokenConnection => "BrokenConnection",
            Status::Unimplemented => "Unimplemented",
            Status::Unknown(_) => return None,
        })
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "status {}", self.raw()),
        }
    }
}

/// A header map of the current stream or callout (`WasmHeaderMapType`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapType {
    HttpRequestHeaders = 0,
    HttpRequestTrailers = 1,
    HttpResponseHeaders = 2,
    HttpResponseTrailers = 3,
    GrpcReceiveInitialMetadata = 4,
    GrpcReceiveTrailingMetadata = 5,
    HttpCallResponseHeaders = 6,
    HttpCallResponseTrailers = 7,
}

/// A buffer the host holds (`WasmBufferType`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferType {
    HttpRequestBody = 0,
    HttpResponseBody = 1,
    DownstreamData = 2,
    UpstreamData = 3,
    HttpCallResponseBody = 4,
    GrpcReceiveBuffer = 5,
    VmConfiguration = 6,
    PluginConfiguration = 7,
    CallData = 8,
    /// Higress: the reply of a Redis callout, during `proxy_on_redis_call_response`.
    RedisCallResponse = 9,
}

/// The stream `proxy_continue_stream` resumes (`WasmStreamType`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamType {
    HttpRequest = 0,
    HttpResponse = 1,
    Downstream = 2,
    Upstream = 3,
}

/// A custom metric's kind (`MetricType`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// What a stream callback tells the host (`FilterHeadersStatus` and friends): an export returns
/// it as the u32 it is.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Continue = 0,
    Pause = 1,
}

/// A log level: what `proxy_log` is given, and what `proxy_get_log_level` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
    /// Envoy's level when its wasm logger is off (spdlog's `off`; not in the SDK).
    Off,
    /// A level this module does not know.
    Unknown(u32),
}

impl LogLevel {
    /// Every known level, for the tests that pin them.
    pub const KNOWN: [LogLevel; 7] = [
        LogLevel::Trace,
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Warn,
        LogLevel::Error,
        LogLevel::Critical,
        LogLevel::Off,
    ];

    pub fn from_raw(raw: u32) -> LogLevel {
        match raw {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            6 => LogLevel::Off,
            other => LogLevel::Unknown(other),
        }
    }

    pub fn raw(self) -> u32 {
        match self {
            LogLevel::Trace => 0,
            LogLevel::Debug => 1,
            LogLevel::Info => 2,
            LogLevel::Warn => 3,
            LogLevel::Error => 4,
            LogLevel::Critical => 5,
            LogLevel::Off => 6,
            LogLevel::Unknown(n) => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_decode_and_encode_alike() {
        assert_eq!(Status::check(0), Ok(()));
        for raw in 1..=64 {
            let status = Status::check(raw).unwrap_err();
            assert_eq!(status.raw(), raw);
            assert_eq!(
                Status::KNOWN.contains(&status),
                !matches!(status, Status::Unknown(_)),
                "{status:?}"
            );
        }
        assert_eq!(Status::check(u32::MAX), Err(Status::Unknown(u32::MAX)));
        for s in Status::KNOWN {
            assert_eq!(Status::check(s.raw()), Err(s));
        }
    }

    #[test]
    fn statuses_read_well_in_a_log_line() {
        for s in Status::KNOWN {
            assert_eq!(s.to_string(), format!("{s:?}"));
        }
        assert_eq!(Status::BadArgument.to_string(), "BadArgument");
        assert_eq!(Status::Unknown(99).to_string(), "status 99");
    }

    #[test]
    fn log_levels_decode_and_encode_alike() {
        for raw in 0..=64 {
            let level = LogLevel::from_raw(raw);
            assert_eq!(level.raw(), raw);
            assert_eq!(
                LogLevel::KNOWN.contains(&level),
                !matches!(level, LogLevel::Unknown(_))
            );
        }
    }
}
