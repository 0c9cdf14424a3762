//! `Store::confirm`: confirm written pages and release failed ones on one
//! rank, atomically, in three steps:
//!
//! 1. **validate**: everything that can be checked without claiming a page
//!    (ranges, one page named twice); most rejections cost no CAS at all.
//! 2. **claim**: every page RESERVED|BOUND → BUSY in page order (two requests
//!    never wait on each other in a cycle), held by a [`ClaimGuard`]. A page
//!    that is FREE, or BOUND to another key, ends the request: the guard's
//!    drop puts every page back as it was, so a rejected request changes
//!    nothing by construction, whatever the path out (an early return or a
//!    panic).
//! 3. **commit**: releases first, then confirmations in request order, each
//!    page's key binding and back-reference written before its final state
//!    is published. The commit cannot fail.

use super::super::error::{ConfirmError, ErrorCode};
use super::super::events::{Block, Event};
use super::super::index::{Bind, Binder, Delta, KeyIndex};
use super::super::journal::Change;
use super::super::key::{Digest, KeyRef};
use super::super::lease;
use super::super::pages::{ClaimGuard, Claimed, Owner, PageTable, FREE};
use super::super::sync::Ordering;
use super::batch_keys::AllocKey;
use super::{ConfirmOutcome, Generation, Store};

/// One item of a confirm request, sorted by page for claiming.
#[derive(Clone, Copy)]
struct Item {
    page: u32,
    /// Index into confirmations, or `RELEASE | index` into releases.
    tag: u32,
}

/// What [`validate`] found: the items to claim, in page order.
struct Validated {
    items: Vec<Item>,
    /// The items are the confirmations, in request order (their pages
    /// ascend), and there is no release: item `i`'s claim is then
    /// confirmation `i`'s.
    in_order: bool,
}

/// Marks a release in [`Item::tag`]; confirmations sort first on equal pages.
const RELEASE: u32 = 1 << 31;

impl Item {
    #[inline]
    fn release(self) -> Option<usize> {
        (self.tag & RELEASE != 0).then_some((self.tag & !RELEASE) as usize)
    }
}

