//! Every recipe of docs/recipes.md, run as the page writes it: for each `##` recipe heading, real
//! Redis, Webdis and Envoy 1.40 on free ports, the recipe's own ```json configuration in the
//! filter, its `jwt_authn` filter (if any) before tollgate, its ```sh blocks run with bash, and
//! what they print compared with the ```text block that follows each.
//!
//! Invariant: the page and this test cannot drift apart. A heading this test does not know fails
//! it, a recipe without its blocks fails it, and the only changes made to what the page says are
//! the ones the page's "How these recipes are tested" lists (ports, the token, the JWKS, Istio's
//! cluster name, the LLM and login routes). How answers are compared (counts within what the rules refill
//! while the loops run) is written there too, and unit-tested here.
//! Needs `make setup` (Envoy, Redis, Webdis, curl, openssl) and `make build`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::envoy::{brief_log, render_envoy_yaml, Envoy, NO_UPSTREAM};
use common::jwt::Jwt;
use common::upstream::Upstream;
use common::{Redis, Webdis};
use tollgate_core::config::Config;
use tollgate_core::rule::bucket_key;

/// The page, from the repository root.
const PAGE: &str = "docs/recipes.md";

/// What a recipe needs around the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// envoy/envoy.yaml as it is.
    Plain,
    /// The recipe's own `jwt_authn` filter before tollgate.
    Jwt,
    /// The `jwt_authn` filter Istio generates (the recipe's), and Webdis under Istio's cluster name.
    Istio,
    /// The `jwt_authn` filter of the per-user recipe and a stand-in LLM API under `/v1/`.
    Llm,
    /// A stand-in login service under `/login` that answers 401 to a wrong password.
    Login,
    /// The `jwt_authn` filter of the per-user recipe, and tokens of two users with a `plan` claim.
    Tiers,
}

/// Every recipe heading of the page and what it needs.
const RECIPES: &[(&str, Setup)] = &[
    (
        "Per user: 100 requests per minute by JWT subject",
        Setup::Jwt,
    ),
    ("Per user on Istio", Setup::Istio),
    ("Per client address: the catch-all", Setup::Plain),
    (
        "API keys, with a bigger limit for one customer",
        Setup::Plain,
    ),
    ("Tiers from the caller's plan", Setup::Tiers),
    ("Shadow rollout: watch before you enforce", Setup::Plain),
    ("LLM tokens: charge what each answer used", Setup::Llm),
    ("Wait instead of reject", Setup::Plain),
    ("Monthly quota with a per-minute cap", Setup::Plain),
    ("gRPC", Setup::Plain),
    ("Penalty box", Setup::Plain),
    ("Login brute force", Setup::Login),
];

/// The page's `##` headings that are not recipes.
const NOT_RECIPES: &[&str] = &["How to read a recipe", "How these recipes are tested"];

/// The recipe whose `jwt_authn` filter the LLM recipe reuses (the page links to it).
const JWT_RECIPE: &str = "Per user: 100 requests per minute by JWT subject";

/// Tokens the stand-in LLM API reports for every completion (the page says so).
const LLM_TOKENS: u64 = 1500;

/// The user the test signs tokens for (the page says so).
const USER: &str = "alice";

/// The `pro` user of the tiers recipe (the page says so).
const PRO_USER: &str = "bob";

/// A fenced block: its language (the fence's info string), text and opening line.
#[derive(Debug, Clone)]
struct Block {
    lang: String,
    text: String,
    line: usize,
}

/// A `##` section: its heading and fenced blocks, in order.
#[derive(Debug, Clone)]
struct Section {
    heading: String,
    blocks: Vec<Block>,
}

/// The `##` sections of `markdown` (a `## ` line inside a fence is not a heading).
fn sections(markdown: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        match open.take() {
            Some(mut block) => {
                if line.trim() == "```" {
                    if let Some(section) = out.last_mut() {
                        section.blocks.push(block);
                    }
                } else {
                    block.text.push_str(line);
                    block.text.push('\n');
                    open = Some(block);
                }
            }
            None => {
                if let Some(lang) = line.trim().strip_prefix("```") {
                    open = Some(Block {
                        lang: lang.trim().to_string(),
                        text: String::new(),
                        line: i + 1,
                    });
                } else if let Some(heading) = line.strip_prefix("## ") {
                    out.push(Section {
                        heading: heading.trim().to_string(),
                        blocks: Vec::new(),
                    });
                }
            }
        }
    }
    assert!(open.is_none(), "{PAGE}: a fenced block is never closed");
    out
}

