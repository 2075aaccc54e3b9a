//! The hand-written ABI pinned to the proxy-wasm SDK's `types` (a dev-dependency: nothing of the
//! SDK reaches the .wasm), and Higress' extensions to envoy/higress/ABI.md, so neither can drift.
//!
//! Invariant: every variant of this crate's enums is matched here exhaustively (a new one does not
//! compile until it is pinned), and each has the SDK's number for the SDK's variant of that name.

use crate::higress::RedisStatus;
use crate::{Action, BufferType, LogLevel, MapType, MetricType, Status, StreamType};
use proxy_wasm::types as sdk;

/// The SDK's status of the same name; None for those the SDK does not name (pinned to the ABI's
/// header below).
fn sdk_status(s: Status) -> Option<sdk::Status> {
    match s {
        Status::NotFound => Some(sdk::Status::NotFound),
        Status::BadArgument => Some(sdk::Status::BadArgument),
        Status::SerializationFailure => Some(sdk::Status::SerializationFailure),
        Status::ParseFailure => Some(sdk::Status::ParseFailure),
        Status::Empty => Some(sdk::Status::Empty),
        Status::CasMismatch => Some(sdk::Status::CasMismatch),
        Status::InternalFailure => Some(sdk::Status::InternalFailure),
        Status::BadExpression
        | Status::InvalidMemoryAccess
        | Status::ResultMismatch
        | Status::BrokenConnection
        | Status::Unimplemented
        | Status::Unknown(_) => None,
    }
}

#[test]
fn statuses_are_the_sdks() {
    assert_eq!(Status::check(sdk::Status::Ok as u32), Ok(()));
    let mut pinned = 0;
    for ours in Status::KNOWN {
        if let Some(theirs) = sdk_status(ours) {
            assert_eq!(ours.raw(), theirs as u32, "{ours:?}");
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
            assert_eq!(Status::check(theirs as u32), Err(ours));
            pinned += 1;
        }
    }
    assert_eq!(pinned, 7, "every status the SDK 0.2 names but Ok");
}

/// The statuses the SDK does not name, as proxy-wasm-cpp-host's `proxy_wasm_common.h` numbers
/// them (`WasmResult`); Higress answers InvalidMemoryAccess (envoy/higress/ABI.md).
#[test]
fn the_other_statuses_are_the_hosts() {
    let host = [
        (Status::BadExpression, 5),
        (Status::InvalidMemoryAccess, 6),
        (Status::ResultMismatch, 9),
        (Status::BrokenConnection, 11),
        (Status::Unimplemented, 12),
    ];
    for (ours, n) in host {
        assert_eq!(sdk_status(ours), None);
        assert_eq!(ours.raw(), n, "{ours:?}");
    }
}

#[test]
fn map_types_are_the_sdks() {
    let all = [
        MapType::HttpRequestHeaders,
        MapType::HttpRequestTrailers,
        MapType::HttpResponseHeaders,
        MapType::HttpResponseTrailers,
        MapType::GrpcReceiveInitialMetadata,
        MapType::GrpcReceiveTrailingMetadata,
        MapType::HttpCallResponseHeaders,
        MapType::HttpCallResponseTrailers,
    ];
    for ours in all {
        let theirs = match ours {
            MapType::HttpRequestHeaders => sdk::MapType::HttpRequestHeaders,
            MapType::HttpRequestTrailers => sdk::MapType::HttpRequestTrailers,
            MapType::HttpResponseHeaders => sdk::MapType::HttpResponseHeaders,
            MapType::HttpResponseTrailers => sdk::MapType::HttpResponseTrailers,
            MapType::GrpcReceiveInitialMetadata => sdk::MapType::GrpcReceiveInitialMetadata,
            MapType::GrpcReceiveTrailingMetadata => sdk::MapType::GrpcReceiveTrailingMetadata,
            MapType::HttpCallResponseHeaders => sdk::MapType::HttpCallResponseHeaders,
            MapType::HttpCallResponseTrailers => sdk::MapType::HttpCallResponseTrailers,
        };
        assert_eq!(ours as u32, theirs as u32, "{ours:?}");
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
    }
}

