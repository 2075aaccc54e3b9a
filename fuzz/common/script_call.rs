//! The script call both codec targets (webdis, resp) draw: any key, script and numbers, with or
//! without a lease holder, and the lease argument the script must get for it.

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use tollgate_core::backend::ScriptCall;
use tollgate_core::bucket::Holder;

#[derive(Arbitrary, Debug)]
pub struct Input {
    pub key: String,
    pub script: String,
    pub eval: bool,
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
    pub cost: u64,
    pub lease_want: u64,
    pub max_wait_ms: u64,
    pub settle: i64,
    pub holder: Option<(u64, u64, u64, Vec<(u64, u64)>)>,
}

impl Input {
    /// The call, and the lease argument the script must get: the want, then with a holder its
    /// id, seq, hold and the last steps it keeps.
    pub fn call(&self) -> (ScriptCall, String) {
        let (holder, lease) = match &self.holder {
            None => (None, self.lease_want.to_string()),
            Some((id, seq, hold_ms, steps)) => {
                let holder = Holder::new(*id, *seq, *hold_ms, steps);
                let mut text = format!("{}:{id}:{seq}:{hold_ms}", self.lease_want);
                for (held, quiet) in holder.steps() {
                    text.push_str(&format!(":{held}:{quiet}"));
                }
                (Some(Box::new(holder)), text)
            }
        };
        let call = ScriptCall {
            holder,
            key: self.key.clone(),
            burst: self.burst,
            rate: self.rate,
            period_ms: self.period_ms,
            cost: self.cost,
            lease_want: self.lease_want,
            max_wait_ms: self.max_wait_ms,
            settle: self.settle,
            // The untracked form: the targets check its arguments (the tracked settlement has
            // the codec's unit tests).
            track: None,
            penalty: None,
        };
        (call, lease)
    }
}
