//! The host functions: proxy-wasm ABI 0.2.1 as Envoy implements it (proxy-wasm-cpp-host src/exports.cc
//! and Envoy source/extensions/common/wasm/context.cc), Higress' `proxy_redis_init` /
//! `proxy_redis_call` (higress-group/proxy-wasm-cpp-host src/exports.cc, higress-group/envoy
//! source/extensions/common/wasm/context.cc), and the WASI functions a Rust wasm32-wasip1 module
//! imports. Functions tollgate does not use answer `Unimplemented` and are recorded as unmodelled.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wasmi::{Caller, Error, Extern, Linker, Memory};

use crate::redis::{RedisClient, RedisConfig};
use crate::worker::{After, Host};
use crate::Stat;

type C<'a> = Caller<'a, Host>;

// WasmResult (proxy-wasm-cpp-sdk proxy_wasm_common.h).
const OK: i32 = 0;
const NOT_FOUND: i32 = 1;
const BAD_ARGUMENT: i32 = 2;
const INVALID_MEMORY_ACCESS: i32 = 6;
const EMPTY: i32 = 7;
const CAS_MISMATCH: i32 = 8;
const INTERNAL_FAILURE: i32 = 10;
const UNIMPLEMENTED: i32 = 12;

fn memory(c: &C) -> Result<Memory, Error> {
    c.get_export("memory")
        .and_then(Extern::into_memory)
        .ok_or_else(|| Error::new("module exports no memory"))
}

fn read(c: &C, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let m = memory(c).ok()?;
    let mut buf = vec![0; len as u32 as usize];
    m.read(c, ptr as u32 as usize, &mut buf).ok()?;
    Some(buf)
}

fn write(c: &mut C, ptr: i32, bytes: &[u8]) -> bool {
    match memory(c) {
        Ok(m) => m.write(c, ptr as u32 as usize, bytes).is_ok(),
        Err(_) => false,
    }
}

fn write_u32(c: &mut C, ptr: i32, v: u32) -> bool {
    write(c, ptr, &v.to_le_bytes())
}

/// Memory in the VM, from its allocator (`malloc`, else `proxy_on_memory_allocate`).
fn alloc(c: &mut C, size: usize) -> Result<u32, Error> {
    let f = c
        .get_export("malloc")
        .or_else(|| c.get_export("proxy_on_memory_allocate"))
        .and_then(Extern::into_func)
        .ok_or_else(|| Error::new("module has no allocator"))?;
    let f = f.typed::<i32, i32>(&*c)?;
    Ok(f.call(&mut *c, size as i32)? as u32)
}

/// proxy-wasm-cpp-host `copyToPointerSize`: empty data is a null pointer and size 0.
fn copy_out(c: &mut C, bytes: &[u8], ptr_ptr: i32, size_ptr: i32) -> Result<i32, Error> {
    let mut ptr = 0u32;
    if !bytes.is_empty() {
        ptr = alloc(c, bytes.len())?;
        if ptr == 0 || !write(c, ptr as i32, bytes) {
            return Ok(INVALID_MEMORY_ACCESS);
        }
    }
    if !write_u32(c, ptr_ptr, ptr) || !write_u32(c, size_ptr, bytes.len() as u32) {
        return Ok(INVALID_MEMORY_ACCESS);
    }
    Ok(OK)
}

/// No proxy_* call is allowed while the module initializes (cpp-host's restricted callbacks):
/// Envoy fails the module load.
fn guard(c: &C, name: &str) -> Result<(), Error> {
    c.data().shared.host_call(name);
    if c.data().shared.config.trace {
        eprintln!("TRACE {name} {}", c.get_fuel().unwrap_or(0));
    }
    if c.data().initializing {
        return Err(Error::new(format!(
            "restricted_callback: {name} during _initialize"
        )));
    }
    Ok(())
}

fn unmodelled(c: &C, name: &str) -> Result<i32, Error> {
    guard(c, name)?;
    c.data().shared.unmodelled(name);
    Ok(UNIMPLEMENTED)
}

/// proxy-wasm header map serialization: count, then (key len, value len) pairs, then each key and
/// value followed by a NUL.
fn serialize_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

