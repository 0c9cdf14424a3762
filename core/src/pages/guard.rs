//! The claim guard: the undo log of pages held BUSY by one request.

use super::{Claimed, PageTable};

/// Pages one request holds BUSY, each with the state it had: the undo log
/// of a claim, over one rank or several (an eviction claims a key's page on
/// every rank). Dropping the guard puts every page back as it was, in
/// reverse order, so any early return or panic between claim and commit
/// rolls the request back by itself; [`ClaimGuard::commit`] hands the pages
/// over to the caller's commit instead.
pub struct ClaimGuard<'t> {
    held: Vec<(&'t PageTable, u32, Claimed)>,
}

impl<'t> ClaimGuard<'t> {
    /// An empty guard, with room for `n` pages.
    pub fn new(n: usize) -> Self {
        Self { held: Vec::with_capacity(n) }
    }

    /// An empty guard on the allocation of `buffer` (from an earlier
    /// [`commit`](Self::commit)), so that a loop of claims allocates once.
    pub fn reusing(mut buffer: Vec<(&'t PageTable, u32, Claimed)>) -> Self {
        buffer.clear();
        Self { held: buffer }
    }

    /// Claims `page` of `table` ([`PageTable::claim`], which waits for a
    /// BUSY page) and, when it was claimed, holds it.
    pub fn claim(&mut self, table: &'t PageTable, page: u32) -> Option<Claimed> {
        let c = table.claim(page)?;
        self.held.push((table, page, c));
        Some(c)
    }

    /// Claims `pages` of `table` (distinct, ascending, in one state word)
    /// at once when each is RESERVED or BOUND ([`PageTable::claim_together`])
    /// and holds them, in order; false when it claimed none (claim them
    /// one by one then).
    pub fn claim_together(&mut self, table: &'t PageTable, pages: &[u32]) -> bool {
        let Some(old) = table.claim_together(pages) else { return false };
        for &page in pages {
            let (_, low) = PageTable::lane_of(page);
            let c = if old & low != 0 { Claimed::Reserved } else { Claimed::Bound };
            self.held.push((table, page, c));
        }
        true
    }

    /// Claims the pages of state word `w` of `table` whose lanes' low bits
    /// `lanes` has, at once, when each is RESERVED or BOUND
    /// ([`PageTable::claim_lanes`]), and holds them in the order of `pages`
    /// (those same pages, ascending); returns the word as it was before
    /// (each page's old state in its lane), or `None` when it claimed none.
    #[inline]
    pub fn claim_word(
        &mut self,
        table: &'t PageTable,
        w: usize,
        lanes: u64,
        pages: impl Iterator<Item = u32>,
    ) -> Option<u64> {
        let old = table.claim_lanes(w, lanes)?;
        self.held.extend(pages.map(|page| {
            let (pw, low) = PageTable::lane_of(page);
            debug_assert!(pw == w && lanes & low != 0, "claim_word's pages are its lanes'");
            (table, page, if old & low != 0 { Claimed::Reserved } else { Claimed::Bound })
        }));
        Some(old)
    }

    /// Claims `page` of `table` only if it is BOUND now, without waiting
    /// ([`PageTable::try_claim_bound`]); holds it when claimed.
    pub fn try_claim_bound(&mut self, table: &'t PageTable, page: u32) -> bool {
        let ok = table.try_claim_bound(page);
        if ok {
            self.held.push((table, page, Claimed::Bound));
        }
        ok
    }

    /// The pages held, in claim order, with what each was.
    pub fn held(&self) -> &[(&'t PageTable, u32, Claimed)] {
        &self.held
    }

    /// Ends the claim without rollback: every held page stays BUSY, and the
    /// caller now owes each one a [`PageTable::settle`].
    pub fn commit(mut self) -> Vec<(&'t PageTable, u32, Claimed)> {
        std::mem::take(&mut self.held)
    }

    /// Ends the claim with rollback, like a drop, and hands back the
    /// allocation for [`reusing`](Self::reusing).
    pub fn abort(mut self) -> Vec<(&'t PageTable, u32, Claimed)> {
        let mut held = std::mem::take(&mut self.held);
        for &(table, page, c) in held.iter().rev() {
            table.settle(page, c.bits());
        }
        held.clear();
        held
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        for &(table, page, c) in self.held.iter().rev() {
            table.settle(page, c.bits());
        }
    }
}
