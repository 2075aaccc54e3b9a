//! A proxy-wasm test host: runs a tollgate `.wasm` the way Envoy 1.40 (and Higress' Envoy) runs an
//! HTTP Wasm filter, for tests. Not a product.
//!
//! One [`Proxy`] is one Envoy process: an HTTP/1.1 listener on loopback, `workers` threads each with its
//! own VM instance and root context, proxy-wide shared data (one mutex, CAS as proxy-wasm-cpp-host's
//! `SharedData`), and clusters that are real loopback addresses: HTTP callouts go to them over TCP
//! (Webdis), and Higress Redis callouts go to them as RESP over a per-worker pipelined connection
//! (redis-server). Requests run through the module's exported callbacks in Envoy's order, with Envoy's
//! deferred actions (resume and local replies take effect after the VM call returns), callout
//! timeouts, per-root-context ticks and `set_effective_context`.
//!
//! Every behaviour modelled here cites where Envoy or the proxy-wasm host does the same; what is not
//! modelled is listed in README.md. A trap in the VM fails that worker (Envoy's FAIL_CLOSED: 503) and
//! is recorded in [`Proxy::traps`]; a host call the host does not model is recorded in
//! [`Proxy::unmodelled`], so a test can assert both are empty.

mod abi;
mod net;
mod redis;
mod worker;

/// The length of the one RESP value at the start of a buffer (Ok(None): incomplete; Err: not RESP).
pub use redis::frame_len as resp_frame_len;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How a test host proxy is set up.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The module to run.
    pub wasm: PathBuf,
    /// The plugin configuration (`configuration` in Envoy's Wasm filter config).
    pub plugin_config: String,
    /// The VM configuration (`vm_config.configuration`); empty in tollgate's manifests.
    pub vm_config: String,
    /// `vm_config.vm_id`: shared data is per VM id.
    pub vm_id: String,
    /// `config.name` (the property `plugin_name`).
    pub plugin_name: String,
    /// `config.root_id` (the property `plugin_root_id`).
    pub root_id: String,
    /// Worker threads (Envoy's `--concurrency`), each with its own VM.
    pub workers: usize,
    /// Cluster name -> address. `None`: the cluster exists but has no host.
    pub clusters: Vec<(String, Option<SocketAddr>)>,
    /// Envoy's wasm log level (proxy-wasm LogLevel: 0 trace .. 5 critical).
    pub log_level: u32,
    /// Connect timeout of every cluster (envoy/envoy.yaml: 0.25 s).
    pub connect_timeout: Duration,
    /// Copy the module's log lines to stderr as they come.
    pub echo_log: bool,
    /// Print every callback and host call with the fuel left (`TESTHOST_TRACE`).
    pub trace: bool,
    /// Higress' Envoy: also offer `proxy_redis_init` / `proxy_redis_call` and call
    /// `proxy_on_redis_call_response`. Stock Envoy (false) has neither, so a module importing them
    /// fails to load.
    pub higress: bool,
}

impl ProxyConfig {
    /// Defaults that match envoy/envoy.yaml: vm_id, name and root_id `tollgate`, 2 workers, info level.
    pub fn new(wasm: impl Into<PathBuf>, plugin_config: &str) -> ProxyConfig {
        ProxyConfig {
            wasm: wasm.into(),
            plugin_config: plugin_config.to_string(),
            vm_config: String::new(),
            vm_id: "tollgate".to_string(),
            plugin_name: "tollgate".to_string(),
            root_id: "tollgate".to_string(),
            workers: 2,
            clusters: Vec::new(),
            log_level: 2,
            connect_timeout: Duration::from_millis(250),
            echo_log: std::env::var_os("TESTHOST_LOG").is_some(),
            trace: std::env::var_os("TESTHOST_TRACE").is_some(),
            higress: false,
        }
    }

    /// Adds a cluster at `addr`.
    pub fn cluster(mut self, name: &str, addr: SocketAddr) -> ProxyConfig {
        self.clusters.push((name.to_string(), Some(addr)));
        self
    }
}

/// The functions a module imports, as `module.name` (e.g. `env.proxy_redis_call`), and the names it
/// exports.
pub fn module_interface(wasm: &std::path::Path) -> Result<(Vec<String>, Vec<String>), String> {
    let bytes = std::fs::read(wasm).map_err(|e| format!("read {}: {e}", wasm.display()))?;
    let engine = wasmi::Engine::default();
    let module = wasmi::Module::new(&engine, bytes).map_err(|e| e.to_string())?;
    let imports = module
        .imports()
        .map(|i| format!("{}.{}", i.module(), i.name()))
        .collect();
    let exports = module.exports().map(|e| e.name().to_string()).collect();
    Ok((imports, exports))
}

