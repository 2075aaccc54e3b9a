//! Charge by outcome through a real Envoy, Webdis and Redis: a login application behind Envoy
//! answers 401 to a wrong password and 200 to the right one, and a `charge_on` rule keyed by the
//! client's address keeps a token only for a 401. Each client is its own loopback address
//! (127.0.0.x), so `client_ip` tells them apart.
//!
//! What it shows: the sixth wrong password of a client is refused with 429 and never reaches the
//! application; right passwords, from another client, never use up its bucket; parallel guesses
//! get only the burst (each admission pays before any answer); a client that hangs up before the
//! answer is charged; Envoy's own 503 counts by its status; the status read is the final one, not
//! an interim `100`/`103`; a 401 cut mid-body is charged; pipelined guesses are each checked.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use tollgate_e2e as common;

use common::envoy::{brief_log, stat_in, Envoy, NO_UPSTREAM};
use common::http::{raw_request_from, Resp};
use common::upstream::{Upstream, HOLD};
use common::{Redis, Webdis};

/// 5 failed logins per client address at once, refilled at 5 per 15 minutes (one every three
/// minutes: no token refills while a test runs); only a 401 keeps its token.
const LOGIN: &str = r#"{ "backend": { "timeout_ms": 2000 },
  "rules": [ { "name": "login", "match": { "path_prefix": "/app/login" }, "key": ["client_ip"],
               "rate": 5, "period_ms": 900000, "burst": 5,
               "charge_on": { "status": [401] } } ] }"#;

/// The login application: `x-password: secret` is right (200), anything else wrong (401);
/// `x-hold: 1` makes it take the request and never answer.
fn login_app() -> Upstream {
    Upstream::start_with(|head| {
        let head = head.to_ascii_lowercase();
        let answer = |status: &str, body: &str| {
            vec![format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()]
        };
        if head.contains("\nx-hold: 1\r") {
            vec![HOLD.to_vec()]
        } else if head.contains("\nx-password: secret\r") {
            answer("200 OK", "welcome\n")
        } else {
            answer("401 Unauthorized", "wrong password\n")
        }
    })
}

/// Redis, Webdis, the application and Envoy with `config`.
struct Run {
    envoy: Envoy,
    app: Upstream,
    webdis: Webdis,
    redis: Redis,
}

impl Run {
    fn start(name: &str, config: &str, app: Upstream, upstream_port: u16) -> Run {
        let dir = common::scratch_dir(name);
        let redis = Redis::start(&dir);
        let webdis = Webdis::start(&dir, redis.port);
        let envoy = Envoy::try_start_with_upstream(&dir, config, webdis.port, upstream_port)
            .unwrap_or_else(|log| panic!("envoy did not start:\n{}", brief_log(&log)));
        Run {
            envoy,
            app,
            webdis,
            redis,
        }
    }

    fn login(name: &str) -> Run {
        let app = login_app();
        let port = app.port;
        Run::start(name, LOGIN, app, port)
    }

    fn logs(&self) -> String {
        format!(
            "--- envoy ---\n{}\n--- webdis ---\n{}\n--- redis ---\n{}",
            brief_log(&self.envoy.log_text()),
            self.webdis.log_text(),
            self.redis.proc.log_text()
        )
    }

    fn listener(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.envoy.listen_port))
    }

    /// `GET path` from client address 127.0.0.`client` with `password`.
    fn from(&self, client: u8, path: &str, password: &str) -> Resp {
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, client));
        raw_request_from(
            Some(source),
            self.listener(),
            "GET",
            path,
            &[("x-password", password)],
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()))
    }

    /// The statuses of `n` logins from `client` with `password`, in order.
    fn logins(&self, client: u8, password: &str, n: usize) -> Vec<u16> {
        (0..n)
            .map(|_| self.from(client, "/app/login", password).status)
            .collect()
    }

    /// Counter `name` of rule `rule` once it reads `want` (the last value read if it never does).
    fn counter(&self, rule: &str, name: &str, want: u64) -> u64 {
        let stat = format!("wasmcustom.tollgate.{rule}.{name}");
        let stats = self
            .envoy
            .stats_when(|s| stat_in(s, &stat).unwrap_or(0) == want);
        stat_in(&stats, &stat).unwrap_or(0)
    }
}

/// `n` of `status`.
fn times(status: u16, n: usize) -> Vec<u16> {
    vec![status; n]
}

