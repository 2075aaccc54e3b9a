// The lease path's wasm cost in V8, without Envoy: Node's V8 (TurboFan, as Envoy runs it) runs a
// filter module behind a small proxy-wasm host written here, and times requests that tollgate
// answers from leased tokens, next to the wasm floor (bench/wasm-floor) on the same host. With
// `--flood`, the new-key path instead: exact mode, every request a new key, eight requests
// arriving while a batched call is out and leaving with the next (`make bench`'s
// tollgate-flood-exact on one worker); the floor does not run then (it holds nothing).
//
// What it is for: `make bench` measures Envoy's CPU per request, the real figure, but a change of a
// few hundred nanoseconds of wasm is lost in its noise. Here the host calls cost a JS function call,
// not Envoy's work, so what moves is the module's own code. Rounds alternate between the modules
// and the medians are printed; `node --cpu-prof bench/v8-local-path.mjs --only tollgate` writes a
// profile whose wasm functions carry their names when the module was built with them
// (CARGO_PROFILE_RELEASE_STRIP=false).
//
//   node bench/v8-local-path.mjs [--tollgate path.wasm] [--floor path.wasm] [--requests N]
//                                [--rounds R] [--only tollgate|floor] [--flood]
//   node bench/v8-local-path.mjs --summary PROFILE.cpuprofile
//
// `--summary` prints where a profile's wasm time went: each wasm function's self time as a share
// of all wasm self time (the host's JS, and V8's own work, left out), names demangled.
//
// The host keeps the semantics the local path depends on (cpp-host's): buffers the host returns
// are allocated through the module's proxy_on_memory_allocate, shared data has CAS, a callout's
// answer comes on the root context. It answers every lease call with all it asked for, and
// every exact check as allowed.

import { readFileSync } from "node:fs";

const OK = 0, NOT_FOUND = 1, EMPTY = 7, CAS_MISMATCH = 8;
const ROOT = 1;

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
    return acc;
  }, []),
);
const FLOOD = process.argv.includes("--flood");
const REQUESTS = Number(args.requests ?? 20000);
const ROUNDS = Number(args.rounds ?? 7);
const MODULES = {
  tollgate: args.tollgate ?? "target/wasm32-wasip1/release/tollgate.wasm",
  floor: args.floor ?? "target/wasm-floor/wasm32-wasip1/release/wasm_floor.wasm",
};
// `make bench`'s tollgate-lease rule (tools/src/bin/bench): one key, a limit never reached.
// With --flood, its tollgate-flood-exact rule: exact mode on a query parameter.
const CONFIG = JSON.stringify({
  backend: { cluster: "tollgate_backend", authority: "webdis", timeout_ms: 2000 },
  response_headers: "ietf",
  rules: [{ name: "per-user", match: { path_prefix: "/api/" },
            key: [FLOOD ? "query:k" : "header:x-user-id"],
            mode: FLOOD ? "exact" : "lease", rate: 1000000, period_ms: 1000, burst: 1000000 }],
});
// What Envoy hands a filter for `curl -H 'x-user-id: bench-user' http://127.0.0.1/api/bench`.
const REQUEST = [
  [":authority", "127.0.0.1:10000"], [":path", "/api/bench"], [":method", "GET"],
  [":scheme", "http"], ["user-agent", "h2load nghttp2/1.52.0"], ["x-user-id", "bench-user"],
  ["x-forwarded-proto", "http"], ["x-request-id", "2a1f3c9e-6d0b-4f7a-9c55-0e1b2d3c4f5a"],
];
const RESPONSE = [[":status", "200"], ["content-length", "3"], ["content-type", "text/plain"],
                  ["date", "Mon, 23 Nov 2026 07:00:00 GMT"], ["server", "envoy"]];

const enc = new TextEncoder(), dec = new TextDecoder();

function encodePairs(pairs) {
  const parts = pairs.map(([k, v]) => [enc.encode(k), enc.encode(v)]);
  let size = 4 + 8 * parts.length;
  for (const [k, v] of parts) size += k.length + v.length + 2;
  const out = new Uint8Array(size), view = new DataView(out.buffer);
  view.setUint32(0, parts.length, true);
  let at = 4;
  for (const [k, v] of parts) {
    view.setUint32(at, k.length, true); view.setUint32(at + 4, v.length, true); at += 8;
  }
  for (const [k, v] of parts) {
    out.set(k, at); at += k.length + 1; out.set(v, at); at += v.length + 1;
  }
  return out;
}

