//! The change feed that durability is built on.
//!
//! The store reports every durable change (rank sizes, key bindings, clears)
//! to an optional [`Journal`] *while the pages involved are still held BUSY*:
//! two changes to the same page therefore reach the journal in the order they
//! took effect, so replaying the journal in order rebuilds the same state.
//! Reservations are journaled too (`Reserve`, with the key's tag, before
//! the allocate that made them answers), and so are pages held back for a
//! reader's lease (`Hold`): after a restart a reserved page is still its
//! writer's, and a held page is still held, so a page never reaches a
//! second writer, or a new key, while the first may still write or a
//! reader may still read it. An `Unbind` says the page is free: its
//! binding, reservation or hold ended (confirm's release, expiry, the end
//! of a hold, eviction).
//!
//! The records name keys by their text or their stable tag, pages by rank
//! and number, never by a process-local id: another process (a restart, a
//! standby replaying a shipped log) reads them the same way.
//!
//! Every change carries the generation it applies to (a `/clear` starts a new
//! one), so a change from a request that raced a clear cannot resurrect state
//! in the generation after it.
//!
//! Order guarantees, which make "replay in order, skipping changes of other
//! generations than the current one" rebuild the state exactly:
//! - an `Initialize` is recorded before any change on that rank, and a `Clear`
//!   before any change of the generation it starts (both are recorded before
//!   they become visible, under the store's admin lock);
//! - changes to one page are recorded in the order they happen (the page is
//!   held BUSY while they are recorded);
//! - an `Unbind` is recorded before the key index forgets the binding, so a
//!   later `Bind` of the same key on the same rank (to another page) is
//!   recorded after it.
//!
//! Changes of a generation older than a recorded `Clear` may still arrive
//! after it (from requests that were in flight across the clear): skip them.

use super::key::KeyRef;

/// One durable change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// A rank was created.
    Initialize {
        /// The generation it belongs to.
        generation: u64,
        /// The rank.
        rank: u32,
        /// Its size.
        num_pages: u32,
    },
    /// A key was bound to a page on a rank.
    Bind {
        /// The generation it belongs to.
        generation: u64,
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
        /// The key.
        key: KeyRef<'a>,
        /// The key's world size (fixed at its first binding).
        world: u32,
    },
    /// A page was reserved for a key by an allocate.
    Reserve {
        /// The generation it belongs to.
        generation: u64,
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
        /// The key's tag ([`crate::KeyRef::tag`]).
        tag: u32,
    },
    /// A page was unbound from its key but is held back (quarantined)
    /// while a reader's lease may cover it.
    Hold {
        /// The generation it belongs to.
        generation: u64,
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
    },
    /// The page is free: its binding, reservation or hold ended.
    Unbind {
        /// The generation it belongs to.
        generation: u64,
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
    },
    /// Everything was forgotten; `generation` is the new generation.
    Clear {
        /// The generation that starts now.
        generation: u64,
    },
}

/// A sink for changes. `record` must not block for long (it runs while pages
/// are held BUSY): queue the change and return. A caller that needs its
/// changes durable waits, after the store call returns, for everything
/// recorded so far (that includes its own changes); see `crate::durable`.
///
/// The store brackets the changes of one operation (a confirm's commit, one
/// eviction) with [`Journal::begin`] and [`Journal::end`], on one thread, so
/// that a journal may hand them on as one message. A journal that does so
/// must still write changes in the order they were recorded: once `record`
/// returns, another thread may observe the change and record the next one
/// to the same page before this operation ends.
pub trait Journal: Send + Sync {
    /// Queues `change`.
    fn record(&self, change: Change<'_>);

    /// Starts an operation on this thread (the default does nothing).
    fn begin(&self) {}

    /// Ends the operation this thread began last (the default does nothing).
    fn end(&self) {}
}
