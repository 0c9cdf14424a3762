//! The store's journaled changes as owned records that keep their
//! generation (`core/tests/core/model.rs`, `core/tests/core/stress`).

use hf3fs_meta_core::Change;

/// One journaled change, with the generation it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationRec {
    Init { generation: u64, rank: u32, num_pages: u32 },
    Bind { generation: u64, rank: u32, page: u32, key: String, world: u32 },
    Unbind { generation: u64, rank: u32, page: u32 },
    Clear { generation: u64 },
}

/// Turns the store's changes into [`GenerationRec`]s of bindings: a `Hold` (a bound
/// page unbound, held for a lease) becomes an `Unbind`; a `Reserve`, and an
/// `Unbind` of a page that holds no binding (a reservation's or a hold's
/// end), are left out. These tests check bindings;
/// `tests/durable_*` check the other records. Call it in record order
/// (under the journal's lock).
#[derive(Debug, Default)]
pub struct Bindings(std::collections::HashSet<(u64, u32, u32)>);

impl Bindings {
    /// The record `change` makes, if it changes a binding.
    pub fn admit(&mut self, change: Change<'_>) -> Option<GenerationRec> {
        Some(match change {
            Change::Initialize { generation, rank, num_pages } => GenerationRec::Init { generation, rank, num_pages },
            Change::Bind { generation, rank, page, key, world } => {
                self.0.insert((generation, rank, page));
                GenerationRec::Bind { generation, rank, page, key: key.to_string(), world }
            }
            Change::Unbind { generation, rank, page } | Change::Hold { generation, rank, page } => {
                if !self.0.remove(&(generation, rank, page)) {
                    return None;
                }
                GenerationRec::Unbind { generation, rank, page }
            }
            Change::Reserve { .. } => return None,
            Change::Clear { generation } => GenerationRec::Clear { generation },
        })
    }
}
