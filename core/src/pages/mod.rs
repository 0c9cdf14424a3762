//! The per-rank page table: one 2-bit state per page, packed 32 to an
//! `AtomicU64`, moved only by compare-and-swap.
//!
//! | state      | bits | meaning                                                    |
//! |------------|------|------------------------------------------------------------|
//! | `FREE`     | `00` | in the pool                                                |
//! | `RESERVED` | `01` | handed out by an allocate, not yet confirmed or released   |
//! | `BOUND`    | `10` | holds a confirmed key on this rank; `owner` names the key  |
//! | `BUSY`     | `11` | claimed by one in-flight confirm/release, which alone may move it on |
//!
//! FREE is all-zero so that a fresh table is lazily zeroed memory: a rank of
//! 10^8 pages costs no time and no resident memory until pages are used.
//!
//! Beside the states the table keeps:
//! - `free`, a counter of FREE pages nobody has promised yet. An allocate
//!   takes its whole batch from the counter *first* (all or nothing, O(1)), so
//!   the page search that follows cannot fail, and a full rank answers at once.
//! - `full`, one hint bit per state word meaning "this word has no FREE page",
//!   so a search at 99% fill skips 64 words (2048 pages) per load.
//! - `stamps`, one byte per word: the reservation epoch of the newest
//!   reservation in that word, for reservation expiry (see [`PageTable::expire`]).
//! - `owners`, the page → key back-reference: the 4-byte id of a vLLM hex
//!   key or an SGLang digest in the key index (lazily zeroed), or a mark
//!   with the key on the side in `key_owners` (any other text, boxed).
//!
//! Memory: 2 bits of state + 1/32 byte of stamp + 1/32 bit of hint per page
//! (0.28 byte), plus 4 bytes of back-reference per page that has ever been
//! bound. All of it is reserved virtual memory that becomes resident only when
//! touched.
//!
//! # Memory ordering
//!
//! The state word is the only synchronization point for a page:
//! - Every transition is an RMW (`compare_exchange` or `fetch_xor`). Claims use
//!   `AcqRel`, so a claimer sees everything the previous owner of the page
//!   published, and settling a page uses `Release`, publishing the owner
//!   back-reference written while the page was BUSY. The back-reference itself
//!   is therefore accessed `Relaxed`: it is only written by the one thread that
//!   holds the page BUSY, and only read by a thread that acquired the page's
//!   state afterwards (or by the quiescent audit).
//! - A reservation stamp is stored `Relaxed` *before* the CAS that reserves the
//!   page (which releases it); the sweeper loads the word with `Acquire` before
//!   reading the stamp, so it never sees a new reservation with an old stamp.
//!   Because a page can be released and reserved again between the sweeper's
//!   load and its CAS (ABA: the word looks unchanged), the sweeper's CAS only
//!   claims the old reservations BUSY; it then reads the stamp again and frees
//!   them only if it is still old (found by the loom model d4).
//! - A page becomes FREE (state word, `Release`) before its hint bit is cleared
//!   and before `free` is incremented (`Release`); an allocator takes from
//!   `free` with `AcqRel`, so the pages it was promised are visible to its search.
//! - The `full` hint is maintained by RMWs on both sides: an allocator that
//!   fills a word sets the bit (`AcqRel`) and then re-reads the word, clearing
//!   the bit again if a page was freed meanwhile; a releaser frees the page,
//!   then clears the bit (`AcqRel`). Whichever RMW on the hint word comes second
//!   sees the other's word change, so a word with a FREE page is never left
//!   marked full. The search also falls back to a hint-free pass, so even a
//!   stale hint could only cost time, never a page.
//! - `cursor` is a rotating start hint; `Relaxed`, its value only spreads
//!   concurrent allocators over different words.

use super::key::{Key, KeyRef};
use super::sync::{AtomicU32, AtomicU64, AtomicU8, Backoff, Mutex, Ordering, PoisonError};
use super::zeroed::{OutOfMemory, ZeroedSlice};

mod guard;
mod sweep;

pub use guard::ClaimGuard;

/// An owner word naming no key.
const NO_OWNER: u32 = 0;
/// An owner word whose key is in the side map.
const SIDE: u32 = u32::MAX;

