//! The key-event feed: which keys became loadable and which stopped being
//! loadable, for a publisher of KV events (the events crate).
//!
//! An [`Event`] means what `batch_exists` means: [`Event::Stored`] when a
//! key becomes complete (bound on every rank of its world: vLLM's
//! `batch_exists`, or the one rank of an SGLang space), [`Event::Removed`]
//! the moment a complete key stops being complete (eviction, a release or
//! delete of one of its pages, a quarantine, an SGLang space's clear),
//! [`Event::Cleared`] when a `/clear` forgets everything. A confirm that
//! leaves a key incomplete, and a re-confirm of a complete key, publish
//! nothing.
//!
//! The store hands a sink one batch per operation (a confirm's commit, a
//! delete, a reset, one evicted key, a clear), in the order its changes
//! took effect, and hands it on *before* the pages involved leave BUSY
//! where the order across requests depends on it: a confirm's batch is
//! handed on before its pages are published BOUND (so no eviction or
//! delete of those keys can hand on its removal first), an eviction's
//! under the key's lock. A sink must only queue (it runs on the request
//! path): see [`Events`].
//!
//! Only hex and SGLang digest keys are reported (the engines' keys); keys
//! of any other shape are stored and served but publish nothing. A store
//! without a sink pays one check per operation (and, in a confirm, one
//! comparison a key).

use super::key::{Digest, KeyRef};

/// A block as events name it: a reported key's digest, copied (no
/// allocation on the request path; the publisher makes the wire's hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Block {
    /// vLLM's 32-hex key: the 16 bytes it spells.
    Hex([u8; 16]),
    /// SGLang's 64-hex key and its suffix (a `-k`, `-v` or `_<pool>` key
    /// names its base block).
    Digest(Digest),
}

impl Block {
    /// The block of a reported key; `None` for a key of another shape
    /// (stored and served, but publishing nothing).
    #[inline]
    pub fn of(key: KeyRef<'_>) -> Option<Block> {
        match key {
            KeyRef::Hex(v) => Some(Block::Hex(v.to_be_bytes())),
            KeyRef::Digest(d) => Some(Block::Digest(d)),
            KeyRef::Text(_) => None,
        }
    }

    /// The digest's bytes (16 or 32), the suffix left out.
    #[inline]
    pub fn digest(&self) -> &[u8] {
        match self {
            Block::Hex(b) => b,
            Block::Digest(d) => &d.bytes,
        }
    }

    /// Whether the key had a suffix: another key of the same request (its
    /// base's other suffix) may name the same block.
    #[inline]
    pub fn suffixed(&self) -> bool {
        matches!(self, Block::Digest(d) if d.suffix != super::key::Suffix::NONE)
    }
}

/// One change of what is loadable (a compact record: [`Copy`], 38 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The key became complete.
    Stored(Block),
    /// The key stopped being complete.
    Removed(Block),
    /// Every key was forgotten (`/clear`).
    Cleared,
}

/// Where the store's batches go.
pub trait Events: Send + Sync {
    /// Queues one operation's events, in the order they happened (never
    /// empty), made in the store's generation `generation` (a `/clear`'s
    /// [`Event::Cleared`] carries the generation it starts). A batch of an
    /// older generation than a `Cleared` handed on before it comes from a
    /// request that raced the clear, and its changes are gone: drop it.
    /// A `/clear`'s [`Event::Cleared`] is always a batch of its own.
    /// Runs on the request path, sometimes under a key's lock: it must not
    /// block or wait.
    fn publish(&self, generation: u64, batch: Vec<Event>);

