//! The worker's open batch: the script calls that go out together in its next flight.
//!
//! Invariant: the open batch holds at most `batch_max_keys` calls and at most
//! [`MAX_BATCH_BYTES`] of their command bytes, so a flood of new keys never builds an unbounded
//! request; what it holds leaves as one flight when the flight out before it is answered, at the
//! end of the host's round of events that filled it when none is out, or at once when it is full.

use super::calls::Call;
use crate::backend::MAX_BATCH_BYTES;

#[derive(Debug, Default)]
pub(super) struct OpenBatch {
    calls: Vec<Call>,
    bytes: usize,
    /// A call joined while a flight of the worker's open batch was out.
    gathered: bool,
}

impl OpenBatch {
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Whether a call of `bytes` ([`group_bytes`]) would not fit next to what is open (at most
    /// `max_keys` calls).
    ///
    /// [`group_bytes`]: crate::backend::Transport::group_bytes
    pub fn no_room_for(&self, bytes: usize, max_keys: usize) -> bool {
        !self.calls.is_empty()
            && (self.calls.len() >= max_keys || self.bytes.saturating_add(bytes) > MAX_BATCH_BYTES)
    }

    /// Whether it holds `max_keys` calls: it leaves now.
    pub fn is_full(&self, max_keys: usize) -> bool {
        self.calls.len() >= max_keys
    }

    /// Adds `call` of `bytes` ([`group_bytes`]); `behind_flight`: a flight of the open batch is
    /// out (it waits for it).
    ///
    /// [`group_bytes`]: crate::backend::Transport::group_bytes
    pub fn push(&mut self, call: Call, bytes: usize, behind_flight: bool) {
        self.bytes = self.bytes.saturating_add(bytes);
        self.gathered |= behind_flight;
        self.calls.push(call);
    }

    /// Whether a call in it waited behind a flight out.
    pub fn gathered(&self) -> bool {
        self.gathered
    }

    /// Everything open, to go out as one flight (the batch is empty after).
    pub fn take(&mut self) -> Vec<Call> {
        self.bytes = 0;
        self.gathered = false;
        std::mem::take(&mut self.calls)
    }
}