fn deserialize_pairs(bytes: &[u8]) -> Option<Vec<(String, String)>> {
    let u32_at = |i: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?) as usize)
    };
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let n = u32_at(0)?;
    let mut sizes = Vec::new();
    for i in 0..n {
        sizes.push((u32_at(4 + i * 8)?, u32_at(8 + i * 8)?));
    }
    let mut at = 4 + n * 8;
    let mut out = Vec::new();
    for (kl, vl) in sizes {
        let k = bytes.get(at..at + kl)?;
        at += kl + 1;
        let v = bytes.get(at..at + vl)?;
        at += vl + 1;
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    }
    Some(out)
}

/// The header map `map_type` of the effective context, if available now (Envoy: BadArgument if not).
fn header_map(h: &mut Host, map_type: i32) -> Option<&mut Vec<(String, String)>> {
    let ctx = h.context();
    match map_type {
        0 => h.streams.get_mut(&ctx)?.request_headers.as_mut(),
        2 => h.streams.get_mut(&ctx)?.response_headers.as_mut(),
        6 => h.call_response.as_mut().map(|r| &mut r.0),
        _ => None,
    }
}

/// Envoy's attributes (source/extensions/filters/common/expr/context.cc) for the effective
/// context's request: `request.headers.<name>` joins a repeated header's values with `,` and
/// ignores the name's case.
fn attribute(h: &Host, path: &[&str]) -> Option<String> {
    let cfg = &h.shared.config;
    let stream = h.streams.get(&h.context());
    // Envoy's Context::findValue gives the activation the stream's live request header map,
    // which it drops once the request goes on (decodeHeaders answering Continue, or
    // continueStream): from then on `request.headers`, `request.path`, ... are NotFound outside
    // the access log phase (RequestWrapper over no headers).
    let header = |name: &str| -> Option<String> {
        let name = name.to_ascii_lowercase();
        let values: Vec<&str> = stream?
            .request_headers
            .as_ref()?
            .iter()
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
            .collect();
        (!values.is_empty()).then(|| values.join(","))
    };
    match path {
        ["source", "address"] => stream.map(|s| s.peer.to_string()),
        ["source", "port"] => stream.map(|s| s.peer.port().to_string()),
        ["request", "headers", name] => header(name),
        ["request", "path"] => header(":path"),
        ["request", "url_path"] => {
            header(":path").map(|p| p.split('?').next().unwrap_or("").to_string())
        }
        ["request", "host"] => header(":authority"),
        ["request", "method"] => header(":method"),
        ["request", "scheme"] => header(":scheme"),
        ["request", "id"] => header("x-request-id"),
        ["request", "protocol"] => stream.map(|_| "HTTP/1.1".to_string()),
        ["plugin_name"] => Some(cfg.plugin_name.clone()),
        ["plugin_root_id"] => Some(cfg.root_id.clone()),
        ["plugin_vm_id"] => Some(cfg.vm_id.clone()),
        _ => None,
    }
}

/// An absent request header is NotFound in Envoy too, and so is every header-borne `request.*`
/// attribute once the request went on, so not a gap of this host; any other attribute this host
/// has no value for is recorded as unmodelled.
fn known_absent(h: &Host, path: &[&str]) -> bool {
    let headers_gone = h
        .streams
        .get(&h.context())
        .is_some_and(|s| s.request_headers.is_none());
    matches!(path, ["request", "headers", _]) || (headers_gone && path.first() == Some(&"request"))
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).into_owned()
}

fn level_name(level: i32) -> &'static str {
    ["trace", "debug", "info", "warn", "error", "critical"]
        .get(level as usize)
        .copied()
        .unwrap_or("?")
}