impl Store {
    /// Confirms `confirmations` and releases `releases` on `rank`, atomically:
    /// either all of it takes effect or none does and the typed error says why.
    /// The keys as text: each is parsed once ([`KeyRef::parse`]), then as
    /// [`Store::confirm_keys`].
    pub fn confirm(
        &self,
        rank: i64,
        confirmations: &[(&str, i64)],
        releases: &[i64],
    ) -> Result<ConfirmOutcome, ConfirmError> {
        let parsed: Vec<(KeyRef<'_>, i64)> = confirmations.iter().map(|&(k, p)| (KeyRef::parse(k), p)).collect();
        self.confirm_keys(rank, &parsed, releases)
    }

    /// [`Store::confirm`] of keys already parsed (the decoder classifies
    /// them while it scans the body).
    pub fn confirm_keys(
        &self,
        rank: i64,
        confirmations: &[(KeyRef<'_>, i64)],
        releases: &[i64],
    ) -> Result<ConfirmOutcome, ConfirmError> {
        self.confirm_with(rank, confirmations, releases)
    }

    /// [`Store::confirm_keys`] of SGLang digest keys given as their digests
    /// ([`KeyRef::Digest`]): SGLang's confirm body, decoded straight into
    /// digests, each bound through the digest map with no key to classify.
    /// The same checks, bindings, journal records and answers as of the
    /// same keys classified.
    pub fn confirm_digests(
        &self,
        rank: i64,
        confirmations: &[(Digest, i64)],
        releases: &[i64],
    ) -> Result<ConfirmOutcome, ConfirmError> {
        self.confirm_with(rank, confirmations, releases)
    }

    /// The confirm of keys of any [`ConfirmKey`] kind.
    fn confirm_with<K: ConfirmKey>(
        &self,
        rank: i64,
        confirmations: &[(K, i64)],
        releases: &[i64],
    ) -> Result<ConfirmOutcome, ConfirmError> {
        let current = self.current.load();
        let table =
            current.rank(rank).ok_or_else(|| ConfirmError::new(ErrorCode::RankNotInitialized, rank, None, None))?;
        let v = validate(rank, table.num_pages(), confirmations, releases)?;
        let claim = claim(&current.index, table, rank, &v.items, confirmations)?;
        fail_point_before_commit();
        Ok(Commit::new(self, &current, table, rank as u32).confirm(confirmations, releases, &v, claim))
    }
}

/// One rank's held pages being settled by one request (a confirm's commit,
/// a delete, a reset's pass over a rank): where they are (the store, its
/// generation, the rank's table and number) and what the request owes when
/// it ends (the index's [`Delta`], the pages freed to the free counter,
/// the key events when a sink is attached), paid by [`Commit::finish`].
pub(super) struct Commit<'a> {
    store: &'a Store,
    current: &'a Generation,
    table: &'a PageTable,
    r: u32,
    delta: Delta,
    freed: u64,
    /// Reservations this commit ended (bound, superseded or released).
    unreserved: u64,
    /// The key events so far, in order, when the store has a sink.
    events: Option<Vec<Event>>,
}

impl<'a> Commit<'a> {
    /// A commit on rank `r`, whose table is `table`, of generation `current`.
    #[inline]
    pub(super) fn new(store: &'a Store, current: &'a Generation, table: &'a PageTable, r: u32) -> Commit<'a> {
        let events = store.events().map(|e| e.buffer(0));
        Commit { store, current, table, r, delta: Delta::default(), freed: 0, unreserved: 0, events }
    }

    /// Hands the key events gathered so far to the store's sink.
    #[inline]
    fn emit(&mut self) {
        if let Some(ev) = self.events.take() {
            self.store.emit(self.current.id, ev);
        }
    }

    /// Gives the pages freed back to the free counter, applies the index's
    /// delta and hands on the key events.
    #[inline]
    pub(super) fn finish(mut self) {
        self.emit();
        self.table.give_back(self.freed);
        self.current.apply(self.delta);
        // After the keys the bindings added (see `reserved_less`).
        self.current.reserved_less(self.unreserved);
    }

    /// Step 3 of a confirm: settles every claimed page. Releases first, so
    /// that a request which releases a key's old page and confirms a new one
    /// for it ends with the new one.
    fn confirm<K: ConfirmKey>(
        mut self,
        confirmations: &[(K, i64)],
        releases: &[i64],
        v: &Validated,
        claim: ClaimGuard<'_>,
    ) -> ConfirmOutcome {
        let (store, current, table, r) = (self.store, self.current, self.table, self.r);
        // The journal hears the whole commit as one operation.
        let _op = store.journal_op();
        // One reclamation guard for the batch: the index's guard per bind
        // or unbind is then a counter's increment, not an epoch
        // announcement (a `SeqCst` RMW) a key.
        let _pin = scc::Guard::new();
        let held = claim.commit();
        let mut outcome = ConfirmOutcome::default();
        // What each confirmation's page was, by its place in the request;
        // `None` for a repeat of an earlier identical confirmation (not
        // claimed). Not needed when the items are the confirmations in
        // order: confirmation i's claim is then held[i].
        let mut claims: Vec<Option<Claimed>> = Vec::new();
        if !v.in_order {
            claims = vec![None; confirmations.len()];
            let mut release_claims = vec![Claimed::Reserved; releases.len()];
            for (it, &(_, _, c)) in v.items.iter().zip(&held) {
                match it.release() {
                    Some(i) => release_claims[i] = c,
                    None => claims[it.tag as usize] = Some(c),
                }
            }
            let now = store.clock.now();
            for (&page, &c) in releases.iter().zip(&release_claims) {
                let page = page as u32;
                outcome.released += 1;
                let owner = if c == Claimed::Bound { table.owner(page) } else { None };
                debug_assert!(c != Claimed::Bound || owner.is_some(), "claim refuses a BOUND page naming no key");
                match owner {
                    // The page is held, so its key stays and its id names
                    // it: unbound by id, with no look-up of the key.
                    Some(o) => {
                        if self.unbind_held(page, o.as_owner(), now) == Unbound::Quarantined {
                            outcome.quarantined += 1;
                        }
                    }
                    None => {
                        // A reservation ends: journaled while the page is held.
                        store.record(Change::Unbind { generation: current.id, rank: r, page });
                        table.settle(page, FREE);
                        self.freed += 1;
                        self.unreserved += 1;
                    }
                }
            }
        }
        let world = || store.cfg.world_size.unwrap_or_else(|| current.initialized.load(Ordering::Relaxed));
        // Pages that end BOUND settle a state word at a time, once their
        // key is bound and journaled (consecutive pages of one word in one
        // RMW), after the loop at the latest.
        let mut bound = BoundRun::default();
        // With a key-event sink, the pages bound here are published only
        // once the batch is handed on (`crate::events`).
        let mut deferred: Vec<u32> = Vec::new();
        if let Some(ev) = &mut self.events {
            deferred = DEFERRED.take();
            if ev.capacity() < confirmations.len() {
                ev.reserve(confirmations.len());
            }
            deferred.reserve(confirmations.len());
        }
        let mut binder = current.index.binder(confirmations.len());
        // The delta's complete count before the binding at hand.
        let mut complete = self.delta.complete;
        // One loop, the body inline (as a closure called from a loop of
        // each kind, it cost about 35 instructions a key in calls). The key
        // by reference (see `Binder::bind`).
        for (i, (k, page)) in confirmations.iter().enumerate() {
            let page = *page as u32;
            let c = if v.in_order {
                held[i].2
            } else if let Some(c) = claims[i] {
                c
            } else {
                continue;
            };
            match c {
                Claimed::Bound => {
                    bound.add(table, page);
                    current.index.reader().touch(k.key());
                    outcome.reconfirmed += 1;
                }
                Claimed::Reserved => match k.bind(&mut binder, r, page, world, &mut self.delta) {
                    Bind::Bound(world, id) => {
                        match id {
                            Some(id) => table.set_owner_id_reserved(page, id),
                            None => table.set_owner(page, Owner::Key(k.key())),
                        }
                        // Only with a journal to hear it: made before the
                        // journal's check, the change cost 15 instructions a
                        // key without one.
                        if store.journal.is_some() {
                            store.record(Change::Bind { generation: current.id, rank: r, page, key: k.key(), world });
                        }
                        match &mut self.events {
                            // With a key-event sink: a binding that made
                            // the key complete (the index said so in the
                            // delta) is a store, and the page is published
                            // BOUND only once the batch is handed on.
                            Some(ev) => {
                                if self.delta.complete > complete {
                                    // Each variant written as itself: through
                                    // `Block::of` the whole 38-byte event was
                                    // copied from a temporary.
                                    match k.key() {
                                        KeyRef::Hex(v) => ev.push(Event::Stored(Block::Hex(v.to_be_bytes()))),
                                        KeyRef::Digest(d) => ev.push(Event::Stored(Block::Digest(d))),
                                        KeyRef::Text(_) => {}
                                    }
                                }
                                complete = self.delta.complete;
                                deferred.push(page);
                            }
                            None => bound.add(table, page),
                        }
                        outcome.bound += 1;
                        self.unreserved += 1;
                    }
                    // Every id taken: as if the key had been evicted
                    // at once (the page goes back to the pool).
                    Bind::Kept(_) | Bind::Full => {
                        store.record(Change::Unbind { generation: current.id, rank: r, page });
                        table.settle(page, FREE);
                        self.freed += 1;
                        self.unreserved += 1;
                        outcome.superseded += 1;
                    }
                },
            }
        }
        drop(binder);
        if self.events.is_some() {
            self.emit();
            for &p in &deferred {
                bound.add(table, p);
            }
            if deferred.capacity() <= DEFERRED_KEPT {
                deferred.clear();
                DEFERRED.set(deferred);
            }
        }
        bound.flush(table);
        self.finish();
        outcome
    }
}

std::thread_local! {
    /// The pages a confirm with a key-event sink publishes BOUND after its
    /// batch, kept from request to request on each thread (no allocation
    /// a request; taken and put back, so a nested or interleaved use only
    /// makes a new one).
    static DEFERRED: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest [`DEFERRED`] kept (pages; a larger one is freed).
const DEFERRED_KEPT: usize = 4096;

/// Held pages to settle BOUND, gathered while they share a state word
/// ([`PageTable::settle_bound_in_word`]): a confirm's pages mostly come a
/// few to a word, and each word is then one RMW rather than one per page.
#[derive(Default)]
struct BoundRun {
    /// The word and its lanes gathered, when any.
    run: Option<(usize, u64)>,
}

impl BoundRun {
    /// Adds `page` (held BUSY), settling the run before when `page` is in
    /// another word.
    #[inline]
    fn add(&mut self, table: &PageTable, page: u32) {
        let (w, lane) = PageTable::lane_of(page);
        match &mut self.run {
            Some((rw, lanes)) if *rw == w => *lanes |= lane,
            _ => {
                self.flush(table);
                self.run = Some((w, lane));
            }
        }
    }

    /// Settles the pages gathered.
    fn flush(&mut self, table: &PageTable) {
        if let Some((w, lanes)) = self.run.take() {
            table.settle_bound_in_word(w, lanes);
        }
    }
}

/// What became of a bound page that its holder unbound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unbound {
    /// FREE now; the caller owes the free counter one page.
    Freed,
    /// BOUND to no key until the key's lease passes.
    Quarantined,
}

impl Commit<'_> {
    /// Unbinds `page`, which this thread holds BUSY (claimed BOUND) and
    /// which `owner` owns (as the page's owner word names it, or the key
    /// itself), and settles it: FREE (counted in the pages freed), or
    /// quarantined when a reader's lease on the key may still cover it. The
    /// release path of a confirm and of SGLang's `delete_keys`.
    pub(super) fn unbind_held(&mut self, page: u32, owner: Owner<'_>, now: u32) -> Unbound {
        let (store, current, table, r) = (self.store, self.current, self.table, self.r);
        // Whether the page must be held: a reader may have been given it
        // within the key's lease, or before a restart within the lease
        // period that follows it (leases are not journaled). Read before
        // the journal hears of the unbinding, which it then hears of as a
        // hold or as a free page; either is journaled before the index
        // forgets the binding, so a confirm that rebinds the key elsewhere
        // can only be journaled after. Journaled outside the key's lock: a
        // journal's `record` may let another request run (tests do), and
        // that request may need the key.
        let lease = current.index.deadline_of(owner).filter(|&d| lease::live(d, now));
        let hold = lease::latest(lease, store.restart_hold(now));
        let journaled_hold = hold.is_some();
        if journaled_hold {
            store.record(Change::Hold { generation: current.id, rank: r, page });
        } else {
            store.record(Change::Unbind { generation: current.id, rank: r, page });
        }
        // The deadline read again with the unbinding, in one step under the
        // key's lock.
        let deadline = match &mut self.events {
            None => current.index.unbind_owner(owner, r, page, &mut self.delta, |deadline| deadline),
            // With a sink: the key as the unbinding read it (exact while
            // the page is held; by id, no look-up of the key and no owned
            // key: they had cost about 75 instructions a page), and
            // whether this unbinding made it incomplete (the delta says).
            Some(ev) => {
                let before = self.delta.complete;
                let removed = |delta: &Delta, k: KeyRef<'_>| {
                    if delta.complete < before {
                        // Each variant written as itself (as the confirm's
                        // stores are).
                        match k {
                            KeyRef::Hex(v) => ev.push(Event::Removed(Block::Hex(v.to_be_bytes()))),
                            KeyRef::Digest(d) => ev.push(Event::Removed(Block::Digest(d))),
                            KeyRef::Text(_) => {}
                        }
                    }
                };
                current.index.unbind_owner_named(owner, r, page, &mut self.delta, |deadline| deadline, removed)
            }
        };
        debug_assert!(deadline.is_some(), "a BOUND page's owner must be bound to it");
        // The key's lock was held only for the unbind: a reader may have
        // raised the lease since the look above. Hold for the later one.
        let lease = deadline.filter(|&d| lease::live(d, now));
        let hold = lease::latest(lease, hold);
        if let Some(d) = hold {
            if lease.is_some() && !journaled_hold {
                // Leased since the look: the journal hears of the hold
                // after the free page, while the page is still held.
                store.record(Change::Hold { generation: current.id, rank: r, page });
            }
            // No other key gets the page before the hold passes.
            table.quarantine(page, d);
            return Unbound::Quarantined;
        }
        table.clear_owner(page);
        table.settle(page, FREE);
        self.freed += 1;
        Unbound::Freed
    }
}

/// Step 1: ranges and pages named twice, checked without touching a page.
/// Returns the items to claim, in page order, without repeats of an
/// identical confirmation.
fn validate<K: ConfirmKey>(
    rank: i64,
    num_pages: u32,
    confirmations: &[(K, i64)],
    releases: &[i64],
) -> Result<Validated, ConfirmError> {
    let n = i64::from(num_pages);
    let out_of_range =
        |page: i64, key: Option<KeyRef<'_>>| ConfirmError::keyed(ErrorCode::PageOutOfRange, rank, Some(page), key);
    let mut items = Vec::with_capacity(confirmations.len() + releases.len());
    // Whether the pages ascend, each above the last: then they are in page
    // order already, none is named twice, and (with no releases) the items
    // are the confirmations in request order ([`Validated::in_order`]).
    let mut ascending = true;
    let mut last = -1;
    for (i, &(key, page)) in confirmations.iter().enumerate() {
        if !(0..n).contains(&page) {
            return Err(out_of_range(page, Some(key.key())));
        }
        ascending &= page > last;
        last = page;
        items.push(Item { page: page as u32, tag: i as u32 });
    }
    if ascending && releases.is_empty() {
        return Ok(Validated { items, in_order: true });
    }
    for (i, &page) in releases.iter().enumerate() {
        if !(0..n).contains(&page) {
            return Err(out_of_range(page, None));
        }
        items.push(Item { page: page as u32, tag: RELEASE | i as u32 });
    }
    items.sort_unstable_by_key(|it| (it.page, it.tag));
    let mut repeat = vec![false; confirmations.len()];
    for pair in items.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.page != b.page {
            continue;
        }
        let page = Some(i64::from(a.page));
        match (a.release(), b.release()) {
            (None, None) => {
                let (ka, kb) = (&confirmations[a.tag as usize].0, &confirmations[b.tag as usize].0);
                // Equal keys are equal texts: parsing is injective.
                if ka != kb {
                    return Err(ConfirmError::keyed(ErrorCode::DoubleConfirm, rank, page, Some(kb.key())));
                }
                repeat[b.tag as usize] = true;
            }
            (None, Some(_)) => {
                let key = confirmations[a.tag as usize].0.key();
                return Err(ConfirmError::keyed(ErrorCode::ConfirmAndRelease, rank, page, Some(key)));
            }
            _ => return Err(ConfirmError::new(ErrorCode::DoubleRelease, rank, page, None)),
        }
    }
    items.retain(|it| it.release().is_some() || !repeat[it.tag as usize]);
    Ok(Validated { items, in_order: false })
}

