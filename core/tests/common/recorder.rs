//! A journal that records every change the store reports, without its
//! generation (`core/tests/core/eviction.rs`, `core/tests/core/model_eviction/`).

use hf3fs_meta_core::{Change, Journal};
use std::sync::Mutex;

/// One journaled change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    Init { rank: u32, num_pages: u32 },
    Bind { rank: u32, page: u32, key: String, world: u32 },
    Unbind { rank: u32, page: u32 },
    Clear,
}

/// Every change to a binding, in the order the store reported them.
///
/// The store also journals reservations and holds; these tests
/// check bindings, so the recorder keeps what changes one: a `Hold` (a
/// bound page unbound, held for a lease) is recorded as an `Unbind`; a
/// `Reserve`, and an `Unbind` of a page that holds no binding (a
/// reservation's or a hold's end), are left out. `tests/durable_*` check
/// those records.
#[derive(Default)]
pub struct JournalRecorder(pub Mutex<Vec<Rec>>, Mutex<std::collections::HashSet<(u32, u32)>>);

impl Journal for JournalRecorder {
    fn record(&self, change: Change<'_>) {
        let mut bound = self.1.lock().unwrap();
        let rec = match change {
            Change::Initialize { rank, num_pages, .. } => Rec::Init { rank, num_pages },
            Change::Bind { rank, page, key, world, .. } => {
                bound.insert((rank, page));
                Rec::Bind { rank, page, key: key.to_string(), world }
            }
            Change::Unbind { rank, page, .. } | Change::Hold { rank, page, .. } => {
                if !bound.remove(&(rank, page)) {
                    return;
                }
                Rec::Unbind { rank, page }
            }
            Change::Reserve { .. } => return,
            Change::Clear { .. } => {
                bound.clear();
                Rec::Clear
            }
        };
        self.0.lock().unwrap().push(rec);
    }
}