/// A custom metric (Envoy shows it as `wasmcustom.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    Counter(u64),
    Gauge(i64),
    /// Number of values recorded and their sum.
    Histogram {
        count: u64,
        sum: u64,
    },
}

/// What the module has cost so far, summed over every worker: wasm instructions executed (wasmi's
/// fuel, one unit per instruction and a little more for memory and calls) and host calls made, by
/// import name. Deterministic for a given module and sequence of requests, unlike CPU time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cost {
    pub fuel: u64,
    /// The same fuel by the callback (export) the host called.
    pub fuel_by_callback: BTreeMap<String, u64>,
    pub host_calls: BTreeMap<String, u64>,
}

impl Cost {
    /// What was spent since `before`.
    pub fn since(&self, before: &Cost) -> Cost {
        let since = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(then.get(k).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, v)| *v > 0)
                .collect()
        };
        Cost {
            fuel: self.fuel.saturating_sub(before.fuel),
            fuel_by_callback: since(&self.fuel_by_callback, &before.fuel_by_callback),
            host_calls: since(&self.host_calls, &before.host_calls),
        }
    }

    /// Host calls of every kind.
    pub fn calls(&self) -> u64 {
        self.host_calls.values().sum()
    }
}

/// What every worker of one proxy shares (Envoy: the process).
pub(crate) struct Shared {
    pub config: ProxyConfig,
    pub data: Mutex<SharedData>,
    pub stats: Mutex<BTreeMap<String, Stat>>,
    pub log: Mutex<Vec<String>>,
    pub clusters: Mutex<HashMap<String, Option<SocketAddr>>>,
    /// How many times each cluster was removed or defined anew: a new definition is a new
    /// thread-local cluster entry in each worker (Envoy), with a Redis client of Higress' defaults.
    pub removals: Mutex<HashMap<String, u64>>,
    pub traps: Mutex<Vec<String>>,
    pub unmodelled: Mutex<BTreeSet<String>>,
    pub cost: Mutex<Cost>,
    pub queues: Mutex<SharedQueues>,
    /// Each worker's root context's tick period when it was deleted: Envoy's tick timer outlives
    /// a deleted root and re-arms with that period (`Wasm::tickHandler`), waking the worker for
    /// nothing, so a root must leave it at zero.
    pub ticks_left: Mutex<Vec<Duration>>,
}

impl Shared {
    pub fn log_line(&self, line: String) {
        if self.config.echo_log {
            eprintln!("{line}");
        }
        if let Ok(mut log) = self.log.lock() {
            log.push(line);
        }
    }

    pub fn host_call(&self, name: &str) {
        if let Ok(mut c) = self.cost.lock() {
            *c.host_calls.entry(name.to_string()).or_insert(0) += 1;
        }
    }

    pub fn fuel(&self, callback: &str, spent: u64) {
        if let Ok(mut c) = self.cost.lock() {
            c.fuel = c.fuel.saturating_add(spent);
            *c.fuel_by_callback.entry(callback.to_string()).or_insert(0) += spent;
        }
    }

    pub fn unmodelled(&self, what: &str) {
        if let Ok(mut u) = self.unmodelled.lock() {
            u.insert(what.to_string());
        }
    }

    pub fn cluster(&self, name: &str) -> Option<Option<SocketAddr>> {
        self.clusters.lock().ok()?.get(name).copied()
    }

    /// Which definition of cluster `name` is current (see `removals`).
    pub fn definition(&self, name: &str) -> u64 {
        self.removals
            .lock()
            .ok()
            .and_then(|r| r.get(name).copied())
            .unwrap_or(0)
    }
}

/// proxy-wasm-cpp-host src/shared_data.cc: one map per VM id under one mutex; a set with a non-zero
/// CAS that does not match fails with CasMismatch; a set of an absent key always succeeds; every set
/// takes the next CAS (starting at 1, skipping 0).
/// Shared queues as Envoy keeps them: a name (per VM id; one VM id per proxy here) gets one
/// token for the process's life; registering it again moves its callbacks to the later
/// registrant's worker. Each enqueue posts one `proxy_on_queue_ready` to the owner's worker.
#[derive(Default)]
pub(crate) struct SharedQueues {
    by_name: HashMap<String, u32>,
    queues: HashMap<u32, SharedQueue>,
}

pub(crate) struct SharedQueue {
    /// The registering worker's events and root context.
    owner: std::sync::mpsc::Sender<worker::Event>,
    root: u32,
    items: std::collections::VecDeque<Vec<u8>>,
}