/// Step 2: claims every page in page order and checks what it found. On the
/// first conflict the guard is dropped, which puts back every page claimed.
/// The pages of one state word are claimed with one CAS when each is
/// RESERVED or BOUND, one by one otherwise (a FREE page ends the request
/// where the claims in page order would, a BUSY one is waited for).
fn claim<'t, K: ConfirmKey>(
    index: &KeyIndex,
    table: &'t PageTable,
    rank: i64,
    items: &[Item],
    confirmations: &[(K, i64)],
) -> Result<ClaimGuard<'t>, ConfirmError> {
    let mut guard = ClaimGuard::new(items.len());
    let mut n = 0;
    while n < items.len() {
        // The items from `n` on whose pages share its state word (distinct
        // pages, validate's check: at most a word's lanes), claimed with
        // one CAS when each can be: the claims the loop below would make
        // one by one, page order kept.
        let (w, mut lanes) = PageTable::lane_of(items[n].page);
        let mut end = n + 1;
        while let Some(o) = items.get(end) {
            let (ow, lane) = PageTable::lane_of(o.page);
            if ow != w {
                break;
            }
            lanes |= lane;
            end += 1;
        }
        let run = &items[n..end];
        let old = if run.len() >= 2 { guard.claim_word(table, w, lanes, run.iter().map(|it| it.page)) } else { None };
        for it in run {
            let claimed = match old {
                Some(old) => {
                    Some(if old & PageTable::lane_of(it.page).1 != 0 { Claimed::Reserved } else { Claimed::Bound })
                }
                None => guard.claim(table, it.page),
            };
            check(index, table, rank, it, claimed, confirmations)?;
        }
        n = end;
    }
    Ok(guard)
}

