//! Clients that reserve and vanish: allocate fresh (and some stored) keys on
//! a few ranks and on the vanish rank, then drop the connection without
//! confirming or releasing. Two of these run, racing on the vanish rank,
//! whose pages can leave the reserved state only by expiry.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{fresh_keys, pace};
use crate::counters::Kind;
use crate::ctx::{Ctx, Link};
use crate::cycle::allocate;
use crate::universe::{mix64, MAX_BATCH};
use crate::{VANISH, VANISH_PAGES, WORLD};

/// Vanishing client number `id` (see the module doc).
pub(super) async fn injector(ctx: Arc<Ctx>, id: u64, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0x7a15 ^ (id << 20)));
    while ctx.running(until) {
        let mut link = Link::new(ctx.a.addr);
        let mut keys = fresh_keys(&mut rng, MAX_BATCH);
        let fresh = keys.len();
        if rng.gen_bool(0.3) {
            keys.extend(ctx.u.batch(&mut rng).into_iter().take(MAX_BATCH - fresh));
        }
        let ranks = rng.gen_range(1..=WORLD);
        let first = rng.gen_range(0..WORLD);
        for j in 0..ranks {
            let r = (first + j) % WORLD;
            if let Some(pages) = allocate(&ctx, &mut link, Kind::Fault, r, &keys).await {
                let n = pages[..fresh].iter().filter(|&&p| p >= 0).count();
                ctx.c.vanished_pages.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        // The vanish rank: fresh keys only, so the grant is all or nothing.
        let keys = fresh_keys(&mut rng, 256);
        if let Some(pages) = allocate(&ctx, &mut link, Kind::Fault, VANISH, &keys).await {
            check_all_or_nothing(&ctx, &pages);
        }
        drop(link);
        ctx.c.fault("vanishing_client");
        pace(&ctx).await;
    }
}

/// An allocate of fresh keys on the vanish rank grants every page or none,
/// each page once and in range.
fn check_all_or_nothing(ctx: &Ctx, pages: &[i64]) {
    let granted = pages.iter().filter(|&&p| p >= 0).count();
    if granted == pages.len() {
        ctx.c.vanish_rank_pages.fetch_add(granted as u64, Ordering::Relaxed);
    } else if granted == 0 {
        ctx.c.vanish_rank_refused.fetch_add(pages.len() as u64, Ordering::Relaxed);
    } else {
        ctx.violation(format!(
            "vanish rank: allocate of {} fresh keys granted {granted} pages (not all or nothing)",
            pages.len()
        ));
    }
    let mut sorted: Vec<i64> = pages.iter().copied().filter(|&p| p >= 0).collect();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != granted || sorted.iter().any(|&p| p >= i64::from(VANISH_PAGES)) {
        ctx.violation(format!("vanish rank: an allocate answered a page twice or out of range: {pages:?}"));
    }
}
