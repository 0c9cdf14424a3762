//! A journal that records every change the store reports, without its
//! generation (`tests/core/eviction.rs`, `tests/core/model_eviction.rs`).

use hf3fs_meta::core::{Change, Journal};
use std::sync::Mutex;

/// One journaled change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    Init { rank: u32, num_pages: u32 },
    Bind { rank: u32, page: u32, key: String, world: u32 },
    Unbind { rank: u32, page: u32 },
    Clear,
}

/// Every change, in the order the store reported them.
#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<Rec>>);

impl Journal for Recorder {
    fn record(&self, change: Change<'_>) {
        let rec = match change {
            Change::Initialize { rank, num_pages, .. } => Rec::Init { rank, num_pages },
            Change::Bind { rank, page, key, world, .. } => Rec::Bind { rank, page, key: key.to_string(), world },
            Change::Unbind { rank, page, .. } => Rec::Unbind { rank, page },
            Change::Clear { .. } => Rec::Clear,
        };
        self.0.lock().unwrap().push(rec);
    }
}