/// A key of a confirm's batch as [`Store::confirm_with`] takes it: a
/// classified key, or an SGLang digest key's digest (the decoder's fast
/// path), bound through its own map with no variant to match. Its text and
/// tag are an allocate's ([`AllocKey`]).
trait ConfirmKey: AllocKey + PartialEq {
    /// [`Binder::bind`] of the key.
    fn bind(
        &self,
        binder: &mut Binder<'_>,
        rank: u32,
        page: u32,
        world: impl FnOnce() -> u32,
        delta: &mut Delta,
    ) -> Bind;
}

impl ConfirmKey for KeyRef<'_> {
    #[inline]
    fn bind(
        &self,
        binder: &mut Binder<'_>,
        rank: u32,
        page: u32,
        world: impl FnOnce() -> u32,
        delta: &mut Delta,
    ) -> Bind {
        binder.bind(self, rank, page, world, delta)
    }
}

impl ConfirmKey for Digest {
    #[inline]
    fn bind(
        &self,
        binder: &mut Binder<'_>,
        rank: u32,
        page: u32,
        world: impl FnOnce() -> u32,
        delta: &mut Delta,
    ) -> Bind {
        binder.bind_digest(self, rank, page, world, delta)
    }
}

/// What `claimed` (the claim of item `it`'s page) says of the request: an
/// error when the page is not what the item needs.
#[inline]
fn check<K: ConfirmKey>(
    index: &KeyIndex,
    table: &PageTable,
    rank: i64,
    it: &Item,
    claimed: Option<Claimed>,
    confirmations: &[(K, i64)],
) -> Result<(), ConfirmError> {
    let page = Some(i64::from(it.page));
    let key = || confirmations[it.tag as usize].0.key();
    // The tag of the key read in place, variant by variant: through a copy
    // of the whole 48-byte key first, the check cost 16 instructions a key
    // more.
    let tag = || confirmations[it.tag as usize].0.tag();
    match (claimed, it.release()) {
        (None, Some(_)) => Err(ConfirmError::new(ErrorCode::ReleaseUnallocated, rank, page, None)),
        // Released already and held back for a lease: as good as free.
        (Some(Claimed::Bound), Some(_)) if !table.has_owner(it.page) => {
            Err(ConfirmError::new(ErrorCode::ReleaseUnallocated, rank, page, None))
        }
        (None, None) => Err(ConfirmError::keyed(ErrorCode::ConfirmUnallocated, rank, page, Some(key()))),
        (Some(Claimed::Reserved), None) if table.reservation_tag(it.page) != tag() => {
            Err(ConfirmError::keyed(ErrorCode::ReservedForOtherKey, rank, page, Some(key())))
        }
        (Some(Claimed::Bound), None) if !index.owns(table, it.page, key()) => {
            let mut e = ConfirmError::keyed(ErrorCode::DoubleConfirm, rank, page, Some(key()));
            e.already_bound = true;
            Err(e)
        }
        (Some(_), _) => Ok(()),
    }
}