#[test]
fn the_sixth_wrong_password_is_refused_while_right_ones_never_use_up_the_bucket() {
    let run = Run::login("outcome-login");
    // A guesser: five wrong passwords are answered by the application, the sixth by tollgate.
    let guesses = run.logins(11, "wrong", 6);
    eprintln!("guesser, 6 wrong passwords: {guesses:?}");
    assert_eq!(guesses, [401, 401, 401, 401, 401, 429], "{}", run.logs());
    assert_eq!(run.app.hits(), 5, "the sixth never reached the application");
    let refused = run.from(11, "/app/login", "wrong");
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (1..=180).contains(&retry),
        "the next token in at most three minutes: {retry}"
    );
    // Now locked out, even with the right password, until a token refills.
    assert_eq!(run.from(11, "/app/login", "secret").status, 429);

    // A user who knows the password, from another address: twenty logins in a row with a burst
    // of five, every one admitted; each 200 gives its token back before the next call.
    let user = run.logins(12, "secret", 20);
    eprintln!("user, 20 right passwords: {user:?}");
    assert_eq!(user, times(200, 20), "{}", run.logs());
    // And that address's bucket is still full: five wrong passwords before its first 429.
    let after = run.logins(12, "wrong", 6);
    eprintln!("user, then 6 wrong passwords: {after:?}");
    assert_eq!(after, [401, 401, 401, 401, 401, 429], "{}", run.logs());
    assert_eq!(run.app.hits(), 5 + 20 + 5);
    assert_eq!(
        run.counter("login", "usage_refunded", 20),
        20,
        "one per 200"
    );
    assert_eq!(run.counter("login", "usage_charged", 0), 0);
}

/// Each admission takes its token before its answer exists, so parallel guesses cannot all pass
/// while the first answers are still on their way: with a burst of 5, exactly 5 of 40 reach the
/// application.
#[test]
fn parallel_guesses_get_only_the_burst() {
    let run = std::sync::Arc::new(Run::login("outcome-parallel"));
    let threads: Vec<_> = (0..40)
        .map(|_| {
            let run = run.clone();
            std::thread::spawn(move || run.from(13, "/app/login", "wrong").status)
        })
        .collect();
    let mut statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    statuses.sort_unstable();
    let count = |s: u16| statuses.iter().filter(|&&x| x == s).count();
    eprintln!(
        "40 parallel wrong passwords: {} x 401, {} x 429",
        count(401),
        count(429)
    );
    assert_eq!((count(401), count(429)), (5, 35), "{}", run.logs());
    assert_eq!(run.app.hits(), 5);
}

/// A client that hangs up before its answer would have gained a refund had the answer come (the
/// right password answers 200): it is charged instead. After five hang-ups its address is refused.
#[test]
fn a_client_that_hangs_up_before_the_answer_is_charged() {
    let run = Run::login("outcome-hangup");
    let source = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 14), 0));
    for n in 1..=5u64 {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.bind(&source.into()).expect("bind 127.0.0.14");
        socket
            .connect_timeout(&run.listener().into(), Duration::from_secs(10))
            .expect("connect");
        let mut conn: TcpStream = socket.into();
        conn.write_all(
            b"GET /app/login HTTP/1.1\r\nhost: localhost\r\nx-password: secret\r\nx-hold: 1\r\n\r\n",
        )
        .expect("write");
        // Admitted (it reached the application), then the client leaves before any answer.
        assert!(
            common::wait_until(Duration::from_secs(10), || run.app.hits() == n),
            "request {n} never reached the application\n{}",
            run.logs()
        );
        drop(conn);
        assert!(
            common::wait_until(Duration::from_secs(10), || run.app.held_closed() == n),
            "Envoy never ended request {n}\n{}",
            run.logs()
        );
    }
    let next = run.from(14, "/app/login", "secret");
    eprintln!("after 5 hang-ups, the right password: {}", next.status);
    assert_eq!(
        next.status,
        429,
        "five hang-ups took the burst\n{}",
        run.logs()
    );
    assert_eq!(
        run.counter("login", "usage_unfinished", 5),
        5,
        "{}",
        run.logs()
    );
    assert_eq!(run.counter("login", "usage_worst_case", 5), 5);
    assert_eq!(
        run.counter("login", "usage_refunded", 0),
        0,
        "never a refund"
    );
    assert_eq!(run.app.hits(), 5);
}