/// What names the key of a page: a vLLM hex key or an SGLang digest by its
/// id in the key index (4 bytes a page), any other key by itself, on the
/// side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    /// A hex or digest key's id (what [`crate::index::Bind::Bound`] and
    /// [`crate::index::EntryRef::id`] give; a digest's carries
    /// [`crate::index::DIGEST_ID`]).
    Id(u32),
    /// Any other key.
    Key(KeyRef<'a>),
}

impl<'a> Owner<'a> {
    /// The owner `key` gives its pages, `id` being its id in the key index
    /// when it has one.
    pub fn of(key: KeyRef<'a>, id: Option<u32>) -> Self {
        id.map_or(Owner::Key(key), Owner::Id)
    }
}

/// An [`Owner`], owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// A hex or digest key's id.
    Id(u32),
    /// Any other key.
    Key(Key),
}

impl Owned {
    /// The [`Owner`] this names, borrowed.
    pub fn as_owner(&self) -> Owner<'_> {
        match self {
            Owned::Id(id) => Owner::Id(*id),
            Owned::Key(k) => Owner::Key(k.as_ref()),
        }
    }
}

/// State bits of a FREE page.
pub const FREE: u64 = 0b00;
/// State bits of a RESERVED page.
pub const RESERVED: u64 = 0b01;
/// State bits of a BOUND page.
pub const BOUND: u64 = 0b10;
/// State bits of a BUSY page.
pub const BUSY: u64 = 0b11;

/// Pages per state word.
const LANES: u32 = 32;
/// The low bit of every 2-bit lane.
const LOW: u64 = 0x5555_5555_5555_5555;

/// The state of one page, as read by [`PageTable::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// In the pool.
    Free,
    /// Handed out, not yet confirmed or released.
    Reserved,
    /// Holds a confirmed key.
    Bound,
    /// Claimed by an in-flight confirm/release.
    Busy,
}

impl PageState {
    fn from_bits(bits: u64) -> Self {
        match bits & 0b11 {
            FREE => PageState::Free,
            RESERVED => PageState::Reserved,
            BOUND => PageState::Bound,
            _ => PageState::Busy,
        }
    }
}

/// What a page was before [`PageTable::claim`] made it BUSY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// It was RESERVED.
    Reserved,
    /// It was BOUND.
    Bound,
}

impl Claimed {
    /// The state bits to restore on rollback.
    pub fn bits(self) -> u64 {
        match self {
            Claimed::Reserved => RESERVED,
            Claimed::Bound => BOUND,
        }
    }
}

/// Page counts by state, from a scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// FREE pages.
    pub free: u64,
    /// RESERVED pages.
    pub reserved: u64,
    /// BOUND pages.
    pub bound: u64,
    /// BUSY pages (transient).
    pub busy: u64,
}

/// Lanes of `word` whose state is FREE, as a mask of lane low bits.
#[inline]
fn free_lanes(word: u64) -> u64 {
    !(word | (word >> 1)) & LOW
}

/// Lanes of `word` whose state is RESERVED (`01`).
#[inline]
fn reserved_lanes(word: u64) -> u64 {
    word & !(word >> 1) & LOW
}

/// The page-state table of one rank.
pub struct PageTable {
    /// Number of pages; pages are `0..num_pages`.
    num_pages: u32,
    /// The 2-bit page states, 32 per word.
    words: ZeroedSlice<AtomicU64>,
    /// One bit per state word: set means "probably no FREE page here".
    full: ZeroedSlice<AtomicU64>,
    /// Per state word, the epoch of its newest reservation.
    stamps: ZeroedSlice<AtomicU8>,
    /// One word per page: the id of the hex or digest key bound to it,
    /// `SIDE` for a key kept in `key_owners`, `NO_OWNER` for none.
    owners: ZeroedSlice<AtomicU32>,
    /// Owners of pages bound to keys without an id (text keys, boxed).
    key_owners: scc::HashMap<u32, Key>,
    /// FREE pages not yet promised to an allocator.
    free: AtomicU64,
    /// Rotating start hint for the page search, in words.
    cursor: AtomicU64,
    /// The CLOCK hand of eviction, in words (see `Store`'s evictor).
    hand: AtomicU64,
    /// Pages released while a reader's lease may still cover them: BOUND
    /// with no owner until their deadline passes, then freed. Rare in steady
    /// state (a failed write of a stored key), so a mutex; after a restart
    /// or a promotion every release lands here for one lease.
    quarantine: Mutex<Vec<(u32, u32)>>,
    /// How many pages `quarantine` holds, read without its lock.
    quarantined: AtomicU64,
    /// The earliest deadline in `quarantine` (meaningless while it is
    /// empty), written under its lock and read without it, so that an
    /// allocate finds "nothing due yet" in one load instead of walking the
    /// list: after a restart the list holds every page released within a
    /// lease, and a walk per allocate cost 88% of a leader's time.
    next_due: AtomicU32,
}