function decodePairs(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = view.getUint32(0, true), sizes = [];
  for (let i = 0; i < n; i++) sizes.push([view.getUint32(4 + 8 * i, true), view.getUint32(8 + 8 * i, true)]);
  let at = 4 + 8 * n;
  return sizes.map(([k, v]) => {
    const key = dec.decode(bytes.subarray(at, at + k)); at += k + 1;
    const value = dec.decode(bytes.subarray(at, at + v)); at += v + 1;
    return [key, value];
  });
}

/// One VM with its host: instantiates `path` and configures one root context.
async function start(name, path) {
  const module = await WebAssembly.compile(readFileSync(path));
  const host = {
    request: REQUEST,
    requestPairs: encodePairs(REQUEST),
    responsePairs: encodePairs(RESPONSE),
    shared: new Map(), // key -> [bytes, cas]
    calls: [], // [token, body]
    nextToken: 1,
    callBody: null,
    callHeaders: null,
    metrics: 0,
    added: 0,
    logs: [],
  };
  let exports;
  const mem = () => new Uint8Array(exports.memory.buffer);
  const view = () => new DataView(exports.memory.buffer);
  const str = (ptr, len) => dec.decode(mem().subarray(ptr, ptr + len));
  const bytes = (ptr, len) => mem().slice(ptr, ptr + len);
  // cpp-host's copyToPointerSize: the module allocates, the host copies.
  const give = (data, ptrPtr, sizePtr) => {
    let ptr = 0;
    if (data.length > 0) {
      ptr = exports.proxy_on_memory_allocate(data.length);
      mem().set(data, ptr);
    }
    view().setUint32(ptrPtr, ptr, true);
    view().setUint32(sizePtr, data.length, true);
    return OK;
  };
  const env = {
    proxy_log: (level, ptr, len) => { if (level >= 3) host.logs.push(str(ptr, len)); return OK; },
    proxy_get_log_level: (ptr) => { view().setUint32(ptr, 2, true); return OK; },
    proxy_get_current_time_nanoseconds: (ptr) => {
      view().setBigUint64(ptr, BigInt(Date.now()) * 1000000n, true); return OK;
    },
    proxy_set_tick_period_milliseconds: () => OK,
    proxy_set_effective_context: () => OK,
    proxy_get_buffer_bytes: (type, start, max, ptrPtr, sizePtr) => {
      const data = type === 7 ? enc.encode(CONFIG) : type === 4 ? host.callBody : null;
      if (!data) return NOT_FOUND;
      return give(data.subarray(start >>> 0, (start >>> 0) + (max >>> 0)), ptrPtr, sizePtr);
    },
    proxy_get_buffer_status: () => NOT_FOUND,
    proxy_get_header_map_pairs: (map, ptrPtr, sizePtr) => {
      const data = map === 0 ? host.requestPairs : map === 2 ? host.responsePairs
        : map === 6 ? host.callHeaders : null;
      if (!data) return NOT_FOUND;
      return give(data, ptrPtr, sizePtr);
    },
    proxy_get_header_map_value: (map, kPtr, kLen, ptrPtr, sizePtr) => {
      const name = str(kPtr, kLen);
      const list = map === 0 ? host.request : map === 2 ? RESPONSE : map === 6 ? [[":status", "200"]] : [];
      const hit = list.find(([k]) => k === name);
      if (!hit) return NOT_FOUND;
      return give(enc.encode(hit[1]), ptrPtr, sizePtr);
    },
    proxy_add_header_map_value: () => { host.added++; return OK; },
    proxy_replace_header_map_value: () => OK,
    proxy_remove_header_map_value: () => OK,
    proxy_get_property: () => NOT_FOUND,
    proxy_get_shared_data: (kPtr, kLen, ptrPtr, sizePtr, casPtr) => {
      const hit = host.shared.get(str(kPtr, kLen));
      if (!hit) return NOT_FOUND;
      view().setUint32(casPtr, hit[1], true);
      return give(hit[0], ptrPtr, sizePtr);
    },
    proxy_set_shared_data: (kPtr, kLen, vPtr, vLen, cas) => {
      const key = str(kPtr, kLen), hit = host.shared.get(key);
      if (cas !== 0 && hit && hit[1] !== cas) return CAS_MISMATCH;
      host.shared.set(key, [bytes(vPtr, vLen), hit ? hit[1] + 1 : 1]);
      return OK;
    },
    proxy_register_shared_queue: (nPtr, nLen, tokenPtr) => { view().setUint32(tokenPtr, 1, true); return OK; },
    proxy_resolve_shared_queue: () => NOT_FOUND,
    proxy_enqueue_shared_queue: () => OK,
    proxy_dequeue_shared_queue: () => EMPTY,
    proxy_http_call: (uPtr, uLen, hPtr, hLen, bPtr, bLen, tPtr, tLen, timeout, tokenPtr) => {
      const token = host.nextToken++;
      host.calls.push([token, str(bPtr, bLen)]);
      view().setUint32(tokenPtr, token, true);
      return OK;
    },
    proxy_define_metric: (type, nPtr, nLen, idPtr) => { view().setUint32(idPtr, ++host.metrics, true); return OK; },
    proxy_increment_metric: () => OK,
    proxy_record_metric: () => OK,
    proxy_get_metric: () => NOT_FOUND,
    proxy_continue_stream: () => OK,
    proxy_send_local_response: () => OK,
    proxy_set_buffer_bytes: () => OK,
    proxy_done: () => OK,
  };
  const wasi = {
    random_get: (ptr, len) => { mem().set(crypto.getRandomValues(new Uint8Array(len)), ptr); return 0; },
    environ_get: () => 0,
    environ_sizes_get: (countPtr, sizePtr) => { view().setUint32(countPtr, 0, true); view().setUint32(sizePtr, 0, true); return 0; },
    fd_write: () => 0,
    proc_exit: (code) => { throw new Error(`${name}: proc_exit(${code})`); },
    clock_time_get: (id, precision, ptr) => { view().setBigUint64(ptr, BigInt(Date.now()) * 1000000n, true); return 0; },
  };
  const imports = { env: {}, wasi_snapshot_preview1: {} };
  for (const imp of WebAssembly.Module.imports(module)) {
    const table = imp.module === "env" ? env : wasi;
    // What the module imports and never calls on this path (the SDK imports every host call).
    const unused = () => { throw new Error(`${name} called ${imp.module}.${imp.name}`); };
    imports[imp.module][imp.name] = table[imp.name] ?? unused;
  }
  const instance = await WebAssembly.instantiate(module, imports);
  exports = instance.exports;
  exports._initialize?.();
  exports.proxy_on_context_create(ROOT, 0);
  exports.proxy_on_vm_start?.(ROOT, 0);
  if (!exports.proxy_on_configure(ROOT, CONFIG.length)) throw new Error(`${name}: configure failed: ${host.logs}`);
  let ctx = 100;
  const answer = (token, ints) => {
    host.callBody = enc.encode(`{"EVALSHA":[${ints.join(",")}]}`);
    host.callHeaders = encodePairs([[":status", "200"]]);
    exports.proxy_on_http_call_response(ROOT, token, 1, host.callBody.length, 0);
  };
  // The callout answers: every lease call gets all it asked for (max(cost, lease_want)).
  const answerCalls = () => {
    while (host.calls.length > 0) {
      const [token, body] = host.calls.shift();
      // .../<cost>/<lease>/<max_wait_ms>/<settle>, the lease `<want>` or `<want>%3A<holder>...`.
      const n = body.split("/");
      const asked = Math.max(Number(n[n.length - 4]), parseInt(n[n.length - 3], 10));
      answer(token, [1, 1000000, 0, 0, asked]);
    }
  };
  // The flood's flight out: each of its keys allowed, one token taken (the batched form answers
  // six integers a key, the single form five).
  const answerFlight = () => {
    const [token, body] = host.calls.shift();
    const parts = body.split("/");
    const keys = Number(parts[2]), batched = parts[3 + keys] === "batch";
    const ints = [];
    for (let i = 0; i < keys; i++) ints.push(1, 999999, 0, 0, 1, ...(batched ? [0] : []));
    answer(token, ints);
  };
  const finish = (c) => {
    exports.proxy_on_response_headers(c, RESPONSE.length, 0);
    exports.proxy_on_response_body?.(c, 3, 1);
    exports.proxy_on_done?.(c);
    exports.proxy_on_log?.(c);
    exports.proxy_on_delete(c);
  };
  let key = 0, arriving = [], answered = [];
  const flood = () => {
    const c = ctx++;
    host.request = REQUEST.map(([k, v]) => [k, k === ":path" ? `/api/flood?k=user-${key}` : v]);
    host.requestPairs = encodePairs(host.request);
    key++;
    exports.proxy_on_context_create(c, ROOT);
    exports.proxy_on_request_headers(c, REQUEST.length, 1);
    arriving.push(c);
    if (arriving.length === 8) {
      // The flight out is answered: the eight that arrived meanwhile leave in the next one, and
      // the requests it answered finish.
      answerFlight();
      answered.forEach(finish);
      [answered, arriving] = [arriving, []];
    }
  };
  const request = FLOOD ? flood : () => {
    const c = ctx++;
    exports.proxy_on_context_create(c, ROOT);
    exports.proxy_on_request_headers(c, REQUEST.length, 1);
    answerCalls();
    finish(c);
  };
  return { name, host, request, tick: () => exports.proxy_on_tick?.(ROOT) };
}

