//! What each scenario runs: its Envoy (a template under envoy/bench/, or envoy/envoy.yaml with a
//! tollgate configuration), which build of the filter, and how many proxies. Every tollgate
//! scenario keeps `failure_mode: closed`, so a backend failure shows as a 503, never as a silent
//! admission that would flatter the figures.

use std::path::Path;

use tollgate_e2e as common;

use common::envoy::{brief_log, envoy_file, Envoy};
use tollgate_tools::configs::{self, render_bench_template, Ports};

use crate::args::Settings;
use crate::builds::Builds;

/// The path every load requests; tollgate's bench rule matches `/api/` (`RULE_PREFIX`), and Envoy
/// answers it itself (a direct response: no application behind it).
pub const PATH: &str = "/api/bench";
pub const RULE_PREFIX: &str = "/api/";
/// The header tollgate's bench rule is keyed on (and the one the wasm floor reads).
pub const USER_HEADER: &str = "x-user-id";
/// h2load clients per proxy in the paced (limited) scenarios.
pub const PACED_CLIENTS: u32 = 10;
/// The limit of the non-limited tollgate scenarios: far above anything this machine can send.
pub const HUGE_RATE: u64 = 1_000_000;
/// The query parameter the flood and tenant rules are keyed on (h2load sends fixed headers, but can
/// take its URIs from a file).
pub const QUERY_KEY: &str = "k";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// A template under envoy/bench/.
    Template(&'static str),
    /// envoy/envoy.yaml with tollgate in this mode, limit never reached.
    Tollgate(&'static str),
    /// envoy/envoy.yaml with tollgate in this mode keyed on `query:k`, every request a new key, limit
    /// never reached.
    Flood(&'static str),
    /// Two Envoys with envoy/envoy.yaml, tollgate in this mode, one hot key.
    Limited(&'static str),
    /// The load and configuration of its A scenario (the one whose name it has without `-b`:
    /// `Tollgate(mode)`, or with `flood` `Flood(mode)`), on the filter built at `--compare-wasm`; runs
    /// only with it, in the same rounds as its A scenario (and, if that is sliced, in the same slices).
    Compared { mode: &'static str, flood: bool },
    /// envoy/envoy.yaml with tollgate in lease mode as in `Tollgate("lease")`, but tollgate.wasm's
    /// `proxy_on_response_body` export renamed, so Envoy never calls into the VM for a response's
    /// body: next to tollgate-lease in the same slices, what reading bodies costs a request whose
    /// rule has no `usage.body_field`.
    BodyUnexported,
    /// envoy/envoy.yaml with tollgate in exact mode as in `Tollgate("exact")`, but the filter as main
    /// had it when issue 17 was filed (`BASELINE_COMMIT`), built by the bench.
    Baseline,
    /// One Envoy, tollgate in lease mode keyed on `query:k` at the limited rate: one hot key (the tenant)
    /// paced over its limit, with or without a concurrent flood of new keys on the same Envoy.
    Tenant { flood: bool },
}

#[derive(Debug, Clone, Copy)]
pub struct Def {
    pub name: &'static str,
    pub setup: Setup,
    pub what: &'static str,
}

pub const SCENARIOS: [Def; 18] = [
    Def {
        name: "plain",
        setup: Setup::Template("plain.yaml"),
        what: "Envoy, same route, no rate-limit filter",
    },
    Def {
        name: "native",
        setup: Setup::Template("native.yaml"),
        what: "Envoy's local_ratelimit, bucket never empties",
    },
    Def {
        name: "wasm-floor",
        setup: Setup::Template("wasm-floor.yaml"),
        what: "empty proxy-wasm filter: reads one header, continues",
    },
    Def {
        name: "wasm-floor-calls",
        setup: Setup::Template("wasm-floor-calls.yaml"),
        what: "the wasm floor making tollgate-lease's host calls per request, with no logic",
    },
    Def {
        name: "wasm-floor-hold",
        setup: Setup::Template("wasm-floor-hold.yaml"),
        what: "the wasm floor holding each request for a callout shared by the requests that \
               came while the one before was out, with no logic",
    },
    Def {
        name: "tollgate-exact",
        setup: Setup::Tollgate("exact"),
        what: "tollgate mode exact, one key, limit never reached",
    },
    Def {
        name: "tollgate-exact-b",
        setup: Setup::Compared {
            mode: "exact",
            flood: false,
        },
        what: "tollgate-exact with the filter from --compare-wasm (runs only with it)",
    },
    Def {
        name: "tollgate-exact-baseline",
        setup: Setup::Baseline,
        what: "tollgate-exact with the filter before the engine's rewrite (BASELINE_COMMIT)",
    },
    Def {
        name: "tollgate-lease",
        setup: Setup::Tollgate("lease"),
        what: "tollgate mode lease, one key, limit never reached",
    },
    Def {
        name: "tollgate-lease-b",
        setup: Setup::Compared {
            mode: "lease",
            flood: false,
        },
        what: "tollgate-lease with the filter from --compare-wasm (runs only with it)",
    },
    Def {
        name: "tollgate-lease-no-body-export",
        setup: Setup::BodyUnexported,
        what: "tollgate-lease with proxy_on_response_body not exported (Envoy never calls it)",
    },
    Def {
        name: "tollgate-flood-exact",
        setup: Setup::Flood("exact"),
        what: "tollgate mode exact, every request a new key (random keys), limit never reached",
    },
    Def {
        name: "tollgate-flood-exact-b",
        setup: Setup::Compared {
            mode: "exact",
            flood: true,
        },
        what: "tollgate-flood-exact with the filter from --compare-wasm (runs only with it)",
    },
    Def {
        name: "tollgate-flood-lease",
        setup: Setup::Flood("lease"),
        what: "tollgate mode lease, every request a new key, limit never reached",
    },
    Def {
        name: "tollgate-limited-exact",
        setup: Setup::Limited("exact"),
        what: "two Envoys, one hot key far over its limit, mode exact",
    },
    Def {
        name: "tollgate-limited-lease",
        setup: Setup::Limited("lease"),
        what: "two Envoys, one hot key far over its limit, mode lease",
    },
    Def {
        name: "tollgate-tenant-quiet",
        setup: Setup::Tenant { flood: false },
        what: "one Envoy, mode lease, one hot key (the tenant) far over its limit",
    },
    Def {
        name: "tollgate-tenant-flood",
        setup: Setup::Tenant { flood: true },
        what: "tollgate-tenant-quiet while every other request is a new key on the same Envoy",
    },
];

/// The scenarios `settings` ask for, in table order: plain always (every ratio's baseline), the
/// rest as `--only` says, and a `-b` scenario only with `--compare-wasm`, when its A scenario runs
/// (or `--only` names it).
pub fn selected(settings: &Settings) -> Vec<Def> {
    let asked = |name: &str| {
        name == "plain"
            || settings
                .only
                .as_ref()
                .is_none_or(|only| only.iter().any(|n| n == name))
    };
    SCENARIOS
        .iter()
        .filter(|d| match d.a_side() {
            Some(a) => settings.compare_wasm.is_some() && (asked(a) || asked(d.name)),
            None => asked(d.name),
        })
        .copied()
        .collect()
}

impl Def {
    /// For a scenario on the `--compare-wasm` build, the name of the scenario it is the B side of.
    pub fn a_side(&self) -> Option<&'static str> {
        match self.setup {
            Setup::Compared { .. } => self.name.strip_suffix("-b"),
            _ => None,
        }
    }

    /// Whether every request carries a key never sent before (one h2load process per connection).
    pub fn flood(&self) -> bool {
        matches!(
            self.setup,
            Setup::Flood(_) | Setup::Compared { flood: true, .. }
        )
    }

    pub fn tollgate_mode(&self) -> Option<&'static str> {
        match self.setup {
            Setup::Template(_) => None,
            Setup::Tollgate(m) | Setup::Flood(m) | Setup::Limited(m) => Some(m),
            Setup::Compared { mode, .. } => Some(mode),
            Setup::Tenant { .. } | Setup::BodyUnexported => Some("lease"),
            Setup::Baseline => Some("exact"),
        }
    }

    /// How many Envoys the scenario runs.
    pub fn proxies(&self) -> usize {
        if matches!(self.setup, Setup::Limited(_)) {
            2
        } else {
            1
        }
    }

    /// Paced (open loop) to one hot key over its limit: admitted ÷ ideal applies, and its req/s and
    /// latency are not compared with plain's.
    pub fn paced(&self) -> bool {
        matches!(self.setup, Setup::Limited(_) | Setup::Tenant { .. })
    }

    /// One h2load process in a closed loop to one key: the scenarios whose CPU per request is
    /// compared with the wasm floor's, measured in interleaved slices within a round (see
    /// `Bench::measure_sliced`). Not the floods: their 16 h2load processes and fresh URI lists
    /// per load cost the machine too much at the start of a short slice (sliced, both floods ran
    /// at 2/3 of their unsliced req/s and twice their p99).
    pub fn sliced(&self) -> bool {
        matches!(
            self.setup,
            Setup::Template(_)
                | Setup::Tollgate(_)
                | Setup::Compared { flood: false, .. }
                | Setup::BodyUnexported
                | Setup::Baseline
        )
    }
}

/// tollgate's plugin configuration for scenario `name`: its one rule on the bench's path.
pub fn tollgate_config(name: &str, mode: &str, key: &str, rate: u64, burst: u64) -> String {
    configs::tollgate_config(name, mode, key, (rate, burst), RULE_PREFIX)
}

/// The parts of an Envoy template outside `http_filters`, without comments: the bench templates must
/// match envoy/envoy.yaml there.
pub fn outside_filters(yaml: &str) -> (String, String) {
    let lines: Vec<&str> = yaml
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == "http_filters:")
        .unwrap_or(lines.len());
    let router = lines
        .iter()
        .position(|l| l.trim() == "- name: envoy.filters.http.router")
        .unwrap_or(lines.len());
    (
        lines[..start].join("\n"),
        lines[router.max(start)..].join("\n"),
    )
}

/// Warnings for envoy/bench/ templates that drifted from envoy/envoy.yaml outside http_filters.
pub fn template_drift() -> Vec<String> {
    let main = outside_filters(&envoy_file("envoy.yaml"));
    SCENARIOS
        .iter()
        .filter_map(|d| match d.setup {
            Setup::Template(file) => {
                let text = envoy_file(&format!("bench/{file}"));
                (outside_filters(&text) != main).then(|| {
                    format!("envoy/bench/{file} differs from envoy/envoy.yaml outside http_filters")
                })
            }
            _ => None,
        })
        .collect()
}

/// One scenario's running proxies.
pub struct Running {
    pub def: Def,
    pub envoys: Vec<Envoy>,
}

/// Starts scenario `d`'s Envoys (two for the limited scenarios), each waiting for its own /ready.
pub fn start_scenario(
    dir: &Path,
    backend_port: u16,
    builds: &Builds,
    settings: &Settings,
    d: Def,
) -> Result<Vec<Envoy>, String> {
    let start_one = || {
        let header_key = format!("header:{USER_HEADER}");
        let query_key = format!("query:{QUERY_KEY}");
        let tollgate = |mode: &str, key: &str, rate: u64, burst: u64| {
            Envoy::try_start(
                dir,
                &tollgate_config(d.name, mode, key, rate, burst),
                backend_port,
            )
        };
        // A tollgate configuration, unlimited, on another build of the filter.
        let unlimited_with = |wasm: &Path, mode: &str, key: &str| {
            Envoy::try_start_wasm(
                dir,
                wasm,
                &tollgate_config(d.name, mode, key, HUGE_RATE, HUGE_RATE),
                (backend_port, common::envoy::NO_UPSTREAM),
            )
        };
        let (rate, burst) = (settings.limited_rate, settings.limited_burst);
        let started = match d.setup {
            Setup::Template(file) => {
                let text = envoy_file(&format!("bench/{file}"));
                Envoy::try_start_yaml(dir, |listen, admin| {
                    let ports = Ports {
                        backend: backend_port,
                        listen,
                        admin,
                        upstream: common::envoy::NO_UPSTREAM,
                    };
                    render_bench_template(&text, ports, &builds.floor)
                })
            }
            Setup::Tollgate(mode) => tollgate(mode, &header_key, HUGE_RATE, HUGE_RATE),
            Setup::Compared { mode, flood } => match &settings.compare_wasm {
                Some(wasm) => {
                    unlimited_with(wasm, mode, if flood { &query_key } else { &header_key })
                }
                None => Err(format!("{} runs only with --compare-wasm", d.name)),
            },
            Setup::BodyUnexported => unlimited_with(&builds.body_unexported, "lease", &header_key),
            Setup::Baseline => Envoy::try_start_wasm(
                dir,
                &builds.baseline,
                &tollgate_config(d.name, "exact", &header_key, HUGE_RATE, HUGE_RATE),
                (backend_port, common::envoy::NO_UPSTREAM),
            ),
            Setup::Flood(mode) => tollgate(mode, &query_key, HUGE_RATE, HUGE_RATE),
            Setup::Limited(mode) => tollgate(mode, &header_key, rate, burst),
            Setup::Tenant { .. } => tollgate("lease", &query_key, rate, burst),
        };
        started.map_err(|log| format!("envoy for {} did not start:\n{}", d.name, brief_log(&log)))
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..d.proxies()).map(|_| s.spawn(start_one)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("envoy start thread"))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(settings: &Settings) -> Vec<&'static str> {
        selected(settings).iter().map(|d| d.name).collect()
    }

    /// Each `-b` scenario is its A scenario's load and configuration on the other build: same
    /// mode, same key source, sliced alike, so that they are measured the same way.
    #[test]
    fn every_b_scenario_mirrors_its_a_scenario() {
        let mut found = 0;
        for b in SCENARIOS.iter().filter(|d| d.a_side().is_some()) {
            found += 1;
            let a_name = b.a_side().unwrap_or_default();
            let a = SCENARIOS.iter().find(|d| d.name == a_name);
            let a = a.unwrap_or_else(|| panic!("{}: no scenario {a_name}", b.name));
            assert_eq!(a.tollgate_mode(), b.tollgate_mode(), "{}", b.name);
            assert_eq!(a.flood(), b.flood(), "{}", b.name);
            assert_eq!(a.sliced(), b.sliced(), "{}", b.name);
            assert_eq!(a.proxies(), b.proxies(), "{}", b.name);
            let same_setup = match (a.setup, b.setup) {
                (Setup::Tollgate(m), Setup::Compared { mode, flood: false })
                | (Setup::Flood(m), Setup::Compared { mode, flood: true }) => m == mode,
                _ => false,
            };
            assert!(same_setup, "{}: {:?} vs {:?}", b.name, a.setup, b.setup);
        }
        assert_eq!(found, 3);
    }

    #[test]
    fn b_scenarios_run_only_with_compare_wasm_and_their_a_side() {
        let plain = Settings::default();
        assert!(names(&plain).iter().all(|n| !n.ends_with("-b")));
        let compared = Settings {
            compare_wasm: Some("/tmp/b.wasm".into()),
            ..Settings::default()
        };
        let all = names(&compared);
        for b in [
            "tollgate-lease-b",
            "tollgate-exact-b",
            "tollgate-flood-exact-b",
        ] {
            assert!(all.contains(&b), "{b} in {all:?}");
        }
        let only = |list: &[&str]| Settings {
            only: Some(list.iter().map(|n| n.to_string()).collect()),
            ..compared.clone()
        };
        assert_eq!(
            names(&only(&["tollgate-flood-exact"])),
            ["plain", "tollgate-flood-exact", "tollgate-flood-exact-b"]
        );
        assert_eq!(
            names(&only(&["tollgate-exact-b"])),
            ["plain", "tollgate-exact-b"]
        );
    }
}