impl PageTable {
    /// A table of `num_pages` FREE pages. O(1): the memory is lazily zeroed.
    pub fn new(num_pages: u32) -> Result<Self, OutOfMemory> {
        let nwords = (num_pages as usize).div_ceil(LANES as usize);
        Ok(Self {
            num_pages,
            words: ZeroedSlice::new(nwords)?,
            full: ZeroedSlice::new(nwords.div_ceil(64))?,
            stamps: ZeroedSlice::new(nwords)?,
            owners: ZeroedSlice::new(num_pages as usize)?,
            key_owners: scc::HashMap::new(),
            free: AtomicU64::new(u64::from(num_pages)),
            cursor: AtomicU64::new(0),
            hand: AtomicU64::new(0),
            quarantine: Mutex::new(Vec::new()),
            quarantined: AtomicU64::new(0),
            next_due: AtomicU32::new(0),
        })
    }

    /// Number of pages in this rank.
    pub fn num_pages(&self) -> u32 {
        self.num_pages
    }

    /// The free counter: FREE pages that no allocator has been promised.
    pub fn free_count(&self) -> u64 {
        // Relaxed: a statistic; callers that act on it use try_take.
        self.free.load(Ordering::Relaxed)
    }

    #[inline]
    fn locate(page: u32) -> (usize, u32) {
        ((page / LANES) as usize, (page % LANES) * 2)
    }

    /// The lanes of word `w` that are real pages (the last word may be partial).
    #[inline]
    fn valid_lanes(&self, w: usize) -> u64 {
        let tail = self.num_pages % LANES;
        if tail != 0 && w + 1 == self.words.len() {
            LOW & ((1u64 << (2 * tail)) - 1)
        } else {
            LOW
        }
    }

    /// The current state of `page` (must be in range).
    pub fn state(&self, page: u32) -> PageState {
        let (w, shift) = Self::locate(page);
        PageState::from_bits(self.words[w].load(Ordering::Acquire) >> shift)
    }

