//! Replication lag in seconds, on the leader: how long the oldest change
//! made here (at the current epoch) and not yet acknowledged by a standby
//! has waited; 0 when every change is acknowledged.
//!
//! Cheap on the request path: nothing per record and nothing per request.
//! The durable writer stamps each **frame** (one log entry, a group commit
//! of many records) as it hands it to replication ([`LagClock::written`]:
//! one clock read and a short lock per frame, and only while this node
//! leads); the acknowledgement reader drops the stamps an acknowledgement
//! covers ([`LagClock::acked`]); a scrape reads the oldest stamp left
//! ([`LagClock::seconds`]). A standby that catches up by snapshot
//! acknowledges the snapshot's position, which covers every change made
//! before it, so the stamps of changes made while no standby was streamed
//! to go at that acknowledgement too: until then they count, and the lag
//! grows while the leader has no standby (changes are on no standby).
//!
//! Memory is bounded: at most [`MAX_STAMPS`] stamps are kept; beyond, a
//! frame joins the newest stamp (which keeps its older time), so the figure
//! can only err high, by at most the span that stamp covers.
//!
//! The stamps of another epoch never count: a node that leads again reads
//! 0 until it has made a change at its new epoch, and its first change
//! forgets the old stamps (positions restart per leader).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Stamps kept at most (16 bytes each).
pub const MAX_STAMPS: usize = 4096;

/// See the module docs.
#[derive(Default)]
pub struct LagClock {
    /// The epoch this node leads at, 0 when it does not lead (then frames
    /// are not stamped: a standby's own journal waits for nobody).
    leading: AtomicU64,
    /// A std Mutex: held for a few instructions by the writer thread, the
    /// acknowledgement reader and a scrape, never across I/O.
    stamps: Mutex<Stamps>,
}

#[derive(Default)]
struct Stamps {
    /// The epoch the stamps were taken at.
    epoch: u64,
    /// (last change number of the frame(s), nanoseconds when written),
    /// oldest first.
    queue: VecDeque<(u64, u64)>,
}

impl LagClock {
    /// This node leads at `epoch` from now on (0: it does not lead).
    pub fn lead(&self, epoch: u64) {
        // Relaxed: a flag read by the writer thread; a frame stamped or not
        // around the change counts at most one frame differently.
        self.leading.store(epoch, Ordering::Relaxed);
    }

    /// The epoch set by [`LagClock::lead`].
    pub fn leading(&self) -> u64 {
        self.leading.load(Ordering::Relaxed)
    }

    /// A frame ending at change number `upto` was written at `now`
    /// (nanoseconds) while leading at `epoch`.
    pub fn written(&self, epoch: u64, upto: u64, now: u64) {
        let mut s = self.stamps.lock().unwrap_or_else(PoisonError::into_inner);
        if s.epoch != epoch {
            s.epoch = epoch;
            s.queue.clear();
        }
        if s.queue.len() >= MAX_STAMPS {
            if let Some(back) = s.queue.back_mut() {
                back.0 = back.0.max(upto);
                return;
            }
        }
        s.queue.push_back((upto, now));
    }

    /// A standby acknowledged every change up to `upto`.
    pub fn acked(&self, upto: u64) {
        let mut s = self.stamps.lock().unwrap_or_else(PoisonError::into_inner);
        while s.queue.front().is_some_and(|&(u, _)| u <= upto) {
            s.queue.pop_front();
        }
    }

    /// The lag at `now` (nanoseconds) of a node leading at `epoch` (0: not
    /// leading, no lag), in seconds.
    pub fn seconds(&self, epoch: u64, now: u64) -> f64 {
        if epoch == 0 {
            return 0.0;
        }
        let s = self.stamps.lock().unwrap_or_else(PoisonError::into_inner);
        match s.queue.front() {
            Some(&(_, at)) if s.epoch == epoch => now.saturating_sub(at) as f64 / 1e9,
            _ => 0.0,
        }
    }

    /// Stamps held (for the tests of the bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.stamps.lock().unwrap_or_else(PoisonError::into_inner).queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn zero_when_caught_up_and_the_oldest_unacknowledged_frame_counts() {
        let c = LagClock::default();
        assert_eq!(c.seconds(3, 10 * S), 0.0, "nothing written");
        c.written(3, 5, 10 * S);
        c.written(3, 9, 11 * S);
        c.written(3, 12, 13 * S);
        assert_eq!(c.seconds(3, 14 * S), 4.0, "the frame written at 10 s waits");
        c.acked(4);
        assert_eq!(c.seconds(3, 14 * S), 4.0, "an acknowledgement short of a frame's end leaves it waiting");
        c.acked(9);
        assert_eq!(c.seconds(3, 14 * S), 1.0, "then the frame written at 13 s is the oldest");
        c.acked(12);
        assert_eq!(c.seconds(3, 14 * S), 0.0, "caught up");
        assert_eq!(c.seconds(3, 10 * S), 0.0);
    }

    #[test]
    fn a_snapshot_acknowledgement_covers_what_was_made_without_a_standby() {
        let c = LagClock::default();
        for (i, upto) in [3u64, 7, 20].into_iter().enumerate() {
            c.written(2, upto, (i as u64 + 1) * S);
        }
        assert_eq!(c.seconds(2, 61 * S), 60.0, "no standby for a minute: the first change waits a minute");
        c.acked(25);
        assert_eq!(c.seconds(2, 61 * S), 0.0);
    }

    #[test]
    fn other_epochs_and_followers_read_zero() {
        let c = LagClock::default();
        c.written(4, 10, S);
        assert_eq!(c.seconds(0, 5 * S), 0.0, "not leading");
        assert_eq!(c.seconds(6, 5 * S), 0.0, "stamps of epoch 4 do not count at epoch 6");
        c.written(6, 2, 4 * S);
        assert_eq!(c.len(), 1, "a new epoch forgets the old stamps (positions restart)");
        assert_eq!(c.seconds(6, 5 * S), 1.0);
        assert_eq!(c.seconds(4, 5 * S), 0.0);
    }

    #[test]
    fn memory_is_bounded_and_the_figure_errs_high_only() {
        let c = LagClock::default();
        let n = MAX_STAMPS as u64 + 100;
        for i in 1..=n {
            c.written(1, i, i * S);
        }
        assert_eq!(c.len(), MAX_STAMPS);
        assert_eq!(c.seconds(1, n * S), (n - 1) as f64, "the oldest stamp is kept");
        // Acknowledge up to just before the frames folded into the newest
        // stamp: what is left is that stamp, older than its newest frames.
        c.acked(MAX_STAMPS as u64 - 1);
        let lag = c.seconds(1, n * S);
        assert_eq!(lag, (n - MAX_STAMPS as u64) as f64, "the folded frames count from the stamp they joined");
        assert!(lag >= 0.0);
        c.acked(n);
        assert_eq!((c.len(), c.seconds(1, n * S)), (0, 0.0));
    }

    #[test]
    fn a_clock_behind_a_stamp_reads_zero_not_negative() {
        let c = LagClock::default();
        c.written(1, 1, 10 * S);
        assert_eq!(c.seconds(1, 9 * S), 0.0);
    }
}
