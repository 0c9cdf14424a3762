//! Typed errors of the core, one variant per error code of the wire contract.
//!
//! They carry the rank, page and key a client needs to act, and format their
//! message only when displayed: nothing here costs anything on success. The
//! HTTP layer maps each one to a status and body in one place
//! (`http::reply::confirm_error` and the handlers of `http::vllm` and
//! `http::sglang`, in the server crate).

use crate::key::KeyRef;
use std::fmt;

/// The machine-readable code of a typed error: a failed `confirm_write`
/// ([`ErrorCode::CONFIRM`]), or a request refused for its tenant
/// ([`ErrorCode::TENANT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The rank was never initialized (or was cleared).
    RankNotInitialized,
    /// A page is negative or not below the rank's `num_pages`.
    PageOutOfRange,
    /// Confirming a page that is FREE: never reserved, released, or expired.
    ConfirmUnallocated,
    /// Confirming a page bound to another key, or one page for two keys in
    /// one request.
    DoubleConfirm,
    /// Releasing a page that is FREE.
    ReleaseUnallocated,
    /// The same page listed twice in `pages_to_release`.
    DoubleRelease,
    /// One page both confirmed and released in the same request.
    ConfirmAndRelease,
    /// Confirming a page reserved for another key: its writer's
    /// reservation expired and the page went to another writer, or the
    /// client confirms a key on a page it was not given. Caught unless the
    /// two keys' 32-bit tags collide (2^-32).
    ReservedForOtherKey,
    /// The request names a tenant the server does not serve (never
    /// configured, removed, or `default` disabled).
    UnknownTenant,
    /// The connection's tenant (its client certificate's, or its listen
    /// address's) is not the one its path names.
    TenantMismatch,
    /// An allocate beyond the tenant's `max_keys` that eviction could not
    /// make room for.
    TenantQuota,
    /// An allocate beyond the tenant's `max_reservations` (pages reserved
    /// and not yet confirmed, released or expired).
    TenantReservations,
    /// A strict-layout tenant's initialize with another page count than
    /// the rank (or SGLang space) was first initialized with.
    LayoutMismatch,
    /// A tenant's data request beyond its `max_concurrent_requests`.
    TenantBusy,
    /// A tenant's data request beyond its `rate_limit_rps` (its token
    /// bucket is empty).
    TenantRateLimited,
    /// The admin route's reload of the tenants file failed (a bad file, a
    /// state that did not open, an address not bound): nothing changed.
    TenantsReloadFailed,
}

impl ErrorCode {
    /// Every code: [`ErrorCode::CONFIRM`]'s, then [`ErrorCode::TENANT`]'s
    /// (`docs/error-codes.json` is generated from this list).
    pub const ALL: [ErrorCode; 16] = {
        let (confirm, tenant) = (ErrorCode::CONFIRM, ErrorCode::TENANT);
        let mut all = [ErrorCode::RankNotInitialized; 16];
        let mut i = 0;
        while i < all.len() {
            all[i] = if i < confirm.len() { confirm[i] } else { tenant[i - confirm.len()] };
            i += 1;
        }
        all
    };

    /// The tenant codes: a request refused for its tenant (docs/tenants.md).
    pub const TENANT: [ErrorCode; 8] = [
        ErrorCode::UnknownTenant,
        ErrorCode::TenantMismatch,
        ErrorCode::TenantQuota,
        ErrorCode::TenantReservations,
        ErrorCode::LayoutMismatch,
        ErrorCode::TenantBusy,
        ErrorCode::TenantRateLimited,
        ErrorCode::TenantsReloadFailed,
    ];

    /// The codes of a failed `confirm_write`, for metrics that export one
    /// series per code.
    pub const CONFIRM: [ErrorCode; 8] = [
        ErrorCode::RankNotInitialized,
        ErrorCode::PageOutOfRange,
        ErrorCode::ConfirmUnallocated,
        ErrorCode::DoubleConfirm,
        ErrorCode::ReleaseUnallocated,
        ErrorCode::DoubleRelease,
        ErrorCode::ConfirmAndRelease,
        ErrorCode::ReservedForOtherKey,
    ];

