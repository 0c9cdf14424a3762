//! The table of routes: every route's method, path, dialect, handler,
//! metric label and what the pipeline does around its handler, declared
//! once in [`ROUTES`].
//!
//! The router ([`find`]), the pipeline ([`crate::request`]: gate, body,
//! authorization, admission, the handler the row names, durability) and the
//! metrics (one series per row, labelled from the row) all read this table:
//! a route found is a row, and the row says everything, its handler
//! included. Adding a route is adding a row and its handler function, and
//! documenting it in `docs/api.md` and `docs/openapi.json` (a test in
//! `tests/http/ops.rs` fails while the table and the document disagree).
//!
//! Architecture invariant: this file is data and a matcher; it knows nothing
//! of hyper or JSON, of the core only its [`Dialect`] names, and of the
//! handlers only their names.

use crate::call::{Handler, RankParam};
use crate::core::Dialect;
use crate::{admin, ops, prefix, sglang, vllm};

/// The HTTP methods the server routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// POST
    Post,
}

impl Method {
    /// The method's name, as in an `Allow` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
        }
    }
}

/// What kind of operation a route is (its handler is [`Spec::handler`]):
/// what the admission stage and the tests ask of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Create a rank.
    Initialize,
    /// Reserve pages for keys.
    Allocate,
    /// Confirm written pages, release failed ones.
    Confirm,
    /// Which keys are complete.
    Exists,
    /// The pages of keys on a rank.
    Locations,
    /// How long a chain of keys a load would find (both dialects).
    Prefix,
    /// Forget everything (vLLM), or reset one space (SGLang).
    Clear,
    /// Forget some keys (SGLang).
    Delete,
    /// Prometheus text.
    Metrics,
    /// Liveness (and the node's state).
    Health,
    /// Readiness: whether this node should receive traffic, or may be
    /// taken down without losing the only caught-up copy.
    Ready,
    /// The statistics document.
    Stats,
    /// The OpenAPI document (`docs/openapi.json`).
    OpenApi,
    /// Which tenant the server sees for this request, and how.
    Tenant,
    /// Read the tenants file again (an admin route).
    TenantsReload,
}

/// One row of the table.
#[derive(Debug)]
pub struct Spec {
    /// The method the route answers; any other gets a 405.
    pub method: Method,
    /// The path; a `{rank}` segment matches one segment other than the
    /// dialect prefixes `keys` and `rank`, and is handed to the handler.
    pub path: &'static str,
    /// The client family whose page spaces the route serves; `None` for the
    /// server's own operational routes (`/health`, `/metrics`, …).
    pub dialect: Option<Dialect>,
    /// The kind of operation.
    pub op: Op,
    /// The function that answers it.
    pub handler: Handler,
    /// The `endpoint` label of its metric series.
    pub label: &'static str,
    /// Whether the handler reads a request body.
    pub reads_body: bool,
    /// Whether a successful answer waits until everything journaled so far
    /// is durable (with `--data-dir`): its own changes, and, for an
    /// allocate, the releases and evictions that freed the pages it hands
    /// out. A page must not reach a new writer before its unbinding is on
    /// disk, or a crash in between would bind the old key to the new
    /// writer's bytes.
    pub durable: bool,
    /// Whether the admin token guards it even without `--auth-all`.
    pub admin: bool,
    /// Whether its keys-per-request histogram is recorded.
    pub keyed: bool,
    /// Whether `--auth-all` leaves it open (probes must reach it).
    pub open: bool,
}

impl Spec {
    /// The value of its metric series' `dialect` label: the dialect's, or
    /// `ops` for an operational route.
    pub fn dialect_label(&self) -> &'static str {
        self.dialect.map_or("ops", Dialect::label)
    }
}

/// A row with every flag off, to spread from.
const BASE: Spec = Spec {
    method: Method::Post,
    path: "",
    dialect: Some(Dialect::Vllm),
    op: Op::Health,
    handler: ops::unrouted,
    label: "",
    reads_body: false,
    durable: false,
    admin: false,
    keyed: false,
    open: false,
};

