//! Who asks for what in a fleet run: each proxy's share of the demand (a few busy gateways, many
//! quiet sidecars), when it is in the fleet (some join a third of the way in, some leave two thirds
//! of the way in), and the request rates of the hot key and of the warm keys. Every proxy's
//! requests are a Poisson process; the shares of all proxies present at the start add up to 1.

use super::FleetOpts;

/// Gateways are this share of the proxies (at least one) ...
pub const GATEWAY_SHARE_OF_PROXIES: f64 = 0.05;
/// ... and carry this share of the demand, split evenly; the sidecars split the rest evenly.
pub const GATEWAY_SHARE_OF_DEMAND: f64 = 0.8;
/// Proxies whose index is this modulo 10 join at a third of the run (absent before) ...
pub const JOIN_MOD: usize = 3;
/// ... and these leave at two thirds (their tokens on lease are abandoned, as by a crash).
pub const LEAVE_MOD: usize = 7;

/// One proxy's place in the demand.
#[derive(Debug, Clone, Copy)]
pub struct Proxy {
    pub gateway: bool,
    /// Its share of every key's demand.
    pub weight: f64,
    /// In the fleet from `join_us` until `leave_us` (simulated µs from the start).
    pub join_us: u64,
    pub leave_us: u64,
}

/// The fleet's proxies, gateways first.
pub fn proxies(o: &FleetOpts) -> Vec<Proxy> {
    let n = o.proxies;
    let gateways = ((n as f64 * GATEWAY_SHARE_OF_PROXIES).round() as usize).clamp(1, n);
    let sidecars = n - gateways;
    let end = o.duration_ms * 1000;
    (0..n)
        .map(|i| {
            let gateway = i < gateways;
            let weight = match (gateway, sidecars) {
                (true, 0) => 1.0 / gateways as f64,
                (true, _) => GATEWAY_SHARE_OF_DEMAND / gateways as f64,
                (false, _) => (1.0 - GATEWAY_SHARE_OF_DEMAND) / sidecars as f64,
            };
            let churn = o.churn && n >= 10;
            Proxy {
                gateway,
                weight,
                join_us: if churn && i % 10 == JOIN_MOD {
                    end / 3
                } else {
                    0
                },
                leave_us: if churn && i % 10 == LEAVE_MOD {
                    end * 2 / 3
                } else {
                    u64::MAX
                },
            }
        })
        .collect()
}

/// Requests per second the fleet sends to the hot key (its overload times its rate) and to all
/// warm keys together.
pub fn rates(o: &FleetOpts) -> (f64, f64) {
    (
        o.overload * o.hot_rate as f64,
        o.warm_keys as f64 * o.warm_load,
    )
}