    /// An empty buffer for one operation's events, with room for at least
    /// `n` (a sink may hand back the buffers it was given, so that the
    /// request path does not allocate). Runs on the request path.
    fn buffer(&self, n: usize) -> Vec<Event> {
        Vec::with_capacity(n)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::Mutex;
    use crate::{Store, StoreConfig};
    use std::sync::Arc;

    /// Every batch handed on, with its generation.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u64, Vec<Event>)>>);

    impl Events for Recorder {
        fn publish(&self, generation: u64, batch: Vec<Event>) {
            assert!(!batch.is_empty(), "never an empty batch");
            self.0.lock().unwrap().push((generation, batch));
        }
    }

    impl Recorder {
        fn take(&self) -> Vec<(u64, Vec<Event>)> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    const A: &str = "0000000000000000000000000000000a";
    const B: &str = "0000000000000000000000000000000b";

    fn key(s: &str) -> Block {
        Block::of(KeyRef::parse(s)).unwrap()
    }

    fn store(world: u32, pages: i64) -> (Store, Arc<Recorder>) {
        let s = Store::new(StoreConfig { world_size: Some(world), eviction: true, ..StoreConfig::default() });
        for r in 0..i64::from(world) {
            s.initialize(r, pages).unwrap();
        }
        let rec = Arc::new(Recorder::default());
        assert!(s.set_events(rec.clone()));
        (s, rec)
    }

    fn save(s: &Store, rank: i64, keys: &[&str]) -> Vec<i64> {
        let mut out = Vec::new();
        s.allocate(rank, keys, &mut out).unwrap();
        let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
        let conf: Vec<(&str, i64)> = keys.iter().copied().zip(pages.iter().copied()).collect();
        s.confirm(rank, &conf, &[]).unwrap();
        pages
    }

    #[test]
    fn stored_once_complete_on_every_rank_removed_once_any_rank_loses_it() {
        let (s, rec) = store(2, 8);
        let on0 = save(&s, 0, &[A, B, "text keys publish nothing"]);
        assert_eq!(rec.take(), vec![], "complete on one rank of two: nothing");
        let on1 = save(&s, 1, &[B, A, "text keys publish nothing"]);
        assert_eq!(
            rec.take(),
            vec![(0, vec![Event::Stored(key(B)), Event::Stored(key(A))])],
            "in the order of the request"
        );
        // A re-confirm of a complete key changes nothing that is loadable.
        s.confirm(0, &[(A, on0[0])], &[]).unwrap();
        assert_eq!(rec.take(), vec![]);
        // A release of one rank's page: the key is no longer loadable.
        s.confirm(0, &[], &[on0[0]]).unwrap();
        assert_eq!(rec.take(), vec![(0, vec![Event::Removed(key(A))])]);
        // A second release on the other rank: not loadable already, nothing.
        s.confirm(1, &[], &[on1[1]]).unwrap();
        assert_eq!(rec.take(), vec![]);
        // /clear: its own batch, with the generation it starts.
        s.clear();
        assert_eq!(rec.take(), vec![(1, vec![Event::Cleared])]);
    }

    #[test]
    fn an_eviction_and_a_delete_remove_what_was_loadable() {
        let (s, rec) = store(1, 2);
        save(&s, 0, &[A, B]);
        assert_eq!(rec.take().len(), 1);
        // A full rank: the allocate evicts a whole key to make room.
        let c = "0000000000000000000000000000000c";
        save(&s, 0, &[c]);
        let got = rec.take();
        assert_eq!(got.len(), 2, "the eviction's batch, then the confirm's: {got:?}");
        let evicted = match &got[0].1[..] {
            [Event::Removed(k)] if *k == key(A) || *k == key(B) => *k,
            other => panic!("{other:?}"),
        };
        assert_eq!(got[1].1, vec![Event::Stored(key(c))]);
        let kept = if evicted == key(A) { B } else { A };
        let d = s.delete(0, &[kept, "never stored"]).unwrap();
        assert_eq!(d.deleted, 1);
        assert_eq!(rec.take(), vec![(0, vec![Event::Removed(key(kept))])]);
        // An SGLang space's clear (a reset): every loadable key removed.
        s.reset();
        assert_eq!(rec.take(), vec![(0, vec![Event::Removed(key(c))])]);
        let mut all = Vec::new();
        s.complete_blocks(|b| all.push(b));
        assert_eq!(all, vec![]);
    }

    #[test]
    fn an_sglang_block_in_two_spaces_is_stored_by_each_and_removed_by_the_one_that_loses_it() {
        use crate::{Clock, Spaces, SpacesConfig};
        let cfg = SpacesConfig { max_spaces: 4, store: StoreConfig::default() };
        let spaces = Spaces::new(cfg, Arc::new(Clock::manual()));
        spaces.initialize(0, "kv", 8).unwrap();
        spaces.initialize(1, "kv", 8).unwrap();
        let rec = Arc::new(Recorder::default());
        assert!(spaces.set_events(rec.clone()));
        let d = "ab".repeat(32);
        let on = |rank: u32, f: &dyn Fn(&Store)| spaces.with(rank, "kv", |st| f(st)).unwrap();
        // Stored in each space: one BlockStored per space.
        on(0, &|st| drop(save(st, 0, &[&d])));
        on(0, &|st| {
            let mut out = Vec::new();
            st.locations(0, &[&d], &mut out).unwrap();
            assert!(out[0].is_some());
        });
        assert_eq!(rec.take(), vec![(0, vec![Event::Stored(key(&d))])]);
        on(1, &|st| drop(save(st, 0, &[&d])));
        assert_eq!(rec.take(), vec![(0, vec![Event::Stored(key(&d))])], "the second space's own");
        // A repeat in a space that holds it already announces nothing.
        on(0, &|st| {
            let mut out = Vec::new();
            st.locations(0, &[&d], &mut out).unwrap();
            st.confirm(0, &[(&d, i64::from(out[0].unwrap()))], &[]).unwrap();
        });
        assert_eq!(rec.take(), vec![]);
        // Space 1 loses it: one BlockRemoved; space 0 still holds it.
        on(1, &|st| assert_eq!(st.delete(0, &[&d]).unwrap().deleted, 1));
        assert_eq!(rec.take(), vec![(0, vec![Event::Removed(key(&d))])]);
        on(1, &|st| assert_eq!(st.delete(0, &[&d]).unwrap().deleted, 0));
        assert_eq!(rec.take(), vec![], "gone from that space already: nothing");
        on(0, &|st| {
            let mut all = Vec::new();
            st.complete_blocks(|b| all.push(b));
            assert_eq!(all, vec![key(&d)]);
        });
        // A router counting announcements per hash (as vLLM's offloading
        // events ask) holds the block until its last space loses it.
        on(0, &|st| assert_eq!(st.delete(0, &[&d]).unwrap().deleted, 1));
        assert_eq!(rec.take(), vec![(0, vec![Event::Removed(key(&d))])]);
    }
}
