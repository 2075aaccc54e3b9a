//! Higress' Redis callouts (envoy/higress/ABI.md): configure a worker's Redis client, send it a
//! RESP command, read the reply during `proxy_on_redis_call_response`.
//!
//! Invariant: as every wrapper here, none panics and each returns a typed result. Only the Higress
//! artifact calls these: the Envoy artifact must not import them (stock Envoy refuses a module with
//! imports it does not have), and a function nothing calls is not imported.

use crate::imports as raw;
use crate::{BufferType, Status};

/// The status `proxy_on_redis_call_response` reports (Higress' `RedisStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RedisStatus {
    /// Redis replied (an error reply too); the reply is in [`BufferType::RedisCallResponse`].
    Ok,
    /// No reply: connection refused or closed, connect or op timeout, protocol error.
    NetworkError,
    /// A status this module does not know: no reply either.
    Unknown(u32),
}

impl RedisStatus {
    pub fn from_raw(raw: u32) -> RedisStatus {
        match raw {
            0 => RedisStatus::Ok,
            1 => RedisStatus::NetworkError,
            other => RedisStatus::Unknown(other),
        }
    }

    pub fn raw(self) -> u32 {
        match self {
            RedisStatus::Ok => 0,
            RedisStatus::NetworkError => 1,
            RedisStatus::Unknown(n) => n,
        }
    }

    /// Whether the callback carries a reply.
    pub fn replied(self) -> bool {
        self == RedisStatus::Ok
    }
}

/// Configures this worker's Redis client for `target` (the cluster, then `?` and Higress'
/// parameters); it does not connect. BadArgument: the cluster is not known to this worker (yet).
pub fn redis_init(
    target: &str,
    username: &str,
    password: &str,
    timeout_ms: u32,
) -> Result<(), Status> {
    // SAFETY: pointer/length pairs of live strings; the host copies them.
    Status::check(unsafe {
        raw::proxy_redis_init(
            target.as_ptr(),
            target.len(),
            username.as_ptr(),
            username.len(),
            password.as_ptr(),
            password.len(),
            timeout_ms,
        )
    })
}

/// Sends one RESP command on this worker's connection to `cluster`; the token its reply will come
/// with (on the root context). BadArgument: unknown cluster; InternalFailure: no Redis host.
pub fn redis_call(cluster: &str, query: &[u8]) -> Result<u32, Status> {
    let mut token = 0u32;
    // SAFETY: pointer/length pairs of live buffers; the host writes one u32 to `token`.
    Status::check(unsafe {
        raw::proxy_redis_call(
            cluster.as_ptr(),
            cluster.len(),
            query.as_ptr(),
            query.len(),
            &mut token,
        )
    })?;
    Ok(token)
}

/// The first `size` bytes of the Redis reply being delivered.
pub fn redis_reply(size: usize) -> Result<Vec<u8>, Status> {
    crate::buffer(BufferType::RedisCallResponse, 0, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_statuses_decode_and_encode_alike() {
        for raw in 0..=64 {
            assert_eq!(RedisStatus::from_raw(raw).raw(), raw);
        }
        assert!(RedisStatus::Ok.replied());
        assert!(!RedisStatus::NetworkError.replied());
        assert!(!RedisStatus::Unknown(7).replied());
    }
}