#[test]
fn buffer_types_are_the_sdks() {
    let all = [
        BufferType::HttpRequestBody,
        BufferType::HttpResponseBody,
        BufferType::DownstreamData,
        BufferType::UpstreamData,
        BufferType::HttpCallResponseBody,
        BufferType::GrpcReceiveBuffer,
        BufferType::VmConfiguration,
        BufferType::PluginConfiguration,
        BufferType::CallData,
        BufferType::RedisCallResponse,
    ];
    let mut pinned = 0;
    for ours in all {
        let theirs = match ours {
            BufferType::HttpRequestBody => sdk::BufferType::HttpRequestBody,
            BufferType::HttpResponseBody => sdk::BufferType::HttpResponseBody,
            BufferType::DownstreamData => sdk::BufferType::DownstreamData,
            BufferType::UpstreamData => sdk::BufferType::UpstreamData,
            BufferType::HttpCallResponseBody => sdk::BufferType::HttpCallResponseBody,
            BufferType::GrpcReceiveBuffer => sdk::BufferType::GrpcReceiveBuffer,
            BufferType::VmConfiguration => sdk::BufferType::VmConfiguration,
            BufferType::PluginConfiguration => sdk::BufferType::PluginConfiguration,
            BufferType::CallData => sdk::BufferType::CallData,
            // Higress' own: pinned to its ABI document below.
            BufferType::RedisCallResponse => continue,
        };
        assert_eq!(ours as u32, theirs as u32, "{ours:?}");
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
        pinned += 1;
    }
    assert_eq!(pinned, all.len() - 1);
}

#[test]
fn stream_types_are_the_sdks() {
    let all = [
        StreamType::HttpRequest,
        StreamType::HttpResponse,
        StreamType::Downstream,
        StreamType::Upstream,
    ];
    for ours in all {
        let theirs = match ours {
            StreamType::HttpRequest => sdk::StreamType::HttpRequest,
            StreamType::HttpResponse => sdk::StreamType::HttpResponse,
            StreamType::Downstream => sdk::StreamType::Downstream,
            StreamType::Upstream => sdk::StreamType::Upstream,
        };
        assert_eq!(ours as u32, theirs as u32, "{ours:?}");
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
    }
}

#[test]
fn metric_types_are_the_sdks() {
    for ours in [
        MetricType::Counter,
        MetricType::Gauge,
        MetricType::Histogram,
    ] {
        let theirs = match ours {
            MetricType::Counter => sdk::MetricType::Counter,
            MetricType::Gauge => sdk::MetricType::Gauge,
            MetricType::Histogram => sdk::MetricType::Histogram,
        };
        assert_eq!(ours as u32, theirs as u32, "{ours:?}");
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
    }
}

#[test]
fn actions_are_the_sdks() {
    for ours in [Action::Continue, Action::Pause] {
        let theirs = match ours {
            Action::Continue => sdk::Action::Continue,
            Action::Pause => sdk::Action::Pause,
        };
        assert_eq!(ours as u32, theirs as u32, "{ours:?}");
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
    }
}

#[test]
fn log_levels_are_the_sdks() {
    let mut pinned = 0;
    for ours in LogLevel::KNOWN {
        let theirs = match ours {
            LogLevel::Trace => sdk::LogLevel::Trace,
            LogLevel::Debug => sdk::LogLevel::Debug,
            LogLevel::Info => sdk::LogLevel::Info,
            LogLevel::Warn => sdk::LogLevel::Warn,
            LogLevel::Error => sdk::LogLevel::Error,
            LogLevel::Critical => sdk::LogLevel::Critical,
            // Envoy's "off" (spdlog's level after critical); the SDK never receives a level.
            LogLevel::Off => {
                assert_eq!(ours.raw(), sdk::LogLevel::Critical as u32 + 1);
                continue;
            }
            LogLevel::Unknown(_) => continue,
        };
        assert_eq!(ours.raw(), theirs as u32, "{ours:?}");
        assert_eq!(LogLevel::from_raw(theirs as u32), ours);
        pinned += 1;
    }
    assert_eq!(pinned, 6);
}

/// Higress' numbers, as envoy/higress/ABI.md states them from Higress' sources.
#[test]
fn higress_extensions_are_its_abi_documents() {
    let doc = include_str!("../../../envoy/higress/ABI.md");
    let says = |fact: String| assert!(doc.contains(&fact), "ABI.md does not say {fact:?}");
    says(format!(
        "`RedisStatus`: **Ok = {}, NetworkError = {}**",
        RedisStatus::Ok.raw(),
        RedisStatus::NetworkError.raw()
    ));
    says(format!(
        "`RedisCallResponse = {}`",
        BufferType::RedisCallResponse as u32
    ));
    says(format!("BadArgument ({})", Status::BadArgument.raw()));
    says(format!(
        "InternalFailure ({})",
        Status::InternalFailure.raw()
    ));
    says(format!(
        "InvalidMemoryAccess ({})",
        Status::InvalidMemoryAccess.raw()
    ));
}