fn page() -> Vec<Section> {
    let path = common::repo_root().join(PAGE);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    sections(&text)
}

fn section(heading: &str) -> Section {
    page()
        .into_iter()
        .find(|s| s.heading == heading)
        .unwrap_or_else(|| panic!("{PAGE}: no `## {heading}`"))
}

/// A recipe's parts: its configuration, its `jwt_authn` filter (YAML, if any), and its loops with
/// the answers each expects.
struct Recipe {
    config: String,
    jwt_filter: Option<String>,
    loops: Vec<(Block, String)>,
}

fn recipe(s: &Section) -> Recipe {
    let configs: Vec<&Block> = s.blocks.iter().filter(|b| b.lang == "json").collect();
    assert_eq!(
        configs.len(),
        1,
        "{PAGE} `## {}`: a recipe has exactly one ```json configuration",
        s.heading
    );
    let jwt_filter = s
        .blocks
        .iter()
        .find(|b| b.lang == "yaml" && b.text.contains("envoy.filters.http.jwt_authn"))
        .map(|b| b.text.clone());
    let mut loops = Vec::new();
    for (i, b) in s.blocks.iter().enumerate() {
        if b.lang != "sh" {
            continue;
        }
        let expected = s.blocks.get(i + 1).filter(|n| n.lang == "text");
        let expected = expected.unwrap_or_else(|| {
            panic!(
                "{PAGE} line {}: the ```sh block has no ```text block of expected answers after it",
                b.line
            )
        });
        loops.push((b.clone(), expected.text.clone()));
    }
    assert!(
        !loops.is_empty(),
        "{PAGE} `## {}`: a recipe has a ```sh loop",
        s.heading
    );
    Recipe {
        config: configs[0].text.clone(),
        jwt_filter,
        loops,
    }
}

// ---- comparing answers ----

/// How far a count may be from the page's: tokens that refill while the loops run, per rule.
struct Refill {
    /// (rule name, fastest rate in requests per millisecond of the rule, its overrides or tiers)
    rules: Vec<(String, f64)>,
}

impl Refill {
    /// From a configuration: each rule's rate (and its overrides' and tiers'), per millisecond, in
    /// requests.
    /// A usage rule's requests cost what the stand-in LLM reports.
    fn of(config: &str) -> Refill {
        let doc: serde_json::Value = serde_json::from_str(config).expect("a JSON configuration");
        let rules = doc["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(|r| {
                let period = r["period_ms"].as_u64().unwrap_or(1000);
                let unit = if r.get("usage").is_some() {
                    LLM_TOKENS
                } else {
                    1
                };
                let mut rate = r["rate"].as_u64().unwrap() as f64 / period as f64;
                let tiers = r["tiers"]["limits"]
                    .as_object()
                    .into_iter()
                    .flat_map(|t| t.values());
                for o in r["overrides"].as_array().into_iter().flatten().chain(tiers) {
                    if let Some(or) = o["rate"].as_u64() {
                        let op = o["period_ms"].as_u64().unwrap_or(period);
                        rate = rate.max(or as f64 / op as f64);
                    }
                }
                (r["name"].as_str().unwrap().to_string(), rate / unit as f64)
            })
            .collect();
        Refill { rules }
    }

    /// What the fastest rule refills in `elapsed`, rounded up.
    fn any(&self, elapsed: Duration) -> u64 {
        self.rules
            .iter()
            .map(|(_, rate)| (rate * elapsed.as_millis() as f64).ceil() as u64)
            .max()
            .unwrap_or(0)
    }

    /// What rule `name` refills in `elapsed`, rounded up (0 for a rule it does not know).
    fn rule(&self, name: &str, elapsed: Duration) -> u64 {
        self.rules
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, rate)| {
                (rate * elapsed.as_millis() as f64).ceil() as u64
            })
    }
}

/// One line of a loop's output, read the way the page explains.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// `uniq -c`: a count and its label.
    Count(u64, String),
    /// An Envoy counter, `wasmcustom.tollgate.<rule>.<name>: N`.
    Counter(String, u64),
    Text(String),
}

