//! The cap on response bodies one worker reads at once.
//!
//! Invariant: at most [`MAX_READERS`] [`Slot`]s of one [`Readers`] are alive at any time, and a
//! slot is given back exactly when it is dropped (with the reader that holds it, however that
//! reader ends), so the count never drifts from the readers alive.

use std::cell::Cell;
use std::rc::Rc;

/// Most body readers one worker keeps alive at once. Each keeps up to `WINDOW` (16 KiB), and a
/// wasm VM's memory never shrinks and aborts the VM when it runs out, so the count of responses
/// being read must not decide how much memory a worker takes: with this cap the buffers take
/// 1024 × 16 KiB = 16 MiB per worker at most. A response that would start a reader past it is
/// not read, and its admission is charged the worst case (`usage_readers_full`).
pub const MAX_READERS: usize = 1024;

/// One worker's count of body readers alive (each engine has its own; the VM is single-threaded).
#[derive(Debug, Default)]
pub struct Readers {
    alive: Rc<Cell<usize>>,
}

impl Readers {
    /// A place for one more reader, or None if [`MAX_READERS`] are alive.
    pub fn take(&self) -> Option<Slot> {
        let alive = self.alive.get();
        if alive >= MAX_READERS {
            return None;
        }
        self.alive.set(alive + 1);
        Some(Slot {
            alive: Rc::clone(&self.alive),
        })
    }

    /// Readers alive now.
    pub fn alive(&self) -> usize {
        self.alive.get()
    }
}

/// A reader's place among its worker's readers, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    alive: Rc<Cell<usize>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.alive.set(self.alive.get().saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_readers_and_each_given_back_when_dropped() {
        let readers = Readers::default();
        let mut slots: Vec<Slot> = (0..MAX_READERS).map_while(|_| readers.take()).collect();
        assert_eq!(slots.len(), MAX_READERS);
        assert_eq!(readers.alive(), MAX_READERS);
        assert!(readers.take().is_none(), "full");
        assert_eq!(readers.alive(), MAX_READERS, "a refusal takes nothing");
        slots.pop();
        assert_eq!(readers.alive(), MAX_READERS - 1);
        slots.push(readers.take().expect("room again"));
        drop(slots);
        assert_eq!(readers.alive(), 0);
    }
}
