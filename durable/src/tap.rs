//! The replication tap: where the high-availability layer
//! (the HA crate's `replicate`) receives what the writer wrote, and where a
//! request's wait for durability also waits for the synchronous standby.
//!
//! The writer hands every log entry it wrote to the attached
//! [`Replication`] as a [`Frame`]: the codec's encoded records exactly as
//! they went to disk (so a new record kind flows to the standby without a
//! change here), the generation they belong to, whether a `/clear` started
//! that generation in this batch, and the range of change numbers the frame
//! covers. A frame is handed on right after the writer published its
//! position, in position order, from the writer thread: `written` must only
//! queue.
//!
//! [`crate::Durable::sync`] then waits, after the local durable
//! position, for [`Replication::acknowledged`] of the same position.

/// One written log entry, for the standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The generation the records belong to.
    pub generation: u64,
    /// A `/clear` started `generation` in this batch: the standby forgets
    /// everything before applying `records`.
    pub clear: bool,
    /// The position the previous frame ended at (the change numbers
    /// `from + 1 ..= upto` are covered).
    pub from: u64,
    /// The last change number covered.
    pub upto: u64,
    /// The encoded records (`codec::decode_log` reads them), possibly none
    /// (changes of an older generation, dropped).
    pub records: Vec<u8>,
}

pub use crate::core::BoxFuture;

/// The replication layer, as the durable layer sees it.
pub trait Replication: Send + Sync {
    /// The writer wrote `frame` (writer thread; must not block).
    fn written(&self, frame: Frame);

    /// Whether frames are wanted now (asked once per writer pass, before
    /// its records are copied for a frame). `false` spares the writer the
    /// copy and the hand-over while nobody is streamed to (a follower, a
    /// leader without a standby): that pass's frame is not built at all,
    /// except one that starts with a `/clear`, which is always handed on.
    /// A consumer that starts streaming later begins with a snapshot; the
    /// `from`/`upto` of the frames after it show any frame it missed.
    fn wants_frames(&self) -> bool {
        true
    }

    /// The writer wrote changes up to `upto` without building a frame
    /// (frames were not wanted; writer thread, must not block): what is
    /// counted of changes no standby has, the lag in seconds, still sees
    /// them.
    fn skipped(&self, _upto: u64) {}

    /// The stream is broken: the writer rebuilt its keyspace from memory
    /// after a disk fault and the frames since the last one were never
    /// written. Standbys must catch up by snapshot.
    fn broken(&self);

    /// Resolves once change number `upto` may be acknowledged to a client
    /// as far as replication goes (the synchronous standby has it, or the
    /// mode allows answering without it); `Err` says why not (answered
    /// 503). Bounded in time by the implementation.
    fn acknowledged(&self, upto: u64) -> BoxFuture<'_, Result<(), String>>;
}
