//! This worker's Redis client, for a RESP backend: Higress' Redis callouts. Each worker has its own
//! client (Higress keeps one per worker and cluster), configured by its root context.
//!
//! Invariant: only the Higress artifact (feature `higress`) calls Higress' Redis functions; the
//! Envoy artifact must not import them (stock Envoy refuses a module with imports it does not
//! have), so there a Redis call is a dispatch error. Configure already refuses a RESP backend in
//! that artifact, naming the one to use, so the error is never reached. A client whose set-up the
//! host refused, whose cluster the host stopped knowing, or that Redis refused (a cluster defined
//! anew comes with a client of Higress' defaults) is set up again before the next call, and calls
//! fail (the failure mode) until it works.

use std::cell::RefCell;

use tollgate_abi::Status;
use tollgate_core::backend::{resp, BackendError};
use tollgate_core::config::Backend;

/// This worker's `proxy_redis_init` arguments, and whether the host took them.
struct Init {
    /// The cluster with Higress' parameters (`resp::redis_target`).
    target: String,
    username: String,
    password: String,
    timeout_ms: u32,
    ready: bool,
}

thread_local! {
    static INIT: RefCell<Option<Init>> = const { RefCell::new(None) };
}

// The one build switch of the Redis client: which functions send its calls.
#[cfg(not(feature = "higress"))]
use absent::{redis_call, redis_init};
#[cfg(feature = "higress")]
use tollgate_abi::higress::{redis_call, redis_init};

/// The Envoy artifact's stand-ins for Higress' functions, which it must not import.
#[cfg(not(feature = "higress"))]
mod absent {
    use tollgate_abi::Status;

    pub fn redis_init(_: &str, _: &str, _: &str, _: u32) -> Result<(), Status> {
        Err(Status::Unimplemented)
    }

    pub fn redis_call(_: &str, _: &[u8]) -> Result<u32, Status> {
        Err(Status::Unimplemented)
    }
}

fn init(i: &Init) -> Result<(), Status> {
    redis_init(&i.target, &i.username, &i.password, i.timeout_ms)
}

/// Configures this worker's Redis client for `backend`. Higress answers BadArgument while the
/// cluster is unknown to this worker (not yet pushed, or misspelt): then it is tried again before
/// each call.
pub fn configure(backend: &Backend) {
    let mut i = Init {
        target: resp::redis_target(&backend.cluster, backend.database),
        username: backend.username.clone().unwrap_or_default(),
        password: backend.password.clone().unwrap_or_default(),
        timeout_ms: u32::try_from(backend.timeout_ms).unwrap_or(u32::MAX),
        ready: false,
    };
    match init(&i) {
        Ok(()) => i.ready = true,
        Err(s) => log::warn!(
            "tollgate: proxy_redis_init for cluster \"{}\" answered {s}; retrying before each call",
            backend.cluster
        ),
    }
    INIT.with(|slot| *slot.borrow_mut() = Some(i));
}

/// Sends one RESP command on this worker's connection to `cluster`; the answer comes back as
/// `proxy_on_redis_call_response` on the root context.
pub fn call(cluster: &str, command: &[u8]) -> Result<u32, BackendError> {
    INIT.with(|slot| match slot.borrow_mut().as_mut() {
        Some(i) if i.ready => Ok(()),
        Some(i) => match init(i) {
            Ok(()) => {
                i.ready = true;
                log::info!("tollgate: proxy_redis_init for cluster \"{cluster}\" succeeded");
                Ok(())
            }
            Err(s) => Err(BackendError::Dispatch(format!(
                "proxy_redis_init answered {s} (is cluster \"{cluster}\" known?)"
            ))),
        },
        None => Err(BackendError::Dispatch(
            "no Redis client (Redis callouts need tollgate-higress.wasm and a RESP backend)"
                .to_string(),
        )),
    })?;
    redis_call(cluster, command).map_err(|s| {
        if s == Status::BadArgument {
            // The cluster is unknown to this worker now (xDS removed it): its next definition
            // comes with a client of Higress' defaults.
            set_up_again();
        }
        BackendError::Dispatch(match s {
            Status::BadArgument => format!("BadArgument (is cluster \"{cluster}\" defined?)"),
            Status::InternalFailure => "InternalFailure (no Redis host to send to)".to_string(),
            other => other.to_string(),
        })
    })
}

/// The worker's client is set up again before its next call: its cluster was defined anew (a
/// new thread-local cluster entry, whose client has Higress' defaults: no AUTH, database 0).
pub fn set_up_again() {
    INIT.with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            if let Some(i) = slot.as_mut() {
                i.ready = false;
            }
        }
    });
}