fn parse_line(line: &str) -> Line {
    let line = line.trim_end();
    // `uniq -c` pads its counts with spaces on the left.
    if line.starts_with(' ') {
        let rest = line.trim_start();
        if let Some((n, label)) = rest.split_once(' ') {
            if let Ok(n) = n.parse() {
                return Line::Count(n, label.trim().to_string());
            }
        }
        if let Ok(n) = rest.parse() {
            return Line::Count(n, String::new());
        }
    }
    if line.starts_with("wasmcustom.tollgate.") {
        if let Some((name, n)) = line.rsplit_once(": ") {
            if let Ok(n) = n.trim().parse() {
                return Line::Counter(name.to_string(), n);
            }
        }
    }
    Line::Text(line.to_string())
}

fn parse(text: &str) -> Vec<Line> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(parse_line)
        .collect()
}

/// Whether `actual` is what `expected` promises, each count within `slack` of the page's and each
/// counter within `counter_slack(rule)`; Err says what differs.
fn compare(
    expected: &str,
    actual: &str,
    slack: u64,
    counter_slack: impl Fn(&str) -> u64,
) -> Result<(), String> {
    let (want, got) = (parse(expected), parse(actual));
    let counts = |lines: &[Line]| -> Vec<(String, u64)> {
        lines
            .iter()
            .filter_map(|l| match l {
                Line::Count(n, label) => Some((label.clone(), *n)),
                _ => None,
            })
            .collect()
    };
    let (want_counts, got_counts) = (counts(&want), counts(&got));
    let total = |c: &[(String, u64)]| c.iter().map(|(_, n)| n).sum::<u64>();
    if total(&want_counts) != total(&got_counts) {
        return Err(format!(
            "{} answers counted, the page shows {}",
            total(&got_counts),
            total(&want_counts)
        ));
    }
    for (label, n) in &got_counts {
        if !want_counts.iter().any(|(l, _)| l == label) {
            return Err(format!("{n} answers `{label}`, which the page never shows"));
        }
    }
    for (label, want_n) in &want_counts {
        let got_n = got_counts
            .iter()
            .filter(|(l, _)| l == label)
            .map(|(_, n)| n)
            .sum::<u64>();
        if *want_n > 0 && got_n == 0 {
            return Err(format!("no answer `{label}`; the page shows {want_n}"));
        }
        if got_n.abs_diff(*want_n) > slack {
            return Err(format!(
                "{got_n} answers `{label}`, the page shows {want_n} (at most {slack} apart: what refilled)"
            ));
        }
    }
    let rest = |lines: Vec<Line>| -> Vec<Line> {
        lines
            .into_iter()
            .filter(|l| !matches!(l, Line::Count(..)))
            .collect()
    };
    let (want_rest, got_rest) = (rest(want), rest(got));
    if want_rest.len() != got_rest.len() {
        return Err(format!(
            "{} other lines, the page shows {}: {got_rest:?}",
            got_rest.len(),
            want_rest.len()
        ));
    }
    for (w, g) in want_rest.iter().zip(&got_rest) {
        match (w, g) {
            (Line::Counter(wn, wv), Line::Counter(gn, gv)) if wn == gn => {
                let rule = wn
                    .strip_prefix("wasmcustom.tollgate.")
                    .and_then(|r| r.split('.').next())
                    .unwrap_or_default();
                let s = counter_slack(rule);
                if gv.abs_diff(*wv) > s {
                    return Err(format!(
                        "{gn}: {gv}, the page shows {wv} (at most {s} apart)"
                    ));
                }
            }
            _ if w == g => {}
            _ => return Err(format!("`{g:?}` where the page shows `{w:?}`")),
        }
    }
    Ok(())
}

// ---- running a recipe ----

/// Redis, Webdis, the stand-in application (if any) and Envoy for one recipe.
struct Run {
    envoy: Envoy,
    _app: Option<Upstream>,
    webdis: Webdis,
    redis: Redis,
    dir: std::path::PathBuf,
    env: Vec<(String, String)>,
    /// The configuration Envoy runs.
    config: String,
}

impl Run {
    fn logs(&self) -> String {
        format!(
            "--- envoy ---\n{}\n--- webdis ---\n{}\n--- redis ---\n{}",
            brief_log(&self.envoy.log_text()),
            self.webdis.log_text(),
            self.redis.proc.log_text()
        )
    }
}