#[cfg(test)]
thread_local! {
    /// Makes the next confirm on this thread panic between claim and commit.
    static PANIC_BEFORE_COMMIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A test's way to fail between claim and commit; nothing in a build.
#[inline]
fn fail_point_before_commit() {
    #[cfg(test)]
    if PANIC_BEFORE_COMMIT.with(|p| p.replace(false)) {
        panic!("injected failure between claim and commit");
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::StoreConfig;

    const K: [&str; 4] = [
        "00000000000000000000000000000001",
        "00000000000000000000000000000002",
        "00000000000000000000000000000003",
        "plain text key",
    ];

    /// Everything a client could observe, and the audit.
    fn observe(s: &Store) -> (crate::Stats, Vec<Option<u32>>) {
        s.audit().expect("audit");
        let mut loc = Vec::new();
        s.locations(0, &K, &mut loc).unwrap();
        (s.stats(), loc)
    }

    /// A journal that keeps the page changes: (hold?, rank, page) for the
    /// holds and unbinds, in order.
    #[derive(Default)]
    struct Frees(crate::sync::Mutex<Vec<(bool, u32, u32)>>);

    impl crate::Journal for Frees {
        fn record(&self, c: Change<'_>) {
            let mut v = self.0.lock().unwrap();
            match c {
                Change::Hold { rank, page, .. } => v.push((true, rank, page)),
                Change::Unbind { rank, page, .. } => v.push((false, rank, page)),
                _ => {}
            }
        }
    }

    /// A release of a leased key's page holds the page (journaled once, as
    /// a hold) until the lease passes, whatever the kind of key: a hex key
    /// and an SGLang digest (released by id) and a text key (by key); an
    /// unleased key's page is free at once (journaled as free).
    #[test]
    fn a_release_of_a_leased_key_is_held_for_every_kind_of_key() {
        let frees = std::sync::Arc::new(Frees::default());
        let cfg = StoreConfig {
            world_size: Some(1),
            read_lease: crate::LeaseLength(100),
            manual_clock: true,
            ..StoreConfig::default()
        };
        let s = Store::with_journal(cfg, Some(frees.clone()), 0);
        s.initialize(0, 64).unwrap();
        let digest = format!("{:064x}-k", 7);
        let keys = [K[0], digest.as_str(), K[3], K[1], K[2]];
        let mut out = Vec::new();
        s.allocate(0, &keys, &mut out).unwrap();
        let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
        let conf: Vec<(&str, i64)> = keys.iter().copied().zip(pages.iter().copied()).collect();
        s.confirm(0, &conf, &[]).unwrap();
        // The first three leased by a read; the last two not.
        let mut loc = Vec::new();
        s.locations(0, &keys[..3], &mut loc).unwrap();
        assert_eq!(loc, pages[..3].iter().map(|&p| Some(p as u32)).collect::<Vec<_>>());
        frees.0.lock().unwrap().clear();
        let o = s.confirm(0, &[], &pages).unwrap();
        assert_eq!((o.released, o.quarantined), (5, 3));
        let mut journaled = std::mem::take(&mut *frees.0.lock().unwrap());
        journaled.sort_by_key(|&(_, _, p)| p);
        let mut want: Vec<(bool, u32, u32)> = pages.iter().enumerate().map(|(i, &p)| (i < 3, 0, p as u32)).collect();
        want.sort_by_key(|&(_, _, p)| p);
        assert_eq!(journaled, want, "one change a page: a hold for the leased, a free page for the rest");
        let mut e = Vec::new();
        s.exists(&keys, &mut e);
        assert_eq!(e, [false; 5], "released at once for readers");
        let st = s.stats();
        assert_eq!((st.keys, st.ranks[0].quarantined, st.ranks[0].counts.free), (0, 3, 61));
        s.audit().unwrap();
        s.set_clock(200);
        assert_eq!(s.maintain(64).quarantine_freed, 3);
        assert_eq!(s.stats().ranks[0].counts.free, 64);
        s.audit().unwrap();
    }

    #[test]
    fn a_panic_between_claim_and_commit_changes_nothing() {
        let s = Store::new(StoreConfig { world_size: Some(1), ..StoreConfig::default() });
        s.initialize(0, 64).unwrap();
        let mut out = Vec::new();
        s.allocate(0, &K, &mut out).unwrap();
        let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
        // Two keys stored, two reserved: the request below claims pages of
        // both kinds (a re-confirm, a release of a bound page, confirms).
        s.confirm(0, &[(K[0], pages[0]), (K[1], pages[1])], &[]).unwrap();
        let before = observe(&s);
        let confirmations = [(K[0], pages[0]), (K[2], pages[2]), (K[3], pages[3])];
        PANIC_BEFORE_COMMIT.with(|p| p.set(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.confirm(0, &confirmations, &[pages[1]])));
        assert!(r.is_err(), "the fail point must fire");
        assert_eq!(observe(&s), before, "a confirm that died before its commit changed something");
        // The same request, not interrupted, then goes through.
        let o = s.confirm(0, &confirmations, &[pages[1]]).unwrap();
        assert_eq!((o.bound, o.reconfirmed, o.released), (2, 1, 1));
        s.audit().unwrap();
    }

    #[test]
    fn a_conflict_after_claims_puts_every_claimed_page_back() {
        let s = Store::new(StoreConfig { world_size: Some(1), ..StoreConfig::default() });
        s.initialize(0, 64).unwrap();
        let mut out = Vec::new();
        s.allocate(0, &K[..3], &mut out).unwrap();
        let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
        s.confirm(0, &[(K[0], pages[0])], &[]).unwrap();
        let before = observe(&s);
        // Claims pages[1] and pages[2] (reserved) and then meets page 63,
        // which is FREE: the whole request is rejected.
        let free = 63;
        assert!(!pages.contains(&free));
        let e = s.confirm(0, &[(K[1], pages[1]), (K[2], pages[2]), (K[3], free)], &[]).unwrap_err();
        assert_eq!(e.code, ErrorCode::ConfirmUnallocated);
        assert_eq!(observe(&s), before);
        // A page bound to another key, met after claims.
        let e = s.confirm(0, &[(K[1], pages[1]), (K[2], pages[0])], &[pages[2]]).unwrap_err();
        assert_eq!((e.code, e.already_bound), (ErrorCode::DoubleConfirm, true));
        assert_eq!(observe(&s), before);
    }
}