/// An SGLang row: `POST /{rank}/{op}` with a JSON body.
const SGLANG: Spec = Spec { dialect: Some(Dialect::Sglang), reads_body: true, ..BASE };

/// Every route. Literal paths come before patterns that could match them.
pub static ROUTES: [Spec; 21] = TABLE;

/// [`ROUTES`], as a constant that [`RANK_AT`] is computed from.
const TABLE: [Spec; 21] = [
    Spec {
        path: "/keys/batch_allocate",
        op: Op::Allocate,
        handler: vllm::allocate,
        label: "batch_allocate",
        reads_body: true,
        keyed: true,
        durable: true,
        ..BASE
    },
    Spec {
        path: "/keys/confirm_write",
        op: Op::Confirm,
        handler: vllm::confirm,
        label: "confirm_write",
        reads_body: true,
        keyed: true,
        durable: true,
        ..BASE
    },
    Spec {
        path: "/keys/batch_exists",
        op: Op::Exists,
        handler: vllm::exists,
        label: "batch_exists",
        reads_body: true,
        keyed: true,
        ..BASE
    },
    Spec {
        path: "/keys/get_locations",
        op: Op::Locations,
        handler: vllm::locations,
        label: "get_locations",
        reads_body: true,
        keyed: true,
        ..BASE
    },
    // Both dialects' query (the body's `dialect`), under vLLM's `/keys/`
    // prefix, which no SGLang `{rank}` matches; gated as a data route.
    Spec {
        path: "/keys/longest_prefix",
        op: Op::Prefix,
        handler: prefix::longest_prefix,
        label: "longest_prefix",
        reads_body: true,
        keyed: true,
        ..BASE
    },
    Spec { path: "/clear", op: Op::Clear, handler: vllm::clear, label: "clear", durable: true, admin: true, ..BASE },
    Spec {
        path: "/rank/{rank}/initialize",
        op: Op::Initialize,
        handler: vllm::initialize,
        label: "initialize",
        reads_body: true,
        durable: true,
        ..BASE
    },
    // SGLang HiCache: `{rank}` never matches `keys` or `rank`, so these
    // never take a vLLM path (`/keys/confirm_write` is vLLM's).
    Spec {
        path: "/{rank}/initialize",
        op: Op::Initialize,
        handler: sglang::initialize,
        label: "initialize",
        durable: true,
        ..SGLANG
    },
    Spec { path: "/{rank}/exists", op: Op::Exists, handler: sglang::exists, label: "exists", keyed: true, ..SGLANG },
    Spec {
        path: "/{rank}/reserve_and_allocate_page_indices",
        op: Op::Allocate,
        handler: sglang::reserve,
        label: "reserve_and_allocate_page_indices",
        keyed: true,
        durable: true,
        ..SGLANG
    },
    Spec {
        path: "/{rank}/confirm_write",
        op: Op::Confirm,
        handler: sglang::confirm,
        label: "confirm_write",
        keyed: true,
        durable: true,
        ..SGLANG
    },
    Spec {
        path: "/{rank}/delete_keys",
        op: Op::Delete,
        handler: sglang::delete,
        label: "delete_keys",
        keyed: true,
        durable: true,
        ..SGLANG
    },
    Spec { path: "/{rank}/clear", op: Op::Clear, handler: sglang::clear, label: "clear", durable: true, ..SGLANG },
    Spec {
        path: "/{rank}/get_page_indices",
        op: Op::Locations,
        handler: sglang::page_indices,
        label: "get_page_indices",
        keyed: true,
        ..SGLANG
    },
    Spec {
        method: Method::Get,
        path: "/metrics",
        dialect: None,
        op: Op::Metrics,
        handler: ops::metrics,
        label: "metrics",
        ..BASE
    },
    Spec {
        method: Method::Get,
        path: "/health",
        dialect: None,
        op: Op::Health,
        handler: ops::health,
        label: "health",
        open: true,
        ..BASE
    },
    Spec {
        method: Method::Get,
        path: "/ready",
        dialect: None,
        op: Op::Ready,
        handler: ops::ready,
        label: "ready",
        open: true,
        ..BASE
    },
    Spec {
        method: Method::Get,
        path: "/stats",
        dialect: None,
        op: Op::Stats,
        handler: ops::stats,
        label: "stats",
        ..BASE
    },
    Spec {
        method: Method::Get,
        path: "/openapi.json",
        dialect: None,
        op: Op::OpenApi,
        handler: ops::openapi,
        label: "openapi",
        ..BASE
    },
    Spec {
        method: Method::Get,
        path: "/tenant",
        dialect: None,
        op: Op::Tenant,
        handler: admin::tenant,
        label: "tenant",
        open: true,
        ..BASE
    },
    Spec {
        path: "/tenants/reload",
        dialect: None,
        op: Op::TenantsReload,
        handler: admin::reload,
        label: "tenants_reload",
        admin: true,
        ..BASE
    },
];