/// The value of `name:` on a line of `yaml` (e.g. the issuer).
fn yaml_value(yaml: &str, name: &str) -> String {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no `{name}:` in\n{yaml}"))
        .trim()
        .to_string()
}

/// The stand-in LLM API: every answer a chat completion that used [`LLM_TOKENS`] tokens.
fn llm_stand_in() -> Upstream {
    Upstream::start_with(|_| {
        let body = format!(
            r#"{{"object":"chat.completion","choices":[{{"message":{{"content":"..."}}}}],"usage":{{"prompt_tokens":12,"completion_tokens":{},"total_tokens":{LLM_TOKENS}}}}}"#,
            LLM_TOKENS - 12
        );
        vec![format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()]
    })
}

/// The user and password the stand-in login service accepts (the page says so).
const LOGIN: (&str, &str) = ("alice", "secret");

/// The stand-in login service: `200` to HTTP Basic credentials of [`LOGIN`], `401` to any other.
fn login_stand_in() -> Upstream {
    let right = format!(
        "basic {}",
        common::http::base64(format!("{}:{}", LOGIN.0, LOGIN.1).as_bytes())
    );
    Upstream::start_with(move |head| {
        let authorized = head.lines().any(|line| {
            line.split_once(':').is_some_and(|(name, value)| {
                name.eq_ignore_ascii_case("authorization")
                    && value.trim().eq_ignore_ascii_case(&right)
            })
        });
        let (status, body) = if authorized {
            ("200 OK", "welcome\n")
        } else {
            ("401 Unauthorized", "wrong user or password\n")
        };
        vec![format!(
            "HTTP/1.1 {status}\r\nwww-authenticate: Basic realm=\"login\"\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()]
    })
}

/// `config` with a backend timeout of 2 s unless it sets one: the tests share two cores, and a call
/// that outlived the default 50 ms would be answered by the failure mode, not by the bucket the page
/// describes.
fn with_patient_backend(config: &str) -> String {
    let mut doc: serde_json::Value = serde_json::from_str(config).unwrap();
    let backend = doc
        .as_object_mut()
        .unwrap()
        .entry("backend")
        .or_insert_with(|| serde_json::json!({}));
    backend
        .as_object_mut()
        .unwrap()
        .entry("timeout_ms")
        .or_insert(serde_json::json!(2000));
    doc.to_string()
}

/// Starts what `setup` needs, with `config` in the filter.
fn start(name: &str, setup: Setup, config: &str, jwt_filter: Option<&str>) -> Run {
    let config = &with_patient_backend(config);
    let dir = common::scratch_dir(name);
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let mut env = Vec::new();
    // The jwt_authn filter, its JWKS and a token for USER.
    let filter = jwt_filter.map(|yaml| {
        let jwt = Jwt::new(&dir, &yaml_value(yaml, "issuer"));
        let jwks_file = dir.join("jwks.json");
        std::fs::write(&jwks_file, &jwt.jwks).unwrap();
        env.push((
            "TOKEN".to_string(),
            jwt.token(serde_json::json!({ "sub": USER })),
        ));
        if setup == Setup::Tiers {
            for (name, sub, plan) in [("FREE_TOKEN", USER, "free"), ("PRO_TOKEN", PRO_USER, "pro")]
            {
                env.push((
                    name.to_string(),
                    jwt.token(serde_json::json!({ "sub": sub, "plan": plan })),
                ));
            }
        }
        yaml.replace("/etc/envoy/jwks.json", jwks_file.to_str().unwrap())
            .replace(
                "'<the JWKS istiod fetched from jwksUri>'",
                &format!("'{}'", jwt.jwks),
            )
            .lines()
            .map(|l| format!("          {l}\n"))
            .collect::<String>()
    });
    let app = match setup {
        Setup::Llm => Some(llm_stand_in()),
        Setup::Login => Some(login_stand_in()),
        _ => None,
    };
    let upstream = app.as_ref().map_or(NO_UPSTREAM, |a| a.port);
    let cluster = serde_json::from_str::<serde_json::Value>(config).unwrap()["backend"]["cluster"]
        .as_str()
        .map(str::to_string);
    let wasm = common::wasm_path();
    let envoy = Envoy::try_start_yaml(&dir, |listen, admin| {
        let mut yaml = render_envoy_yaml(config, webdis.port, listen, admin, &wasm, upstream);
        if let Some(filter) = &filter {
            let anchor = "          http_filters:\n";
            assert_eq!(yaml.matches(anchor).count(), 1);
            yaml = yaml.replace(anchor, &format!("{anchor}{filter}"));
        }
        if let (Setup::Istio, Some(cluster)) = (setup, &cluster) {
            yaml = yaml
                .replace(
                    "- name: tollgate_backend",
                    &format!("- name: \"{cluster}\""),
                )
                .replace(
                    "cluster_name: tollgate_backend",
                    &format!("cluster_name: \"{cluster}\""),
                );
        }
        if setup == Setup::Llm {
            yaml = yaml.replace("prefix: \"/app/\"", "prefix: \"/v1/\"");
        }
        if setup == Setup::Login {
            yaml = yaml.replace("prefix: \"/app/\"", "prefix: \"/login\"");
        }
        yaml
    })
    .unwrap_or_else(|log| panic!("envoy did not start; log:\n{}", brief_log(&log)));
    Run {
        envoy,
        _app: app,
        webdis,
        redis,
        dir,
        env,
        config: config.to_string(),
    }
}

/// Runs one ```sh block as a user would (bash, in the run's directory), with the page's addresses
/// replaced by the run's; its stdout.
fn run_sh(run: &Run, script: &str) -> String {
    let script = script
        .replace(
            "127.0.0.1:10000",
            &format!("127.0.0.1:{}", run.envoy.listen_port),
        )
        .replace(
            "127.0.0.1:9901",
            &format!("127.0.0.1:{}", run.envoy.admin_port),
        );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&run.dir)
        .envs(run.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run bash");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a recipe's loops in order and checks each against the page; returns the outputs.
fn check_loops(run: &Run, recipe: &Recipe, heading: &str) -> Vec<String> {
    let refill = Refill::of(&run.config);
    let t0 = Instant::now();
    let mut outputs = Vec::new();
    for (block, expected) in &recipe.loops {
        // A loop that reads Envoy's counters is polled: they reach /stats up to a second after
        // they are counted.
        let reads_stats = block.text.contains("127.0.0.1:9901");
        let deadline = Instant::now() + common::STATS_WAIT;
        let (output, verdict) = loop {
            let output = run_sh(run, &block.text);
            let elapsed = t0.elapsed();
            let verdict = compare(expected, &output, refill.any(elapsed), |rule| {
                refill.rule(rule, elapsed)
            });
            if verdict.is_ok() || !reads_stats || Instant::now() >= deadline {
                break (output, verdict);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        eprintln!(
            "{heading} (line {}), after {} ms:\n{output}",
            block.line,
            t0.elapsed().as_millis()
        );
        if let Err(e) = verdict {
            panic!(
                "{PAGE} line {}, `## {heading}`: {e}\n--- printed ---\n{output}--- the page shows ---\n{expected}\n{}",
                block.line,
                run.logs()
            );
        }
        outputs.push(output);
    }
    outputs
}

/// Runs the recipe under `heading` as the page writes it.
fn run_recipe(heading: &str) -> Run {
    let setup = RECIPES
        .iter()
        .find(|(h, _)| *h == heading)
        .map(|(_, s)| *s)
        .unwrap();
    let s = section(heading);
    let r = recipe(&s);
    let jwt_filter = match setup {
        Setup::Jwt | Setup::Istio => Some(
            r.jwt_filter
                .clone()
                .unwrap_or_else(|| panic!("{PAGE} `## {heading}`: no ```yaml jwt_authn filter")),
        ),
        Setup::Llm | Setup::Tiers => recipe(&section(JWT_RECIPE)).jwt_filter,
        Setup::Plain | Setup::Login => None,
    };
    let slug: String = heading
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("recipe-{slug}");
    let run = start(&name, setup, &r.config, jwt_filter.as_deref());
    check_loops(&run, &r, heading);
    run
}

/// Whether the bucket of `rule` for the key values `values` is in Redis (it is until it refills).
fn bucket_in_redis(run: &Run, rule: &str, values: &[&str]) -> bool {
    let cfg = Config::try_from(run.config.as_bytes()).unwrap();
    let r = cfg.rules.iter().find(|r| r.name == rule).unwrap();
    let values: Vec<Vec<u8>> = values.iter().map(|v| v.as_bytes().to_vec()).collect();
    run.redis
        .exists(&bucket_key(&cfg.key_prefix, rule, &r.key, &values))
}

// ---- the page ----

/// Every `##` heading is a recipe this test runs or one of the page's other sections, every recipe
/// has its blocks.
#[test]
fn every_heading_is_a_recipe_this_test_runs() {
    let sections = page();
    for s in &sections {
        let known = RECIPES.iter().find(|(h, _)| *h == s.heading);
        match known {
            None => assert!(
                NOT_RECIPES.contains(&s.heading.as_str()),
                "{PAGE}: `## {}` is a recipe no test runs (add it to RECIPES in tests/recipes.rs)",
                s.heading
            ),
            Some(_) => {
                let r = recipe(s);
                Config::try_from(r.config.as_bytes()).unwrap_or_else(|e| {
                    panic!(
                        "{PAGE} `## {}`: the configuration is invalid: {e}",
                        s.heading
                    )
                });
            }
        }
    }
    for (heading, _) in RECIPES {
        assert!(
            sections.iter().any(|s| s.heading == *heading),
            "{PAGE}: no `## {heading}` (RECIPES in tests/recipes.rs names it)"
        );
    }
    for heading in NOT_RECIPES {
        assert!(sections.iter().any(|s| s.heading == *heading));
    }
    let llm = section("LLM tokens: charge what each answer used");
    let prose = std::fs::read_to_string(common::repo_root().join(PAGE)).unwrap();
    assert!(
        prose.contains(&format!("reports {LLM_TOKENS} tokens")),
        "{PAGE}: the LLM recipe names the stand-in's {LLM_TOKENS} tokens"
    );
    assert!(llm.blocks.iter().any(|b| b.lang == "sh"));
}

#[test]
fn per_user_by_jwt_subject() {
    let run = run_recipe("Per user: 100 requests per minute by JWT subject");
    assert!(
        bucket_in_redis(&run, "per-user", &[USER]),
        "per-user keyed by the token's sub"
    );
}

/// On Istio's layout the recipe's key limits; the plain-Envoy key (`jwt_payload.sub`) limits
/// nothing, as the page says.
#[test]
fn per_user_on_istio() {
    let heading = "Per user on Istio";
    let run = run_recipe(heading);
    assert!(
        bucket_in_redis(&run, "per-user", &[USER]),
        "per-user keyed by payload.sub"
    );
    drop(run);
    let s = section(heading);
    let r = recipe(&s);
    let wrong = r
        .config
        .replace("jwt_authn:payload.sub", "jwt_authn:jwt_payload.sub");
    assert_ne!(wrong, r.config);
    let run = start(
        "recipe-istio-wrong-key",
        Setup::Istio,
        &wrong,
        r.jwt_filter.as_deref(),
    );
    let out = run_sh(&run, &r.loops[0].0.text);
    assert_eq!(
        parse(&out)
            .into_iter()
            .filter(|l| matches!(l, Line::Count(..)))
            .collect::<Vec<_>>(),
        [Line::Count(30, "200".to_string())],
        "keyed on jwt_payload.sub, Istio's metadata has no value: nothing is limited\n{out}"
    );
}

#[test]
fn per_client_address() {
    run_recipe("Per client address: the catch-all");
}

#[test]
fn api_keys_with_an_override() {
    run_recipe("API keys, with a bigger limit for one customer");
}

/// Each user's bucket is keyed on its `sub` alone, whatever its plan.
#[test]
fn tiers_from_the_caller_s_plan() {
    let run = run_recipe("Tiers from the caller's plan");
    for user in [USER, PRO_USER] {
        assert!(bucket_in_redis(&run, "per-user", &[user]), "{user}");
    }
}

#[test]
fn shadow_rollout() {
    run_recipe("Shadow rollout: watch before you enforce");
}

#[test]
fn llm_tokens() {
    run_recipe("LLM tokens: charge what each answer used");
}

#[test]
fn wait_instead_of_reject() {
    run_recipe("Wait instead of reject");
}

#[test]
fn monthly_quota_with_a_per_minute_cap() {
    run_recipe("Monthly quota with a per-minute cap");
}

#[test]
fn penalty_box() {
    run_recipe("Penalty box");
}

#[test]
fn grpc() {
    run_recipe("gRPC");
}

/// Wrong passwords use up a client's bucket, right ones never do; the stand-in saw every login
/// but the refused ones.
#[test]
fn login_brute_force() {
    let heading = "Login brute force";
    let run = run_recipe(heading);
    let text = std::fs::read_to_string(common::repo_root().join(PAGE)).unwrap();
    // Words as a reader sees them, whatever the line breaks.
    let prose = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        prose.contains(&format!(
            "user `{}` with the password `{}`",
            LOGIN.0, LOGIN.1
        )),
        "{PAGE}: the login recipe names the stand-in's user and password"
    );
    drop(run);
}

// ---- the comparison itself ----

#[test]
fn counts_may_differ_by_the_refill_and_every_label_shown_must_appear() {
    let page = "     20 200\n     10 429\nretry-after: 1\n";
    assert_eq!(
        compare(
            page,
            "     20 200\n     10 429\nretry-after: 1\r\n",
            0,
            |_| 0
        ),
        Ok(())
    );
    assert_eq!(
        compare(page, "     21 200\n      9 429\nretry-after: 1\n", 1, |_| 0),
        Ok(())
    );
    // One more admission than the refill allows.
    assert!(compare(page, "     22 200\n      8 429\nretry-after: 1\n", 1, |_| 0).is_err());
    // A label the page shows never appeared, however large the slack.
    assert!(compare(page, "     30 200\nretry-after: 1\n", 100, |_| 0).is_err());
    // An answer the page never shows.
    assert!(compare(
        page,
        "     20 200\n      9 429\n      1 503\nretry-after: 1\n",
        5,
        |_| 0
    )
    .is_err());
    // Fewer requests than the loop sends.
    assert!(compare(page, "     20 200\n      9 429\nretry-after: 1\n", 5, |_| 0).is_err());
    // Other lines match exactly.
    assert!(compare(page, "     20 200\n     10 429\nretry-after: 2\n", 5, |_| 0).is_err());
    assert!(compare(page, "     20 200\n     10 429\n", 5, |_| 0).is_err());
}

#[test]
fn counters_may_differ_by_their_rule_s_refill() {
    let page = "wasmcustom.tollgate.strict.shadow_denied: 20\n";
    let slack = |rule: &str| if rule == "strict" { 1 } else { 0 };
    assert_eq!(
        compare(
            page,
            "wasmcustom.tollgate.strict.shadow_denied: 19\n",
            0,
            slack
        ),
        Ok(())
    );
    assert!(compare(
        page,
        "wasmcustom.tollgate.strict.shadow_denied: 18\n",
        0,
        slack
    )
    .is_err());
    assert!(compare(
        page,
        "wasmcustom.tollgate.other.shadow_denied: 20\n",
        0,
        slack
    )
    .is_err());
}

#[test]
fn sections_skip_headings_inside_fences() {
    let md = "# T\n## A\ntext\n```sh\n## not a heading\n```\n```text\nx\n```\n## B\n";
    let s = sections(md);
    assert_eq!(
        s.iter().map(|s| s.heading.as_str()).collect::<Vec<_>>(),
        ["A", "B"]
    );
    assert_eq!(s[0].blocks.len(), 2);
    assert_eq!(s[0].blocks[0].text, "## not a heading\n");
}

#[test]
fn refill_counts_the_fastest_rule_and_overrides() {
    let r = Refill::of(
        r#"{ "rules": [ { "name": "a", "key": ["header:k"], "rate": 60, "period_ms": 60000,
             "overrides": [ { "key": ["x"], "rate": 300 } ] },
           { "name": "b", "rate": 6000, "period_ms": 60000, "usage": { "header": "u" } } ] }"#,
    );
    // a: 5 per second (its override); b: 100 tokens per second, 1500 per request.
    assert_eq!(r.rule("a", Duration::from_secs(2)), 10);
    assert_eq!(r.rule("b", Duration::from_secs(2)), 1);
    assert_eq!(r.any(Duration::from_secs(2)), 10);
    assert_eq!(r.any(Duration::from_millis(1)), 1);
}

#[test]
fn refill_counts_a_rule_s_fastest_tier() {
    let r = Refill::of(
        r#"{ "rules": [ { "name": "a", "rate": 60, "period_ms": 60000,
             "tiers": { "from": "metadata:m:plan", "limits": {
               "pro": { "rate": 600 }, "fast": { "rate": 20, "period_ms": 1000 } } } } ] }"#,
    );
    // a: 20 per second (its `fast` tier, on its own period).
    assert_eq!(r.rule("a", Duration::from_secs(2)), 40);
}
