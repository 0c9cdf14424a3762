//! The store's journaled changes as owned records that keep their
//! generation (`tests/core/model.rs`, `tests/core/stress`).

use hf3fs_meta::core::Change;

/// One journaled change, with the generation it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    Init { generation: u64, rank: u32, num_pages: u32 },
    Bind { generation: u64, rank: u32, page: u32, key: String, world: u32 },
    Unbind { generation: u64, rank: u32, page: u32 },
    Clear { generation: u64 },
}

impl From<Change<'_>> for Rec {
    fn from(change: Change<'_>) -> Rec {
        match change {
            Change::Initialize { generation, rank, num_pages } => Rec::Init { generation, rank, num_pages },
            Change::Bind { generation, rank, page, key, world } => {
                Rec::Bind { generation, rank, page, key: key.to_string(), world }
            }
            Change::Unbind { generation, rank, page } => Rec::Unbind { generation, rank, page },
            Change::Clear { generation } => Rec::Clear { generation },
        }
    }
}