/// Segments a `{rank}` never matches: they name the vLLM dialect.
const RESERVED: [&str; 2] = ["keys", "rank"];

/// A row of [`ROUTES`], by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteId(u8);

const _: () = assert!(ROUTES.len() < u8::MAX as usize);

impl RouteId {
    /// The row.
    #[inline]
    pub fn spec(self) -> &'static Spec {
        &ROUTES[self.0 as usize]
    }

    /// The row's position in [`ROUTES`].
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// Every route, in table order.
    pub fn all() -> impl Iterator<Item = RouteId> {
        (0..ROUTES.len() as u8).map(RouteId)
    }

    /// The route of `op` in `dialect` (for benches and tests).
    pub fn of(dialect: Dialect, op: Op) -> Option<RouteId> {
        RouteId::all().find(|r| r.spec().dialect == Some(dialect) && r.spec().op == op)
    }
}

/// The outcome of routing a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A route, with its `{rank}`.
    Route(RouteId, RankParam),
    /// A known path with another method; carries the one it takes.
    MethodNotAllowed(Method),
    /// Nothing here.
    NotFound,
}

/// The `{rank}` placeholder of a pattern.
const RANK: &str = "{rank}";

/// Where each row's `{rank}` starts in its path, if it has one: found at
/// compile time, so that routing searches no pattern (a search per row per
/// request cost a few hundred instructions, and more or fewer with where
/// the linker put the patterns).
static RANK_AT: [Option<usize>; TABLE.len()] = {
    let mut at = [None; TABLE.len()];
    let mut row = 0;
    while row < TABLE.len() {
        let p = TABLE[row].path.as_bytes();
        let mut i = 0;
        while i + RANK.len() <= p.len() {
            let mut j = 0;
            while j < RANK.len() && p[i + j] == RANK.as_bytes()[j] {
                j += 1;
            }
            if j == RANK.len() {
                at[row] = Some(i);
                break;
            }
            i += 1;
        }
        row += 1;
    }
    at
};

/// Whether `path` matches the pattern of row `row`; the `{rank}` segment
/// when it has one.
#[inline]
fn matches(row: usize, path: &str) -> Option<Option<&str>> {
    let pattern = ROUTES[row].path;
    let Some(i) = RANK_AT[row] else {
        return (pattern == path).then_some(None);
    };
    let (head, tail) = (&pattern[..i], &pattern[i + RANK.len()..]);
    let seg = path.strip_prefix(head)?.strip_suffix(tail)?;
    (!seg.is_empty() && !seg.contains('/') && !RESERVED.contains(&seg)).then_some(Some(seg))
}