    /// The code as it appears on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::RankNotInitialized => "rank_not_initialized",
            ErrorCode::PageOutOfRange => "page_out_of_range",
            ErrorCode::ConfirmUnallocated => "confirm_unallocated",
            ErrorCode::DoubleConfirm => "double_confirm",
            ErrorCode::ReleaseUnallocated => "release_unallocated",
            ErrorCode::DoubleRelease => "double_release",
            ErrorCode::ConfirmAndRelease => "confirm_and_release",
            ErrorCode::ReservedForOtherKey => "reserved_for_other_key",
            ErrorCode::UnknownTenant => "unknown_tenant",
            ErrorCode::TenantMismatch => "tenant_mismatch",
            ErrorCode::TenantQuota => "tenant_quota",
            ErrorCode::TenantReservations => "tenant_reservations",
            ErrorCode::LayoutMismatch => "layout_mismatch",
            ErrorCode::TenantBusy => "tenant_busy",
            ErrorCode::TenantRateLimited => "tenant_rate_limited",
            ErrorCode::TenantsReloadFailed => "tenants_reload_failed",
        }
    }
}

/// A rejected `confirm_write`. The request changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmError {
    /// What went wrong.
    pub code: ErrorCode,
    /// The rank of the request.
    pub rank: i64,
    /// The page at fault, when one is.
    pub page: Option<i64>,
    /// The key at fault, when one applies.
    pub key: Option<String>,
    /// For `double_confirm` of a page already bound: true; for one page given
    /// two keys in the same request: false. Only changes the message.
    pub already_bound: bool,
}

impl ConfirmError {
    pub(crate) fn new(code: ErrorCode, rank: i64, page: Option<i64>, key: Option<&str>) -> Self {
        Self { code, rank, page, key: key.map(str::to_owned), already_bound: false }
    }

    /// [`ConfirmError::new`] naming a parsed key, by its text (a key
    /// round-trips to the string the client sent).
    pub(crate) fn keyed(code: ErrorCode, rank: i64, page: Option<i64>, key: Option<KeyRef<'_>>) -> Self {
        Self { code, rank, page, key: key.map(|k| k.to_string()), already_bound: false }
    }
}

impl fmt::Display for ConfirmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (r, p) = (self.rank, self.page.unwrap_or(-1));
        let k = self.key.as_deref().unwrap_or("");
        match self.code {
            ErrorCode::RankNotInitialized => write!(f, "Rank {r} not initialized"),
            ErrorCode::PageOutOfRange => write!(f, "page {p} is out of range for rank {r}"),
            ErrorCode::ConfirmUnallocated => {
                write!(f, "cannot confirm key {k} on page {p} of rank {r}: the page is not allocated")
            }
            ErrorCode::DoubleConfirm if self.already_bound => {
                write!(f, "cannot confirm key {k} on page {p} of rank {r}: the page is bound to another key")
            }
            ErrorCode::DoubleConfirm => {
                write!(f, "cannot confirm key {k} on page {p} of rank {r}: the request binds the page to two keys")
            }
            ErrorCode::ReleaseUnallocated => {
                write!(f, "cannot release page {p} of rank {r}: the page is not allocated")
            }
            ErrorCode::DoubleRelease => {
                write!(f, "cannot release page {p} of rank {r}: the request releases it twice")
            }
            ErrorCode::ConfirmAndRelease => {
                write!(f, "page {p} of rank {r} is both confirmed (key {k}) and released in one request")
            }
            ErrorCode::ReservedForOtherKey => {
                write!(f, "cannot confirm key {k} on page {p} of rank {r}: the page is reserved for another key")
            }
            code => write!(f, "{} on rank {r}", code.as_str()),
        }
    }
}

impl std::error::Error for ConfirmError {}

/// An operation named a rank that is not initialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Rank {0} not initialized")]
pub struct RankNotInitialized(pub i64);

/// A rejected `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitError {
    /// `num_pages` not positive (the contract's catch-all 400).
    #[error("Invalid initialization parameters")]
    InvalidParameters,
    /// The rank is beyond `--max-ranks`.
    #[error("Invalid initialization parameters: rank {rank} is beyond the limit of {max} ranks (--max-ranks)")]
    TooManyRanks {
        /// The rank asked for.
        rank: i64,
        /// The configured limit.
        max: u32,
    },
    /// `num_pages` is beyond `--max-pages-per-rank`.
    #[error("Invalid initialization parameters: num_pages {requested} is beyond the limit of {max} pages per rank (--max-pages-per-rank)")]
    TooManyPages {
        /// The size asked for.
        requested: i64,
        /// The configured limit.
        max: u32,
    },
    /// The system refused the memory for the page table.
    #[error("Cannot create rank {rank} with {pages} pages: the system refused {bytes} bytes of memory")]
    OutOfMemory {
        /// The rank.
        rank: i64,
        /// Its size in pages.
        pages: u32,
        /// The allocation refused.
        bytes: usize,
    },
}