impl SharedQueues {
    pub fn register(
        &mut self,
        name: &str,
        owner: std::sync::mpsc::Sender<worker::Event>,
        root: u32,
    ) -> u32 {
        let next = self.by_name.len() as u32 + 1;
        let token = *self.by_name.entry(name.to_string()).or_insert(next);
        let items = self
            .queues
            .remove(&token)
            .map(|q| q.items)
            .unwrap_or_default();
        self.queues
            .insert(token, SharedQueue { owner, root, items });
        token
    }

    /// False if no queue has this token.
    pub fn enqueue(&mut self, token: u32, value: Vec<u8>) -> bool {
        let Some(q) = self.queues.get_mut(&token) else {
            return false;
        };
        q.items.push_back(value);
        let _ = q.owner.send(worker::Event::QueueReady {
            root: q.root,
            token,
        });
        true
    }

    /// None if no queue has this token; Some(None) if it is empty.
    pub fn dequeue(&mut self, token: u32) -> Option<Option<Vec<u8>>> {
        Some(self.queues.get_mut(&token)?.items.pop_front())
    }
}

pub(crate) struct SharedData {
    map: HashMap<String, (Vec<u8>, u32)>,
    cas: u32,
}

impl SharedData {
    fn new() -> SharedData {
        SharedData {
            map: HashMap::new(),
            cas: 1,
        }
    }

    fn next_cas(&mut self) -> u32 {
        let out = self.cas;
        self.cas = self.cas.wrapping_add(1);
        if self.cas == 0 {
            self.cas = 1;
        }
        out
    }

    pub fn get(&self, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        self.map
            .get(&String::from_utf8_lossy(key).into_owned())
            .cloned()
    }

    /// Ok, or Err(CasMismatch).
    pub fn set(&mut self, key: &[u8], value: &[u8], cas: u32) -> Result<(), ()> {
        let key = String::from_utf8_lossy(key).into_owned();
        let next = self.next_cas();
        match self.map.get_mut(&key) {
            Some(entry) => {
                if cas != 0 && cas != entry.1 {
                    return Err(());
                }
                *entry = (value.to_vec(), next);
            }
            None => {
                self.map.insert(key, (value.to_vec(), next));
            }
        }
        Ok(())
    }
}

