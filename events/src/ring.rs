//! A topic's replay buffer: its batches since start, by sequence number.

use super::now_micros;
use bytes::Bytes;
use std::collections::VecDeque;

/// The publisher's batches since start: what a replay answers from.
pub(crate) struct Ring {
    pub(crate) entries: VecDeque<(u64, Bytes)>,
    pub(crate) cap: usize,
    pub(crate) bytes: usize,
    /// The number the next batch gets (without gaps).
    pub(crate) next: u64,
    /// The first number of this leadership (start-up or takeover): a
    /// start below it is from before.
    pub(crate) base: u64,
    /// The first number of the latest resync, when it is still buffered.
    pub(crate) resync: Option<u64>,
}

impl Ring {
    pub(crate) fn new(cap: usize) -> Ring {
        Ring { entries: VecDeque::new(), cap, bytes: 0, next: 0, base: 0, resync: None }
    }

    /// Numbers continue from the clock (start-up, takeover, a new topic),
    /// never below the last one: older starts are from before.
    pub(crate) fn restart(&mut self) {
        self.next = self.next.max(now_micros());
        self.base = self.next;
    }

    pub(crate) fn push(&mut self, seq: u64, payload: Bytes) {
        self.bytes += payload.len();
        self.entries.push_back((seq, payload));
        while self.entries.len() > self.cap {
            if let Some((s, p)) = self.entries.pop_front() {
                self.bytes -= p.len();
                if self.resync == Some(s) {
                    self.resync = None;
                }
            }
        }
    }

    /// What a replay from `start` answers: the batches from it, or `None`
    /// when `start` is not buffered (older than the buffer, from before
    /// this leadership, or a batch that was dropped): a resync then.
    pub(crate) fn from(&self, start: u64) -> Option<Vec<(u64, Bytes)>> {
        if start >= self.next {
            return Some(Vec::new());
        }
        if start < self.base {
            return None;
        }
        let i = self.entries.partition_point(|&(s, _)| s < start);
        match self.entries.get(i) {
            Some(&(s, _)) if s == start => Some(self.entries.range(i..).cloned().collect()),
            _ => None,
        }
    }
}