/// Routes a request by its method and path.
pub fn find(method: Method, path: &str) -> Found {
    let mut other_method = None;
    for (i, spec) in ROUTES.iter().enumerate() {
        let Some(rank) = matches(i, path) else { continue };
        if spec.method != method {
            other_method.get_or_insert(spec.method);
            continue;
        }
        let rank = rank.map_or(RankParam::None, RankParam::parse);
        return Found::Route(RouteId(i as u8), rank);
    }
    other_method.map_or(Found::NotFound, Found::MethodNotAllowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(f: Found) -> Option<(Op, RankParam)> {
        match f {
            Found::Route(id, rank) => Some((id.spec().op, rank)),
            _ => None,
        }
    }

    #[test]
    fn routes() {
        use Method::*;
        assert_eq!(op(find(Post, "/keys/batch_exists")), Some((Op::Exists, RankParam::None)));
        assert_eq!(op(find(Post, "/rank/3/initialize")), Some((Op::Initialize, RankParam::Int(3))));
        assert_eq!(op(find(Post, "/rank/abc/initialize")), Some((Op::Initialize, RankParam::Invalid("abc".into()))));
        assert_eq!(op(find(Post, "/rank/-1/initialize")), Some((Op::Initialize, RankParam::Invalid("-1".into()))));
        assert_eq!(op(find(Post, "/rank/+1/initialize")), Some((Op::Initialize, RankParam::Invalid("+1".into()))));
        assert_eq!(find(Post, "/rank//initialize"), Found::NotFound);
        assert_eq!(find(Post, "/rank/1/2/initialize"), Found::NotFound);
        assert_eq!(find(Post, "/rank/keys/initialize"), Found::NotFound);
        assert_eq!(find(Post, "/keys/batch_exists/"), Found::NotFound);
        assert_eq!(find(Get, "/keys/batch_exists"), Found::MethodNotAllowed(Post));
        assert_eq!(find(Post, "/metrics"), Found::MethodNotAllowed(Get));
        assert_eq!(op(find(Get, "/health")), Some((Op::Health, RankParam::None)));
        assert_eq!(find(Post, "/"), Found::NotFound);
        // SGLang's: an integer first, or FastAPI's 422 for anything else;
        // vLLM's prefixes are never ranks.
        assert_eq!(op(find(Post, "/3/exists")), Some((Op::Exists, RankParam::Int(3))));
        assert_eq!(op(find(Post, "/x/confirm_write")), Some((Op::Confirm, RankParam::Invalid("x".into()))));
        let dialect = |f: Found| match f {
            Found::Route(id, _) => id.spec().dialect,
            _ => None,
        };
        assert_eq!(dialect(find(Post, "/keys/confirm_write")), Some(Dialect::Vllm));
        assert_eq!(dialect(find(Post, "/0/confirm_write")), Some(Dialect::Sglang));
        assert_eq!(dialect(find(Post, "/clear")), Some(Dialect::Vllm));
        assert_eq!(dialect(find(Post, "/0/clear")), Some(Dialect::Sglang));
        assert_eq!(op(find(Post, "/keys/longest_prefix")), Some((Op::Prefix, RankParam::None)));
        assert_eq!(find(Get, "/keys/longest_prefix"), Found::MethodNotAllowed(Post));
        assert_eq!(find(Post, "/rank/exists"), Found::NotFound);
        assert_eq!(find(Post, "/keys/clear"), Found::NotFound);
        assert_eq!(find(Get, "/0/exists"), Found::MethodNotAllowed(Post));
        assert_eq!(find(Post, "/0/1/exists"), Found::NotFound);
    }

    #[test]
    fn the_rank_positions_are_the_patterns() {
        for (row, spec) in ROUTES.iter().enumerate() {
            assert_eq!(RANK_AT[row], spec.path.find(RANK), "{}", spec.path);
        }
    }

    #[test]
    fn every_row_is_reachable_and_labels_are_unique() {
        for id in RouteId::all() {
            let s = id.spec();
            let path = s.path.replace("{rank}", "7");
            assert_eq!(
                find(s.method, &path),
                Found::Route(id, if path == s.path { RankParam::None } else { RankParam::Int(7) })
            );
            let twins = RouteId::all().filter(|o| o.spec().label == s.label && o.spec().dialect == s.dialect).count();
            assert_eq!(twins, 1, "label {} of {:?} is used twice", s.label, s.dialect);
        }
    }

    #[test]
    fn every_route_that_changes_or_hands_out_pages_waits_for_the_disk() {
        for id in RouteId::all() {
            let s = id.spec();
            let changes = matches!(s.op, Op::Initialize | Op::Allocate | Op::Confirm | Op::Delete | Op::Clear);
            assert_eq!(s.durable, changes, "{:?} {}: durable must be {changes}", s.dialect, s.path);
        }
    }
}
