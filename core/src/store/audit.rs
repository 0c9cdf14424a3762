//! The store's audit: every invariant of the design notes, checked over a
//! quiescent store (tests call it at the end of a run).

use super::super::pages::PageState;
use super::super::sync::Ordering;
use super::{Stats, Store};

impl Store {
    /// Checks every invariant of the design notes. Only meaningful while no
    /// request is in flight (tests call it at the end of a run).
    pub fn audit(&self) -> Result<Stats, String> {
        let current = self.current.load_full();
        let mut bound_pages = 0u64;
        let mut reserved_pages = 0i64;
        let mut quarantined = 0u64;
        for (r, t) in current.ranks.iter().enumerate() {
            let Some(t) = t.get() else { continue };
            let c = t.audit().map_err(|e| format!("rank {r}: {e}"))?;
            bound_pages += c.bound;
            reserved_pages += c.reserved as i64;
            let mut err = None;
            t.for_each_bound(|p| {
                if err.is_some() {
                    return;
                }
                match t.owner(p).map(|o| current.index.key_of(&o).ok_or(o)) {
                    None if t.is_quarantined(p) => quarantined += 1,
                    None => err = Some(format!("rank {r}: BOUND page {p} has no owner and is not quarantined")),
                    Some(Err(o)) => err = Some(format!("rank {r}: BOUND page {p} names {o:?}, which names no key")),
                    Some(Ok(k)) if current.index.page(k.as_ref(), r as u32) != Some(p) => {
                        err = Some(format!("rank {r}: page {p} names key {k}, whose binding is elsewhere"));
                    }
                    Some(Ok(_)) => {}
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
        }
        let (mut keys, mut complete, mut bindings) = (0i64, 0i64, 0u64);
        let mut err = None;
        current.index.for_each(|k, e| {
            keys += 1;
            complete += i64::from(e.complete());
            let mut n = 0;
            for (r, p) in e.bindings() {
                n += 1;
                bindings += 1;
                let ok = current.rank(i64::from(r)).is_some_and(|t| {
                    p < t.num_pages() && t.state(p) == PageState::Bound && current.index.owns(t, p, k)
                });
                if !ok && err.is_none() {
                    err = Some(format!("key {k} is bound to page {p} of rank {r}, which is not BOUND to it"));
                }
            }
            if n == 0 && err.is_none() {
                err = Some(format!("key {k} has no binding"));
            }
            // Complete keys complete: `complete()` reads the count of bound
            // ranks, which must be the bindings the key holds.
            if n != e.bound() && err.is_none() {
                err = Some(format!(
                    "key {k} counts {} bound ranks (complete: {}, world {}) but holds {n} bindings",
                    e.bound(),
                    e.complete(),
                    e.world()
                ));
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        if bindings + quarantined != bound_pages {
            return Err(format!(
                "{bindings} key bindings and {quarantined} quarantined pages but {bound_pages} BOUND pages"
            ));
        }
        let stats = self.stats();
        if keys != current.keys.load(Ordering::Relaxed) || complete != current.complete.load(Ordering::Relaxed) {
            return Err(format!(
                "counted {keys} keys / {complete} complete, counters say {} / {}",
                current.keys.load(Ordering::Relaxed),
                current.complete.load(Ordering::Relaxed)
            ));
        }
        if reserved_pages != current.reserved.load(Ordering::Relaxed) {
            return Err(format!(
                "{reserved_pages} RESERVED pages, but the reservation counter says {}",
                current.reserved.load(Ordering::Relaxed)
            ));
        }
        Ok(stats)
    }
}