pub fn define(linker: &mut Linker<Host>, with_redis: bool) -> Result<(), Error> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |c: C, level: i32, ptr: i32, len: i32| -> Result<i32, Error> {
            guard(&c, "proxy_log")?;
            if !(0..=5).contains(&level) {
                return Ok(BAD_ARGUMENT);
            }
            let Some(msg) = read(&c, ptr, len) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let h = c.data();
            let cfg = &h.shared.config;
            if level as u32 >= cfg.log_level {
                // Envoy's form: `wasm log <plugin name> <root id>: <message>`.
                h.log(format!(
                    "{} wasm log {} {}: {}",
                    level_name(level),
                    cfg.plugin_name,
                    cfg.root_id,
                    text(msg)
                ));
            }
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: C, ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_get_log_level")?;
            let level = c.data().shared.config.log_level;
            Ok(if write_u32(&mut c, ptr, level) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C, ms: i32| -> Result<i32, Error> {
            guard(&c, "proxy_set_tick_period_milliseconds")?;
            // Per root context (cpp-host setTimerPeriod on root_context()); this VM has one root.
            let h = c.data_mut();
            h.tick_period = Duration::from_millis(u64::from(ms as u32));
            h.tick_due = (ms != 0).then(|| Instant::now() + h.tick_period);
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C, ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_get_current_time_nanoseconds")?;
            let ns = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            Ok(if write(&mut c, ptr, &ns.to_le_bytes()) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    let max_buffer: i32 = if with_redis { 9 } else { 8 };
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        move |mut c: C,
              kind: i32,
              start: i32,
              max: i32,
              ptr_ptr: i32,
              size_ptr: i32|
              -> Result<i32, Error> {
            guard(&c, "proxy_get_buffer_bytes")?;
            if !(0..=max_buffer).contains(&kind) {
                return Ok(BAD_ARGUMENT);
            }
            let h = c.data();
            let ctx = h.context();
            let buffer: Option<Vec<u8>> = match kind {
                1 => h.streams.get(&ctx).and_then(|s| s.response_body.clone()),
                4 => h.call_response.as_ref().map(|r| r.1.clone()),
                6 => h
                    .vm_config_available
                    .then(|| h.shared.config.vm_config.clone().into_bytes()),
                7 => h
                    .plugin_config_available
                    .then(|| h.shared.config.plugin_config.clone().into_bytes()),
                9 => h.redis_response.clone(),
                _ => None,
            };
            let Some(buffer) = buffer else {
                return Ok(NOT_FOUND);
            };
            // cpp-host get_buffer_bytes: clamp to the buffer; nothing left is Ok with no data.
            let start = start as u32 as usize;
            let len = (max as u32 as usize).min(buffer.len().saturating_sub(start));
            let slice = buffer.get(start..start + len).unwrap_or(&[]);
            copy_out(&mut c, slice, ptr_ptr, size_ptr)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |c: C, _: i32, _: i32, _: i32, _: i32, _: i32| unmodelled(&c, "proxy_set_buffer_bytes"),
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C, map: i32, kp: i32, kl: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_get_header_map_value")?;
            let Some(key) = read(&c, kp, kl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let key = text(key).to_ascii_lowercase();
            let Some(headers) = header_map(c.data_mut(), map) else {
                return Ok(BAD_ARGUMENT);
            };
            // Envoy returns the first value of a repeated header.
            let Some(value) = headers
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
            else {
                return Ok(NOT_FOUND);
            };
            copy_out(&mut c, value.as_bytes(), ptr_ptr, size_ptr)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C, map: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_get_header_map_pairs")?;
            // cpp-host get_header_map_pairs: BadArgument only for a type past the last one;
            // Envoy's getHeaderMapPairs is Ok with no pairs for a map not available now, and
            // no pairs go out as no data at all (null, 0), not as an encoded count of 0.
            if !(0..=7).contains(&map) {
                return Ok(BAD_ARGUMENT);
            }
            let bytes = match header_map(c.data_mut(), map) {
                Some(headers) if !headers.is_empty() => serialize_pairs(headers),
                _ => Vec::new(),
            };
            copy_out(&mut c, &bytes, ptr_ptr, size_ptr)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C, map: i32, ptr: i32, size: i32| -> Result<i32, Error> {
            guard(&c, "proxy_set_header_map_pairs")?;
            let Some(pairs) = read(&c, ptr, size).and_then(|b| deserialize_pairs(&b)) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(headers) = header_map(c.data_mut(), map) else {
                return Ok(BAD_ARGUMENT);
            };
            headers.retain(|(k, _)| k.starts_with(':'));
            headers.extend(pairs.into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)));
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| -> Result<i32, Error> {
            guard(&c, "proxy_add_header_map_value")?;
            let (Some(k), Some(v)) = (read(&c, kp, kl), read(&c, vp, vl)) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(headers) = header_map(c.data_mut(), map) else {
                return Ok(BAD_ARGUMENT);
            };
            headers.push((text(k).to_ascii_lowercase(), text(v)));
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| -> Result<i32, Error> {
            guard(&c, "proxy_replace_header_map_value")?;
            let (Some(k), Some(v)) = (read(&c, kp, kl), read(&c, vp, vl)) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let key = text(k).to_ascii_lowercase();
            let Some(headers) = header_map(c.data_mut(), map) else {
                return Ok(BAD_ARGUMENT);
            };
            headers.retain(|(name, _)| *name != key);
            headers.push((key, text(v)));
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C, map: i32, kp: i32, kl: i32| -> Result<i32, Error> {
            guard(&c, "proxy_remove_header_map_value")?;
            let Some(k) = read(&c, kp, kl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let key = text(k).to_ascii_lowercase();
            let Some(headers) = header_map(c.data_mut(), map) else {
                return Ok(BAD_ARGUMENT);
            };
            headers.retain(|(name, _)| *name != key);
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C, pp: i32, pl: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_get_property")?;
            let Some(path) = read(&c, pp, pl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            // Envoy splits the path at NULs; a trailing NUL ends the last segment.
            let path = text(path);
            let mut segments: Vec<&str> = path.split('\0').collect();
            if segments.last() == Some(&"") {
                segments.pop();
            }
            let h = c.data();
            let value = attribute(h, &segments);
            if value.is_none() && !known_absent(h, &segments) {
                h.shared
                    .unmodelled(&format!("proxy_get_property {}", segments.join(".")));
            }
            match value {
                Some(v) => copy_out(&mut c, v.as_bytes(), ptr_ptr, size_ptr),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: C, pp: i32, pl: i32, vp: i32, vl: i32| -> Result<i32, Error> {
            guard(&c, "proxy_set_property")?;
            let (Some(path), Some(value)) = (read(&c, pp, pl), read(&c, vp, vl)) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            // Envoy Context::setProperty: the stream's filter state `wasm.<path>` (the path as
            // it is), a later value replacing an earlier one; NotFound without a stream (a root
            // context).
            let h = c.data_mut();
            let ctx = h.context();
            match h.streams.get_mut(&ctx) {
                Some(s) => {
                    s.filter_state.insert(format!("wasm.{}", text(path)), value);
                    Ok(OK)
                }
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C,
         kp: i32,
         kl: i32,
         ptr_ptr: i32,
         size_ptr: i32,
         cas_ptr: i32|
         -> Result<i32, Error> {
            guard(&c, "proxy_get_shared_data")?;
            let Some(key) = read(&c, kp, kl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let entry = c
                .data()
                .shared
                .data
                .lock()
                .map_err(|_| Error::new("poisoned"))?
                .get(&key);
            let Some((value, cas)) = entry else {
                return Ok(NOT_FOUND);
            };
            let st = copy_out(&mut c, &value, ptr_ptr, size_ptr)?;
            if st != OK {
                return Ok(st);
            }
            Ok(if write_u32(&mut c, cas_ptr, cas) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |c: C, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| -> Result<i32, Error> {
            guard(&c, "proxy_set_shared_data")?;
            let (Some(key), Some(value)) = (read(&c, kp, kl), read(&c, vp, vl)) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let mut data = c
                .data()
                .shared
                .data
                .lock()
                .map_err(|_| Error::new("poisoned"))?;
            Ok(match data.set(&key, &value, cas as u32) {
                Ok(()) => OK,
                Err(()) => CAS_MISMATCH,
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: C, np: i32, nl: i32, id_ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_register_shared_queue")?;
            let Some(name) = read(&c, np, nl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let name = String::from_utf8_lossy(&name).into_owned();
            let h = c.data();
            // Envoy: a stream context's queue calls back its root context.
            let (owner, root) = (h.events.clone(), h.root);
            let token = h
                .shared
                .queues
                .lock()
                .map_err(|_| Error::new("poisoned"))?
                .register(&name, owner, root);
            Ok(if write_u32(&mut c, id_ptr, token) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |c: C, _: i32, _: i32, _: i32, _: i32, _: i32| unmodelled(&c, "proxy_resolve_shared_queue"),
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: C, token: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_dequeue_shared_queue")?;
            let item = c
                .data()
                .shared
                .queues
                .lock()
                .map_err(|_| Error::new("poisoned"))?
                .dequeue(token as u32);
            match item {
                None => Ok(NOT_FOUND),
                Some(None) => Ok(EMPTY),
                Some(Some(value)) => copy_out(&mut c, &value, ptr_ptr, size_ptr),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |c: C, token: i32, vp: i32, vl: i32| -> Result<i32, Error> {
            guard(&c, "proxy_enqueue_shared_queue")?;
            let Some(value) = read(&c, vp, vl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let mut queues = c
                .data()
                .shared
                .queues
                .lock()
                .map_err(|_| Error::new("poisoned"))?;
            Ok(if queues.enqueue(token as u32, value) {
                OK
            } else {
                NOT_FOUND
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_call",
        |c: C,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32| { unmodelled(&c, "proxy_grpc_call") },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_stream",
        |c: C, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| {
            unmodelled(&c, "proxy_grpc_stream")
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_send",
        |c: C, _: i32, _: i32, _: i32, _: i32| unmodelled(&c, "proxy_grpc_send"),
    )?;
    linker.func_wrap("env", "proxy_grpc_cancel", |c: C, _: i32| {
        unmodelled(&c, "proxy_grpc_cancel")
    })?;
    linker.func_wrap("env", "proxy_grpc_close", |c: C, _: i32| {
        unmodelled(&c, "proxy_grpc_close")
    })?;
    linker.func_wrap("env", "proxy_get_status", |c: C, _: i32, _: i32, _: i32| {
        unmodelled(&c, "proxy_get_status")
    })?;
    linker.func_wrap("env", "proxy_done", |c: C| unmodelled(&c, "proxy_done"))?;
    linker.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |c: C, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| {
            unmodelled(&c, "proxy_call_foreign_function")
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C, kind: i32, np: i32, nl: i32, id_ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_define_metric")?;
            if !(0..=2).contains(&kind) {
                return Ok(BAD_ARGUMENT);
            }
            let Some(name) = read(&c, np, nl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let name = text(name);
            let h = c.data_mut();
            // cpp-host: ids carry their type in the low 2 bits, and go up by 4.
            h.next_metric[kind as usize] += 4;
            let id = h.next_metric[kind as usize];
            h.metrics.insert(id, name.clone());
            if let Ok(mut stats) = h.shared.stats.lock() {
                stats.entry(name).or_insert(match kind {
                    0 => Stat::Counter(0),
                    1 => Stat::Gauge(0),
                    _ => Stat::Histogram { count: 0, sum: 0 },
                });
            }
            Ok(if write_u32(&mut c, id_ptr, id) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |c: C, id: i32, offset: i64| -> Result<i32, Error> {
            guard(&c, "proxy_increment_metric")?;
            let h = c.data();
            let Some(name) = h.metrics.get(&(id as u32)) else {
                return Ok(NOT_FOUND);
            };
            let mut stats = h.shared.stats.lock().map_err(|_| Error::new("poisoned"))?;
            Ok(match stats.get_mut(name) {
                // Envoy: a counter only goes up; a non-positive offset is BadArgument.
                Some(Stat::Counter(v)) if offset > 0 => {
                    *v += offset as u64;
                    OK
                }
                Some(Stat::Gauge(v)) => {
                    *v += offset;
                    OK
                }
                _ => BAD_ARGUMENT,
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |c: C, id: i32, value: i64| -> Result<i32, Error> {
            guard(&c, "proxy_record_metric")?;
            let h = c.data();
            let Some(name) = h.metrics.get(&(id as u32)) else {
                return Ok(NOT_FOUND);
            };
            let mut stats = h.shared.stats.lock().map_err(|_| Error::new("poisoned"))?;
            match stats.get_mut(name) {
                Some(Stat::Counter(v)) => *v += value as u64,
                Some(Stat::Gauge(v)) => *v = value,
                Some(Stat::Histogram { count, sum }) => {
                    *count += 1;
                    *sum += value as u64;
                }
                None => return Ok(NOT_FOUND),
            }
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C, id: i32, ptr: i32| -> Result<i32, Error> {
            guard(&c, "proxy_get_metric")?;
            let h = c.data();
            let Some(name) = h.metrics.get(&(id as u32)) else {
                return Ok(NOT_FOUND);
            };
            let v = match h
                .shared
                .stats
                .lock()
                .map_err(|_| Error::new("poisoned"))?
                .get(name)
            {
                Some(Stat::Counter(v)) => *v,
                Some(Stat::Gauge(v)) => *v as u64,
                _ => return Ok(BAD_ARGUMENT),
            };
            Ok(if write(&mut c, ptr, &v.to_le_bytes()) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: C, kind: i32| -> Result<i32, Error> {
            guard(&c, "proxy_continue_stream")?;
            let h = c.data_mut();
            let ctx = h.context();
            match kind {
                // Envoy Context::continueStream(Request): deferred continueDecoding; the request
                // headers are gone from then on. On a root context (no decoder) it does nothing, Ok.
                0 => {
                    if let Some(s) = h.streams.get_mut(&ctx) {
                        s.request_headers = None;
                        h.after.push_back(After::Continue(ctx));
                    }
                    Ok(OK)
                }
                1 | 2 => {
                    h.shared
                        .unmodelled("proxy_continue_stream(response/downstream)");
                    Ok(OK)
                }
                3 => Ok(UNIMPLEMENTED),
                _ => Ok(BAD_ARGUMENT),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_close_stream",
        |mut c: C, kind: i32| -> Result<i32, Error> {
            guard(&c, "proxy_close_stream")?;
            let h = c.data_mut();
            let ctx = h.context();
            if kind > 3 {
                return Ok(BAD_ARGUMENT);
            }
            if h.streams.contains_key(&ctx) {
                h.after.push_back(After::Reset(ctx));
            }
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C,
         status: i32,
         dp: i32,
         dl: i32,
         bp: i32,
         bl: i32,
         hp: i32,
         hl: i32,
         _grpc: i32|
         -> Result<i32, Error> {
            guard(&c, "proxy_send_local_response")?;
            let (Some(details), Some(body), Some(pairs)) =
                (read(&c, dp, dl), read(&c, bp, bl), read(&c, hp, hl))
            else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(headers) = deserialize_pairs(&pairs) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let h = c.data_mut();
            let ctx = h.context();
            // cpp-host send_local_response: whatever Context::sendLocalResponse answers, the
            // call is Ok and the VM's next iteration stops (`stopNextIteration(true)`); Envoy
            // queues every reply as an after-VM-call action (no guard against a second one).
            // The reply is sent after the VM call returns. A second reply to a stream is not
            // modelled (Envoy sends it direct to the codec or resets the stream): recorded.
            h.stop_iteration = true;
            match h.streams.get_mut(&ctx) {
                Some(s) if s.local_reply_hold => {
                    h.shared
                        .unmodelled("proxy_send_local_response: a second local reply to a stream");
                    Ok(OK)
                }
                Some(s) => {
                    s.local_reply_hold = true;
                    // Envoy replaces whitespace in the details with `_`
                    // (StringUtil::replaceAllEmptySpace).
                    let details = text(details).replace(char::is_whitespace, "_");
                    s.details = Some(details);
                    h.after.push_back(After::LocalReply {
                        ctx,
                        status: status as u16,
                        headers,
                        body,
                    });
                    Ok(OK)
                }
                None => Ok(OK),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C,
         up: i32,
         ul: i32,
         hp: i32,
         hl: i32,
         bp: i32,
         bl: i32,
         tp: i32,
         tl: i32,
         timeout: i32,
         token_ptr: i32|
         -> Result<i32, Error> {
            guard(&c, "proxy_http_call")?;
            let (Some(cluster), Some(headers), Some(body), Some(_trailers)) = (
                read(&c, up, ul),
                read(&c, hp, hl),
                read(&c, bp, bl),
                read(&c, tp, tl),
            ) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(headers) = deserialize_pairs(&headers) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            if !write_u32(&mut c, token_ptr, 0) {
                return Ok(INVALID_MEMORY_ACCESS);
            }
            let cluster = text(cluster);
            let h = c.data_mut();
            // Envoy Context::httpCall takes the timeout as an `int`: one past i32::MAX reads
            // negative and is BadArgument before anything else is looked at.
            if timeout < 0 {
                return Ok(BAD_ARGUMENT);
            }
            // Envoy Context::httpCall: unknown cluster, or no :path, :method or :authority:
            // BadArgument.
            let Some(addr) = h.shared.cluster(&cluster) else {
                return Ok(BAD_ARGUMENT);
            };
            let has = |name: &str| headers.iter().any(|(k, _)| k == name);
            if !has(":path") || !has(":method") || !has(":authority") {
                return Ok(BAD_ARGUMENT);
            }
            // cpp-host nextHttpCallId: 4, 8, 12, ...
            h.next_http += 4;
            let token = h.next_http;
            let timeout = Duration::from_millis(u64::from(timeout as u32));
            h.http_calls.insert(
                token,
                (!timeout.is_zero()).then(|| Instant::now() + timeout),
            );
            let events = h.events.clone();
            let connect_timeout = h.shared.config.connect_timeout;
            std::thread::spawn(move || {
                let result = match addr {
                    Some(addr) => crate::net::http_callout(
                        addr,
                        &headers,
                        &body,
                        connect_timeout,
                        (!timeout.is_zero()).then_some(timeout),
                    ),
                    // A cluster without hosts: the router answers 503 itself.
                    None => Ok(crate::worker::local_response(503, "no healthy upstream")),
                };
                let _ = events.send(crate::worker::Event::HttpDone { token, result });
            });
            Ok(if write_u32(&mut c, token_ptr, token) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C, id: i32| -> Result<i32, Error> {
            guard(&c, "proxy_set_effective_context")?;
            let h = c.data_mut();
            if !h.exists(id as u32) {
                return Ok(BAD_ARGUMENT);
            }
            h.effective = id as u32;
            Ok(OK)
        },
    )?;

    if with_redis {
        linker.func_wrap(
            "env",
            "proxy_redis_init",
            |c: C,
             cp: i32,
             cl: i32,
             up: i32,
             ul: i32,
             pp: i32,
             pl: i32,
             timeout: i32|
             -> Result<i32, Error> {
                guard(&c, "proxy_redis_init")?;
                let (Some(cluster), Some(username), Some(password)) =
                    (read(&c, cp, cl), read(&c, up, ul), read(&c, pp, pl))
                else {
                    return Ok(INVALID_MEMORY_ACCESS);
                };
                redis_init(c, text(cluster), username, password, timeout as u32)
            },
        )?;
        linker.func_wrap(
            "env",
            "proxy_redis_call",
            |mut c: C, cp: i32, cl: i32, qp: i32, ql: i32, token_ptr: i32| -> Result<i32, Error> {
                guard(&c, "proxy_redis_call")?;
                let (Some(cluster), Some(query)) = (read(&c, cp, cl), read(&c, qp, ql)) else {
                    return Ok(INVALID_MEMORY_ACCESS);
                };
                if !write_u32(&mut c, token_ptr, 0) {
                    return Ok(INVALID_MEMORY_ACCESS);
                }
                let status = redis_call(&mut c, text(cluster), query);
                match status {
                    Ok(token) => Ok(if write_u32(&mut c, token_ptr, token) {
                        OK
                    } else {
                        INVALID_MEMORY_ACCESS
                    }),
                    Err(st) => Ok(st),
                }
            },
        )?;
    }

    // WASI (wasi_snapshot_preview1), what a Rust wasm32-wasip1 cdylib imports.
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "random_get",
        |mut c: C, ptr: i32, len: i32| -> Result<i32, Error> {
            let mut bytes = vec![0u8; len as u32 as usize];
            let mut x = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1;
            for b in &mut bytes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            Ok(if write(&mut c, ptr, &bytes) { 0 } else { 21 })
        },
    )?;
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "environ_sizes_get",
        |mut c: C, count: i32, size: i32| -> Result<i32, Error> {
            Ok(
                if write_u32(&mut c, count, 0) && write_u32(&mut c, size, 0) {
                    0
                } else {
                    21
                },
            )
        },
    )?;
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "environ_get",
        |_c: C, _: i32, _: i32| -> Result<i32, Error> { Ok(0) },
    )?;
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "fd_write",
        |mut c: C, fd: i32, iovs: i32, n: i32, written: i32| -> Result<i32, Error> {
            let mut out = Vec::new();
            for i in 0..n {
                let Some(iov) = read(&c, iovs + i * 8, 8) else {
                    return Ok(21);
                };
                let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                let Some(bytes) = read(&c, ptr, len) else {
                    return Ok(21);
                };
                out.extend_from_slice(&bytes);
            }
            c.data().log(format!(
                "fd{fd} {}",
                String::from_utf8_lossy(&out).trim_end()
            ));
            Ok(if write_u32(&mut c, written, out.len() as u32) {
                0
            } else {
                21
            })
        },
    )?;
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "proc_exit",
        |_c: C, code: i32| -> Result<(), Error> { Err(Error::i32_exit(code)) },
    )?;
    Ok(())
}

/// Higress' redisInit: the cluster (before any `?`) must be known to this worker; the query string's
/// `db` selects a database; username, password and timeout configure this worker's client for the
/// cluster, closing its current connection (envoy-1.27 `AsyncClientImpl::initialize`). No connection
/// is made here.
fn redis_init(
    mut c: C,
    cluster: String,
    username: Vec<u8>,
    password: Vec<u8>,
    timeout_ms: u32,
) -> Result<i32, Error> {
    let (name, query) = match cluster.split_once('?') {
        Some((n, q)) => (n.to_string(), q.to_string()),
        None => (cluster.clone(), String::new()),
    };
    let h = c.data_mut();
    let Some(addr) = h.shared.cluster(&name) else {
        return Ok(BAD_ARGUMENT);
    };
    h.follow_definition(&name);
    let db = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("db="))
        .map(str::to_string);
    h.redis.remove(&name);
    if let Some(addr) = addr {
        let config = RedisConfig {
            addr,
            username,
            password,
            op_timeout: Duration::from_millis(u64::from(timeout_ms)),
            db,
            connect_timeout: h.shared.config.connect_timeout,
        };
        h.redis_config.insert(name, config);
    }
    Ok(OK)
}

/// Higress' redisCall: unknown cluster BadArgument; no host InternalFailure; else a token
/// (3, 7, 11, ...: cpp-host nextRedisCallId) and the command goes out on the worker's connection.
/// Without a `proxy_redis_init` the client has Envoy's defaults: op timeout 1000 ms, no AUTH.
fn redis_call(c: &mut C, cluster: String, query: Vec<u8>) -> Result<u32, i32> {
    let name = cluster.split('?').next().unwrap_or("").to_string();
    let h = c.data_mut();
    let Some(addr) = h.shared.cluster(&name) else {
        return Err(BAD_ARGUMENT);
    };
    let Some(addr) = addr else {
        return Err(INTERNAL_FAILURE);
    };
    h.follow_definition(&name);
    h.next_redis += 4;
    let token = h.next_redis;
    if !h.redis.contains_key(&name) {
        let config = h.redis_config.get(&name).cloned().unwrap_or(RedisConfig {
            addr,
            username: Vec::new(),
            password: Vec::new(),
            op_timeout: Duration::from_millis(1000),
            db: None,
            connect_timeout: h.shared.config.connect_timeout,
        });
        let client = RedisClient::start(config, h.events.clone());
        h.redis.insert(name.clone(), client);
    }
    let sent = h.redis.get(&name).is_some_and(|r| r.send(token, query));
    if !sent {
        return Err(INTERNAL_FAILURE);
    }
    h.redis_calls.insert(token, ());
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::{deserialize_pairs, serialize_pairs};

    #[test]
    fn header_pairs_round_trip() {
        let pairs = vec![
            (":status".to_string(), "200".to_string()),
            ("x".to_string(), String::new()),
            ("k".to_string(), "v w".to_string()),
        ];
        let bytes = serialize_pairs(&pairs);
        assert_eq!(&bytes[..4], &3u32.to_le_bytes());
        assert_eq!(deserialize_pairs(&bytes), Some(pairs));
        assert_eq!(deserialize_pairs(&[]), Some(Vec::new()));
        assert_eq!(deserialize_pairs(&bytes[..bytes.len() - 3]), None);
    }
}