// A legacy-mangled Rust name (`_ZN4core3fmt5write17h<hash>E`) as a path (`core::fmt::write`).
function demangle(name) {
  if (!name.startsWith("_ZN")) return name;
  const parts = [];
  let at = 3;
  while (at < name.length && name[at] !== "E") {
    const digits = /^\d+/.exec(name.slice(at));
    if (!digits) break;
    at += digits[0].length;
    const part = name.slice(at, at + Number(digits[0]));
    at += part.length;
    if (!/^h[0-9a-f]{16}$/.test(part)) parts.push(part);
  }
  return parts.join("::").replace(/\$LT\$/g, "<").replace(/\$GT\$/g, ">").replace(/\$u20\$/g, " ")
    .replace(/\$C\$/g, ",").replace(/\$RF\$/g, "&").replace(/\.\./g, "::");
}

// --summary: each wasm function's self time in a --cpu-prof profile, as a share of the wasm's.
if (args.summary) {
  const profile = JSON.parse(readFileSync(args.summary, "utf8"));
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const self = new Map();
  let total = 0, wasm = 0;
  profile.samples.forEach((id, i) => {
    const dt = profile.timeDeltas[i] ?? 0, fn = byId.get(id).callFrame;
    total += dt;
    if (!fn.url.startsWith("wasm://")) return;
    wasm += dt;
    const name = demangle(fn.functionName);
    self.set(name, (self.get(name) ?? 0) + dt);
  });
  console.log(`wasm: ${(100 * wasm / total).toFixed(1)}% of the profile's samples (the rest: the host's JS, V8)`);
  for (const [name, dt] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 30)) {
    console.log(`${(100 * dt / wasm).toFixed(1).padStart(5)}%  ${name}`);
  }
  process.exit(0);
}