/// One test-host proxy. Dropping it stops the listener and every worker.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    workers: Vec<mpsc::Sender<worker::Event>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Loads the module into every worker, runs `on_vm_start` and `on_configure` on each root
    /// context, and listens on a free loopback port. Err(log) when the module fails to load or a
    /// root context rejects the configuration (Envoy refuses to start then).
    pub fn start(config: ProxyConfig) -> Result<Proxy, String> {
        let wasm = std::fs::read(&config.wasm)
            .map_err(|e| format!("read {}: {e}", config.wasm.display()))?;
        let shared = Arc::new(Shared {
            clusters: Mutex::new(config.clusters.iter().cloned().collect()),
            removals: Mutex::new(HashMap::new()),
            config: config.clone(),
            data: Mutex::new(SharedData::new()),
            stats: Mutex::new(BTreeMap::new()),
            log: Mutex::new(Vec::new()),
            traps: Mutex::new(Vec::new()),
            unmodelled: Mutex::new(BTreeSet::new()),
            cost: Mutex::new(Cost::default()),
            queues: Mutex::new(SharedQueues::default()),
            ticks_left: Mutex::new(Vec::new()),
        });
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        let mut ready = Vec::new();
        for index in 0..config.workers.max(1) {
            let (tx, rx) = mpsc::channel();
            let (ready_tx, ready_rx) = mpsc::channel();
            let shared2 = shared.clone();
            let wasm2 = wasm.clone();
            let tx2 = tx.clone();
            // The interpreter and the module's own stack want more than the default 2 MiB.
            let thread = std::thread::Builder::new()
                .name(format!("testhost-w{index}"))
                .stack_size(64 << 20)
                .spawn(move || worker::run(index, shared2, &wasm2, tx2, rx, ready_tx))
                .map_err(|e| format!("spawn worker: {e}"))?;
            threads.push(thread);
            workers.push(tx);
            ready.push(ready_rx);
        }
        let mut failure = None;
        for r in ready {
            match r.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failure = Some(e),
                Err(_) => failure = Some("worker thread died".to_string()),
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let mut proxy = Proxy {
            port,
            shared,
            workers,
            threads,
            stop,
        };
        if let Some(e) = failure {
            return Err(format!("{e}\n--- log ---\n{}", proxy.log_text()));
        }
        let stop2 = proxy.stop.clone();
        let workers2 = proxy.workers.clone();
        proxy.threads.push(std::thread::spawn(move || {
            let next = AtomicUsize::new(0);
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                // Envoy spreads connections over workers (the kernel does, with reuse_port); here
                // round robin, so consecutive connections land on different workers.
                let i = next.fetch_add(1, Ordering::SeqCst) % workers2.len();
                let tx = workers2[i].clone();
                std::thread::spawn(move || net::serve_connection(conn, tx));
            }
        }));
        Ok(proxy)
    }

    /// The listener's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every log line so far (`[w<worker>] <level> <message>`).
    pub fn log_text(&self) -> String {
        self.shared
            .log
            .lock()
            .map(|l| l.join("\n"))
            .unwrap_or_default()
    }

    /// The custom metric `name` as Envoy's `/stats` names it (`wasmcustom.<name>`).
    pub fn stat(&self, name: &str) -> Option<Stat> {
        let name = name.strip_prefix("wasmcustom.")?;
        self.shared.stats.lock().ok()?.get(name).copied()
    }

    /// The counter or gauge `name` (`wasmcustom.<name>`), like `Envoy::stat_value`.
    pub fn stat_value(&self, name: &str) -> Option<u64> {
        match self.stat(name)? {
            Stat::Counter(v) => Some(v),
            Stat::Gauge(v) => u64::try_from(v).ok(),
            Stat::Histogram { .. } => None,
        }
    }

    /// Traps (VM failures) so far, with the callback that trapped.
    pub fn traps(&self) -> Vec<String> {
        self.shared
            .traps
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// The tick period each stopped worker's root context left armed when it was deleted (see
    /// [`Proxy::stop`]): zero unless the module leaves the host a timer to run for nothing.
    pub fn ticks_left(&self) -> Vec<Duration> {
        self.shared
            .ticks_left
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// What the module has cost so far (see [`Cost`]).
    pub fn cost(&self) -> Cost {
        self.shared
            .cost
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Host calls the module made that this host does not model (each once).
    pub fn unmodelled(&self) -> Vec<String> {
        self.shared
            .unmodelled
            .lock()
            .map(|u| u.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Adds or changes a cluster while running (as xDS would).
    pub fn set_cluster(&self, name: &str, addr: Option<SocketAddr>) {
        if let Ok(mut c) = self.shared.clusters.lock() {
            c.insert(name.to_string(), addr);
        }
    }

    /// Removes a cluster while running (as xDS would): the workers no longer know it, and a later
    /// `set_cluster` of the name is a new definition, whose Redis client each worker sets up anew.
    pub fn remove_cluster(&self, name: &str) {
        if let Ok(mut c) = self.shared.clusters.lock() {
            c.remove(name);
        }
        self.new_definition(name);
    }

    /// Defines a cluster anew in one push (as xDS does when a cluster's definition changes): the
    /// workers know it throughout, and each worker's Redis client for it starts from Higress'
    /// defaults.
    pub fn redefine_cluster(&self, name: &str, addr: SocketAddr) {
        self.set_cluster(name, Some(addr));
        self.new_definition(name);
    }

    fn new_definition(&self, name: &str) {
        if let Ok(mut r) = self.shared.removals.lock() {
            *r.entry(name.to_string()).or_default() += 1;
        }
    }

    /// The number of workers (VMs).
    pub fn workers(&self) -> usize {
        self.workers.len()
    }
}

impl Proxy {
    /// Stops the proxy: each worker's root context is shut down as Envoy does when a plugin is
    /// removed (`proxy_on_done`, then `proxy_on_delete`), and the workers end. Stats, logs and
    /// costs stay readable.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in &self.workers {
            let _ = w.send(worker::Event::Stop);
        }
        // Wake the listener so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::SharedData;

    /// proxy-wasm-cpp-host SharedData::set: absent key always set (whatever CAS); present key with
    /// a stale non-zero CAS refused; CAS 0 always overwrites; every set bumps the CAS.
    #[test]
    fn shared_data_cas() {
        let mut d = SharedData::new();
        assert_eq!(d.get(b"k"), None);
        assert_eq!(d.set(b"k", b"a", 12345), Ok(()));
        let (v, cas) = d.get(b"k").unwrap();
        assert_eq!((v.as_slice(), cas), (&b"a"[..], 1));
        assert_eq!(d.set(b"k", b"b", cas + 1), Err(()));
        assert_eq!(d.set(b"k", b"b", cas), Ok(()));
        assert_eq!(d.set(b"k", b"c", cas), Err(()), "the CAS moved on");
        assert_eq!(d.set(b"k", b"d", 0), Ok(()));
        assert_eq!(d.get(b"k").unwrap().0, b"d");
        assert!(d.get(b"k").unwrap().1 > cas);
    }

    #[test]
    fn cas_skips_zero() {
        let mut d = SharedData::new();
        d.cas = u32::MAX;
        assert_eq!(d.next_cas(), u32::MAX);
        assert_eq!(d.next_cas(), 1);
    }
}