/// Envoy's own replies count by their status: with no upstream to reach, Envoy answers 503, which
/// a `"5xx"` rule keeps and a `401` rule on the same requests gives back.
#[test]
fn envoy_s_own_503_counts_by_its_status() {
    let config = r#"{ "backend": { "timeout_ms": 2000 },
      "rules": [
        { "name": "failures", "match": { "path_prefix": "/app/" }, "key": ["client_ip"],
          "rate": 5, "period_ms": 900000, "burst": 5, "charge_on": { "status": ["5xx"] } },
        { "name": "logins", "match": { "path_prefix": "/app/" }, "key": ["client_ip"],
          "rate": 3, "period_ms": 900000, "burst": 3, "charge_on": { "status": [401, 403] } } ] }"#;
    // No application: the `app` cluster points at a port where nothing listens.
    let run = Run::start("outcome-503", config, login_app(), NO_UPSTREAM);
    let statuses = run.logins(15, "wrong", 6);
    eprintln!("no upstream, 6 requests: {statuses:?}");
    // The `logins` bucket holds 3: without its refunds the fourth would be refused.
    assert_eq!(statuses, [503, 503, 503, 503, 503, 429], "{}", run.logs());
    assert_eq!(run.counter("logins", "usage_refunded", 5), 5);
    assert_eq!(run.counter("failures", "usage_refunded", 0), 0);
    assert_eq!(run.app.hits(), 0);
}

/// The status lines of everything a connection received until it closed (interim `1xx` heads
/// included), from client address 127.0.0.`client`, after writing `raw`.
fn exchange(run: &Run, client: u8, raw: &[u8]) -> Vec<u16> {
    use std::io::Read;
    let source = SocketAddr::from((Ipv4Addr::new(127, 0, 0, client), 0));
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.bind(&source.into()).expect("bind");
    socket
        .connect_timeout(&run.listener().into(), Duration::from_secs(10))
        .expect("connect");
    let mut conn: TcpStream = socket.into();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(raw).expect("write");
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    String::from_utf8_lossy(&got)
        .split("\r\n")
        .filter_map(|line| line.strip_prefix("HTTP/1.1 "))
        .filter_map(|rest| rest.get(..3)?.parse().ok())
        .collect()
}