    /// Takes `n` pages from the free counter, all or nothing.
    ///
    /// On success the caller must follow with [`reserve`](Self::reserve) for
    /// exactly `n` pages.
    pub fn try_take(&self, n: u64) -> bool {
        // AcqRel: acquiring the releases that incremented the counter makes
        // the pages they freed visible to the search that follows.
        self.free.fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| free.checked_sub(n)).is_ok()
    }

    /// Takes up to `n` pages from the free counter: as many as it holds, at
    /// most `n`. Returns how many; the caller must follow with
    /// [`reserve`](Self::reserve) for exactly that many.
    pub fn take_up_to(&self, n: u64) -> u64 {
        // AcqRel: as in `try_take`.
        match self.free.fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| (free > 0).then(|| free - free.min(n)))
        {
            Ok(free) => free.min(n),
            Err(_) => 0,
        }
    }

    /// Returns `n` pages to the free counter, after they were made FREE.
    pub fn give_back(&self, n: u64) {
        if n > 0 {
            // Release: publishes the FREE states written before.
            self.free.fetch_add(n, Ordering::Release);
        }
    }

    /// Reserves `n` FREE pages, calling `emit` with each, stamping their words
    /// with `epoch`. `n` must have been taken with [`try_take`](Self::try_take),
    /// which guarantees the pages exist, so this always completes.
    ///
    /// The pages' reservation tags are left as they were: for callers that
    /// check none (the page table's own tests and benchmarks). The store
    /// reserves with [`reserve_tagged`](Self::reserve_tagged).
    pub fn reserve(&self, n: u64, epoch: u8, mut emit: impl FnMut(u32)) {
        self.reserve_with(n, epoch, false, &mut |p| {
            emit(p);
            0
        });
    }

    /// [`reserve`](Self::reserve), recording for each page the tag `emit`
    /// returns for it ([`crate::KeyRef::tag`] of the key it is reserved for).
    ///
    /// Each page is claimed BUSY first (00 → 11), gets its tag while held,
    /// and only then becomes RESERVED (11 → 01, `Release`): a confirm that
    /// meets the page RESERVED therefore always reads the tag of the
    /// reservation it met, never a stale one. `emit` runs while the page is
    /// BUSY, so a change it journals is ordered before any later change of
    /// the page.
    pub fn reserve_tagged(&self, n: u64, epoch: u8, mut emit: impl FnMut(u32) -> u32) {
        self.reserve_with(n, epoch, true, &mut emit);
    }

    /// Generic in `emit` rather than `dyn`: no indirect call a page, and
    /// the allocate's closure is inlined into the search.
    fn reserve_with(&self, mut n: u64, epoch: u8, tagged: bool, emit: &mut impl FnMut(u32) -> u32) {
        let nwords = self.words.len();
        if n == 0 || nwords == 0 {
            return;
        }
        // Relaxed: a hint that spreads allocators over different words. It
        // moves by the words `n` pages fill, no more: pages are handed out
        // densely, so that a rank's back-references and states stay in as
        // few memory pages as its keys need (moving one word further left a
        // 32-page hole every 4 words, and a rank 90 % full touched every
        // page of its back-references: perf/RESULTS.md, the 10^7-key scale runs).
        let start = (self.cursor.fetch_add(n.div_ceil(u64::from(LANES)), Ordering::Relaxed) % nwords as u64) as usize;
        let mut use_hints = true;
        let mut backoff = Backoff::default();
        loop {
            for (from, to) in [(start, nwords), (0, start)] {
                let mut w = from;
                while w < to {
                    if use_hints {
                        w = self.next_not_full(w);
                        if w >= to {
                            break;
                        }
                    }
                    n -= self.reserve_in_word(w, n, epoch, tagged, emit);
                    if n == 0 {
                        return;
                    }
                    w += 1;
                }
            }
            // A whole pass found too few pages: others took the ones we saw
            // and freed some behind us. Look again at every word, hints aside.
            use_hints = false;
            backoff.snooze();
        }
    }

    /// The first word at or after `w` whose full hint is clear, or
    /// `words.len()` when there is none.
    #[inline]
    fn next_not_full(&self, w: usize) -> usize {
        let mut i = w / 64;
        // Relaxed: a hint; a wrong answer costs a look at one word.
        let mut open = !self.full[i].load(Ordering::Relaxed) & (!0u64 << (w % 64));
        loop {
            if open != 0 {
                return (i * 64 + open.trailing_zeros() as usize).min(self.words.len());
            }
            i += 1;
            if i == self.full.len() {
                return self.words.len();
            }
            open = !self.full[i].load(Ordering::Relaxed);
        }
    }

    /// Reserves up to `want` FREE pages of word `w`; returns how many.
    #[inline]
    fn reserve_in_word(&self, w: usize, want: u64, epoch: u8, tagged: bool, emit: &mut impl FnMut(u32) -> u32) -> u64 {
        let word = &self.words[w];
        let valid = self.valid_lanes(w);
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let mut free = free_lanes(cur) & valid;
            if free == 0 {
                self.mark_full(w);
                return 0;
            }
            let mut take = 0u64;
            let mut got = 0u64;
            while free != 0 && got < want {
                let lane = free & free.wrapping_neg();
                take |= lane;
                free ^= lane;
                got += 1;
            }
            // Relaxed: published by the Release half of the CAS below.
            self.stamps[w].store(epoch, Ordering::Relaxed);
            // 00 → 01 for each taken lane (set its low bit); tagged, 00 → 11
            // first (both bits), and 11 → 01 once the tags are written.
            let set = if tagged { take * 3 } else { take };
            match word.compare_exchange_weak(cur, cur | set, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let base = w as u32 * LANES;
                    let lanes = take;
                    while take != 0 {
                        let page = base + take.trailing_zeros() / 2;
                        let tag = emit(page);
                        if tagged {
                            // Relaxed: published by the Release below.
                            self.owners[page as usize].store(tag, Ordering::Relaxed);
                        }
                        take &= take - 1;
                    }
                    if tagged {
                        // 11 → 01. Release: publishes the tags.
                        word.fetch_xor(lanes << 1, Ordering::Release);
                    }
                    if free == 0 {
                        self.mark_full(w);
                    }
                    return got;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Sets word `w`'s full hint, then re-checks the word (see the module's
    /// memory-ordering note).
    fn mark_full(&self, w: usize) {
        let bit = 1u64 << (w % 64);
        let hint = &self.full[w / 64];
        if hint.load(Ordering::Relaxed) & bit != 0 {
            return;
        }
        hint.fetch_or(bit, Ordering::AcqRel);
        if free_lanes(self.words[w].load(Ordering::Acquire)) & self.valid_lanes(w) != 0 {
            hint.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Clears word `w`'s full hint after a page of it became FREE.
    fn clear_full(&self, w: usize) {
        // An unconditional RMW: a load-then-skip here could miss an allocator's
        // concurrent fetch_or (the store-buffering pattern).
        self.full[w / 64].fetch_and(!(1u64 << (w % 64)), Ordering::AcqRel);
    }

    /// Claims `page` for an in-flight confirm or release: RESERVED or BOUND
    /// becomes BUSY and the old state is returned. A FREE page is not claimed
    /// (`None`). A page that another request holds BUSY is waited for.
    pub fn claim(&self, page: u32) -> Option<Claimed> {
        let (w, shift) = Self::locate(page);
        let word = &self.words[w];
        let mut backoff = Backoff::default();
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let claimed = match (cur >> shift) & 0b11 {
                FREE => return None,
                RESERVED => Claimed::Reserved,
                BOUND => Claimed::Bound,
                _ => {
                    // BUSY: another request commits this page right now.
                    backoff.snooze();
                    cur = word.load(Ordering::Acquire);
                    continue;
                }
            };
            match word.compare_exchange_weak(cur, cur | (BUSY << shift), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(claimed),
                Err(now) => cur = now,
            }
        }
    }

    /// Claims `pages` (distinct pages of one state word) with one CAS when
    /// every one of them is RESERVED or BOUND at that moment, and returns
    /// the word as it was before (each page's old state is in its lane);
    /// claims none and returns `None` when one is FREE or BUSY, for the
    /// caller to claim them one by one ([`claim`](Self::claim)), which
    /// decides for a FREE page and waits for a BUSY one. A confirm's pages
    /// sit mostly a few to a word: one RMW for each word rather than each
    /// page (instructions per request, perf/README.md).
    pub fn claim_together(&self, pages: &[u32]) -> Option<u64> {
        let (w, _) = Self::locate(*pages.first()?);
        let mut lanes = 0u64;
        for &p in pages {
            let (pw, shift) = Self::locate(p);
            debug_assert_eq!(pw, w, "claim_together's pages share a word");
            if pw != w {
                return None;
            }
            lanes |= 1 << shift;
        }
        self.claim_lanes(w, lanes)
    }

    /// [`claim_together`](Self::claim_together) of the pages of state word
    /// `w` whose lanes' low bits `lanes` has (as [`lane_of`](Self::lane_of)
    /// gives them): for a caller that gathered them already.
    #[inline]
    pub fn claim_lanes(&self, w: usize, lanes: u64) -> Option<u64> {
        let word = &self.words[w];
        let mut cur = word.load(Ordering::Acquire);
        loop {
            // RESERVED (01) or BOUND (10): exactly one of a lane's two bits.
            if (cur ^ (cur >> 1)) & lanes != lanes {
                return None;
            }
            // AcqRel, as `claim`'s.
            match word.compare_exchange_weak(cur, cur | (lanes * BUSY), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(cur),
                Err(now) => cur = now,
            }
        }
    }

    /// Moves pages of state word `w` that this thread holds BUSY to BOUND
    /// with one RMW: `lanes` has the low bit of each page's lane. What
    /// [`settle`](Self::settle) to BOUND does page by page.
    pub fn settle_bound_in_word(&self, w: usize, lanes: u64) {
        if lanes == 0 {
            return;
        }
        // 11 → 10 for each lane: clear its low bit. Release: publishes the
        // back-references written while BUSY.
        let prev = self.words[w].fetch_xor(lanes, Ordering::Release);
        debug_assert_eq!(prev & (lanes * BUSY), lanes * BUSY, "settling pages not held BUSY");
    }

    /// The state word of `page` and its lane's low bit, for
    /// [`settle_bound_in_word`](Self::settle_bound_in_word).
    #[inline]
    pub fn lane_of(page: u32) -> (usize, u64) {
        let (w, shift) = Self::locate(page);
        (w, 1 << shift)
    }

    /// Claims a FREE page directly (FREE → BUSY), taking it from the free
    /// counter; for rebuilding state from a journal. False when the page is
    /// not FREE.
    pub fn claim_free(&self, page: u32) -> bool {
        let (w, shift) = Self::locate(page);
        let word = &self.words[w];
        let mut cur = word.load(Ordering::Acquire);
        loop {
            if (cur >> shift) & 0b11 != FREE || !self.try_take(1) {
                return false;
            }
            match word.compare_exchange(cur, cur | (BUSY << shift), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => {
                    self.give_back(1);
                    cur = now;
                }
            }
        }
    }

    /// Claims `page` if it is BOUND now (BOUND → BUSY), without waiting: the
    /// evictor's claim, which gives up on a key rather than wait.
    pub fn try_claim_bound(&self, page: u32) -> bool {
        let (w, shift) = Self::locate(page);
        let word = &self.words[w];
        let mut cur = word.load(Ordering::Acquire);
        loop {
            if (cur >> shift) & 0b11 != BOUND {
                return false;
            }
            match word.compare_exchange_weak(cur, cur | (BUSY << shift), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Moves a page this thread holds BUSY to `to` (FREE, RESERVED or BOUND).
    ///
    /// A page set FREE has its hint cleared here; the caller then returns it to
    /// the counter with [`give_back`](Self::give_back).
    pub fn settle(&self, page: u32, to: u64) {
        let (w, shift) = Self::locate(page);
        // We own the lane (it is BUSY = 11), so XOR with 11 ^ to is exact.
        // Release: publishes the back-reference written while BUSY.
        let prev = self.words[w].fetch_xor((BUSY ^ to) << shift, Ordering::Release);
        debug_assert_eq!((prev >> shift) & 0b11, BUSY, "settling a page not held BUSY");
        if to == FREE {
            self.clear_full(w);
        }
    }

    /// Records `owner` as the owner of `page`, which this thread holds BUSY.
    pub fn set_owner(&self, page: u32, owner: Owner<'_>) {
        let word = match owner {
            Owner::Id(id) => {
                debug_assert!(id != NO_OWNER && id != SIDE, "ids are below MAX_IDS, flagged or not");
                // A key replacing a side owner must not leave it behind.
                if self.owner_word(page) == SIDE {
                    self.key_owners.remove_sync(&page);
                }
                id
            }
            Owner::Key(k) => {
                self.key_owners.upsert_sync(page, k.to_key());
                SIDE
            }
        };
        // Relaxed: published by settle's Release (see the module note).
        self.owners[page as usize].store(word, Ordering::Relaxed);
    }

    /// [`set_owner`](Self::set_owner) of an [`Owner::Id`], for a page that
    /// this thread holds BUSY, claimed RESERVED (a confirm's new binding):
    /// such a page has no side owner to drop (a page leaves BOUND without
    /// one, [`clear_owner`](Self::clear_owner)), so this is one store.
    #[inline]
    pub fn set_owner_id_reserved(&self, page: u32, id: u32) {
        debug_assert!(id != NO_OWNER && id != SIDE, "ids are below MAX_IDS, flagged or not");
        debug_assert!(self.key_owners.read_sync(&page, |_, _| ()).is_none(), "a reserved page has no side owner");
        // Relaxed: published by settle's Release (see the module note).
        self.owners[page as usize].store(id, Ordering::Relaxed);
    }

    #[inline]
    fn owner_word(&self, page: u32) -> u32 {
        // Relaxed: the caller acquired the page's state (claim) first.
        self.owners[page as usize].load(Ordering::Relaxed)
    }

    /// The owner of `page`; the page must be BOUND, or BUSY from BOUND and
    /// held by this thread.
    pub fn owner(&self, page: u32) -> Option<Owned> {
        match self.owner_word(page) {
            NO_OWNER => None,
            SIDE => self.key_owners.read_sync(&page, |_, k| Owned::Key(k.clone())),
            id => Some(Owned::Id(id)),
        }
    }

    /// The id that names the owner of `page` (held as for
    /// [`owner`](Self::owner)), when it is named by one.
    pub fn owner_id(&self, page: u32) -> Option<u32> {
        Some(self.owner_word(page)).filter(|&w| w != NO_OWNER && w != SIDE)
    }

    /// Whether `page` (held as for [`owner`](Self::owner)) is bound to `owner`.
    pub fn owner_is(&self, page: u32, owner: Owner<'_>) -> bool {
        match (self.owner_word(page), owner) {
            (NO_OWNER, _) => false,
            (SIDE, Owner::Key(k)) => self.key_owners.read_sync(&page, |_, o| o.as_ref() == k).unwrap_or(false),
            (SIDE, Owner::Id(_)) | (_, Owner::Key(_)) => false,
            (w, Owner::Id(id)) => w == id,
        }
    }

    /// The reservation tag of `page`, which this thread holds BUSY, claimed
    /// RESERVED ([`reserve_tagged`](Self::reserve_tagged)). A RESERVED page
    /// keeps its tag in its back-reference word, unused until it is bound.
    pub fn reservation_tag(&self, page: u32) -> u32 {
        self.owner_word(page)
    }

    /// Makes a FREE `page` RESERVED for the key tagged `tag`, stamped with
    /// `epoch`, while rebuilding state from a journal. False when the page
    /// is not FREE.
    pub fn restore_reserved(&self, page: u32, tag: u32, epoch: u8) -> bool {
        if !self.claim_free(page) {
            return false;
        }
        let (w, _) = Self::locate(page);
        // Relaxed: published by settle's Release.
        self.stamps[w].store(epoch, Ordering::Relaxed);
        self.owners[page as usize].store(tag, Ordering::Relaxed);
        self.settle(page, RESERVED);
        true
    }

    /// Makes a FREE `page` quarantined until tick `deadline` while
    /// rebuilding state from a journal (a page held at the crash). False
    /// when the page is not FREE.
    pub fn restore_held(&self, page: u32, deadline: u32) -> bool {
        if !self.claim_free(page) {
            return false;
        }
        self.quarantine(page, deadline);
        true
    }

    /// Forgets the owner of `page` (held BUSY) as it leaves BOUND. An id
    /// stays behind, unread, until the page is bound again (one store less
    /// on the release path).
    pub fn clear_owner(&self, page: u32) {
        if self.owner_word(page) == SIDE {
            self.key_owners.remove_sync(&page);
            self.owners[page as usize].store(NO_OWNER, Ordering::Relaxed);
        }
    }

    /// Forgets the owner of `page` (held BUSY) entirely, so that the page
    /// names no key (a quarantined page; or a page whose key was evicted).
    pub fn forget_owner(&self, page: u32) {
        self.clear_owner(page);
        // Relaxed: published by settle's Release.
        self.owners[page as usize].store(NO_OWNER, Ordering::Relaxed);
    }

    /// Whether `page` (held as for [`owner`](Self::owner)) names a key; a
    /// BOUND page that names none is quarantined.
    pub fn has_owner(&self, page: u32) -> bool {
        self.owner_word(page) != NO_OWNER
    }

    /// Checks this table's own invariants; only meaningful when no request is
    /// in flight. Returns the counts.
    pub fn audit(&self) -> Result<Counts, String> {
        let c = self.counts();
        if c.busy != 0 {
            return Err(format!("{} pages BUSY with nothing in flight", c.busy));
        }
        if c.free + c.reserved + c.bound != u64::from(self.num_pages) {
            return Err(format!("page states add up to {:?}, not {}", c, self.num_pages));
        }
        if self.free_count() != c.free {
            return Err(format!("free counter {} but {} FREE pages", self.free_count(), c.free));
        }
        for w in 0..self.words.len() {
            let v = self.words[w].load(Ordering::Acquire);
            if v & !(self.valid_lanes(w) * 3) != 0 {
                return Err(format!("word {w} has state bits beyond the last page"));
            }
            let hinted_full = self.full[w / 64].load(Ordering::Relaxed) & (1 << (w % 64)) != 0;
            if hinted_full && free_lanes(v) & self.valid_lanes(w) != 0 {
                return Err(format!("word {w} has FREE pages but is hinted full"));
            }
        }
        Ok(c)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