const vms = [];
for (const [name, path] of Object.entries(MODULES)) {
  if ((!args.only || args.only === name) && !(FLOOD && name === "floor")) vms.push(await start(name, path));
}
// Warm-up: leases granted, TurboFan has compiled the hot functions.
for (const vm of vms) for (let i = 0; i < 50000; i++) vm.request();
const samples = Object.fromEntries(vms.map((vm) => [vm.name, []]));
for (let round = 0; round < ROUNDS; round++) {
  for (const vm of vms) {
    const added = vm.host.added, calls = vm.host.nextToken;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < REQUESTS; i++) {
      vm.request();
      if ((i & 1023) === 0) vm.tick();
    }
    const ns = Number(process.hrtime.bigint() - t0) / REQUESTS;
    samples[vm.name].push(ns);
    if (vm.name === "tollgate" && vm.host.added - added !== 2 * REQUESTS) {
      throw new Error(`tollgate added ${vm.host.added - added} headers to ${REQUESTS} responses`);
    }
    vm.calls = (vm.calls ?? 0) + vm.host.nextToken - calls;
  }
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const vm of vms) {
  const m = median(samples[vm.name]);
  console.log(`${vm.name}: ${m.toFixed(0)} ns/request (median of ${ROUNDS} rounds of ${REQUESTS}; ` +
    `rounds ${samples[vm.name].map((s) => s.toFixed(0)).join(" ")}), ${FLOOD ? "script" : "lease"} calls ${vm.calls}` +
    (vm.host.logs.length ? `, log: ${vm.host.logs.slice(0, 3).join(" | ")}` : ""));
}
if (vms.length === 2) {
  const [t, f] = [median(samples.tollgate), median(samples.floor)];
  console.log(`tollgate - floor: ${(t - f).toFixed(0)} ns/request; tollgate / floor: ${(t / f).toFixed(2)}`);
}