/// A wrong password whose answer is preceded by interim `1xx` heads (the application sends
/// `100 Continue` and `103 Early Hints` first, or the client asked for `Expect: 100-continue` and
/// Envoy answers it): the status read is the final one, so each is charged as a 401.
#[test]
fn interim_answers_do_not_dodge_the_charge() {
    let app = Upstream::start_with(|head| {
        let head = head.to_ascii_lowercase();
        let mut pieces = Vec::new();
        if head.contains("\nx-interim: 1\r") {
            pieces.push(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec());
            pieces.push(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n".to_vec());
        }
        pieces.push(
            b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 6\r\nconnection: close\r\n\r\nwrong\n"
                .to_vec(),
        );
        pieces
    });
    let port = app.port;
    let run = Run::start("outcome-interim", LOGIN, app, port);
    let interim = (0..6)
        .map(|_| {
            let seen = exchange(
                &run,
                21,
                b"GET /app/login HTTP/1.1\r\nhost: localhost\r\nx-interim: 1\r\nconnection: close\r\n\r\n",
            );
            *seen.last().unwrap_or(&0)
        })
        .collect::<Vec<_>>();
    eprintln!("interim 100 and 103, then 401, six times: {interim:?}");
    assert_eq!(interim, [401, 401, 401, 401, 401, 429], "{}", run.logs());
    let expect = (0..6)
        .map(|_| {
            let seen = exchange(
                &run,
                22,
                b"POST /app/login HTTP/1.1\r\nhost: localhost\r\nexpect: 100-continue\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
            *seen.last().unwrap_or(&0)
        })
        .collect::<Vec<_>>();
    eprintln!("expect: 100-continue, then 401, six times: {expect:?}");
    assert_eq!(expect, [401, 401, 401, 401, 401, 429], "{}", run.logs());
    assert_eq!(
        run.counter("login", "usage_refunded", 0),
        0,
        "never a refund"
    );
}

/// An application that sends the 401's head and resets the connection mid-body: the status
/// arrived, so the admission is charged.
#[test]
fn a_401_cut_mid_body_is_charged() {
    let app = Upstream::start_with(|_| {
        vec![b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 1000\r\n\r\nwro".to_vec()]
    });
    let port = app.port;
    let run = Run::start("outcome-cut", LOGIN, app, port);
    let cut: Vec<u16> = (0..6)
        .map(|_| {
            let seen = exchange(
                &run,
                23,
                b"GET /app/login HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
            );
            seen.first().copied().unwrap_or(0)
        })
        .collect();
    eprintln!("401 head, then the connection reset mid-body, six times: {cut:?}");
    assert_eq!(cut, [401, 401, 401, 401, 401, 429], "{}", run.logs());
    assert_eq!(
        run.counter("login", "usage_refunded", 0),
        0,
        "never a refund"
    );
}

/// Six wrong passwords pipelined on one connection are six checks: the application sees five of
/// them, and the client's next login is refused. (Envoy answers the pipelined requests' client
/// with fewer responses than it sent requests; what matters here is what reached the application.)
#[test]
fn pipelined_guesses_are_each_checked() {
    let run = Run::login("outcome-pipelined");
    let one = "GET /app/login HTTP/1.1\r\nhost: localhost\r\nx-password: wrong\r\n\r\n";
    let mut raw = one.repeat(5);
    raw.push_str(
        "GET /app/login HTTP/1.1\r\nhost: localhost\r\nx-password: wrong\r\nconnection: close\r\n\r\n",
    );
    let seen = exchange(&run, 24, raw.as_bytes());
    let hits = run.app.hits();
    eprintln!(
        "six wrong passwords pipelined on one connection: answers {seen:?}, application saw {hits}"
    );
    assert!(
        hits <= 5,
        "{hits} guesses reached the application\n{}",
        run.logs()
    );
    let next = run.logins(24, "secret", 1);
    eprintln!("then the right password: {next:?}");
    assert_eq!(next, [if hits == 5 { 429 } else { 200 }], "{}", run.logs());
}

/// Guesses whose answer never comes from the application, which took the password (a slow
/// hash, an overloaded login service): the route times out and Envoy answers 504 itself, or the
/// application drops the connection and Envoy answers 503. Each is charged as an answer that never
/// came, not refunded by Envoy's status: the sixth guess is refused and never reaches the
/// application.
#[test]
fn a_guess_whose_answer_never_came_from_the_application_is_charged() {
    let app = Upstream::start_with(|head| {
        let head = head.to_ascii_lowercase();
        if head.contains("\nx-hold: 1\r") {
            vec![HOLD.to_vec()]
        } else if head.contains("\nx-drop: 1\r") {
            // Read the request, then close without a word.
            vec![]
        } else {
            vec![
                b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_vec(),
            ]
        }
    });
    let app_port = app.port;
    let dir = common::scratch_dir("outcome-lost");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let wasm = common::envoy::wasm_path();
    let envoy = Envoy::try_start_yaml(&dir, |listen_port, admin_port| {
        let route = "                  cluster: app\n";
        let yaml = common::envoy::render_envoy_yaml(
            LOGIN,
            webdis.port,
            listen_port,
            admin_port,
            &wasm,
            app_port,
        );
        assert_eq!(yaml.matches(route).count(), 1);
        yaml.replace(route, &format!("{route}                  timeout: 0.2s\n"))
    })
    .unwrap_or_else(|log| panic!("envoy did not start:\n{}", brief_log(&log)));
    let run = Run {
        envoy,
        app,
        webdis,
        redis,
    };
    let guesses = |client: u8, how: &str| -> Vec<u16> {
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, client));
        (0..6)
            .map(|_| {
                raw_request_from(
                    Some(source),
                    run.listener(),
                    "GET",
                    "/app/login",
                    &[("x-password", "wrong"), (how, "1")],
                )
                .unwrap_or_else(|e| panic!("{e}\n{}", run.logs()))
                .status
            })
            .collect()
    };
    let slow = guesses(25, "x-hold");
    let hits = run.app.hits();
    eprintln!("six slow wrong passwords, the route timing out: {slow:?}, application saw {hits}");
    assert_eq!(slow, [504, 504, 504, 504, 504, 429], "{}", run.logs());
    assert_eq!(hits, 5, "the sixth never reached the application");
    let dropped = guesses(26, "x-drop");
    let hits = run.app.hits() - 5;
    eprintln!(
        "six wrong passwords, the application dropping each: {dropped:?}, application saw {hits}"
    );
    assert_eq!(dropped, [503, 503, 503, 503, 503, 429], "{}", run.logs());
    assert_eq!(hits, 5, "the sixth never reached the application");
    assert_eq!(run.counter("login", "usage_unfinished", 10), 10);
    assert_eq!(
        run.counter("login", "usage_refunded", 0),
        0,
        "never a refund"
    );
}
