//! The table of routes: every route's method, path, dialect, metric label
//! and what the server does around its handler, declared once in [`ROUTES`].
//!
//! The router ([`find`]), the metrics (one series per row, labelled from the
//! row) and the server (body, authorization, durability) all read this table;
//! adding a route is adding a row and, for a new [`Op`], its handler, and
//! documenting it in `docs/api.md` and `docs/openapi.json` (a test in
//! `tests/http/ops.rs` fails while the table and the document disagree).
//!
//! Architecture invariant: this file is data and a matcher; it knows nothing
//! of hyper or JSON, and of the core only its [`Dialect`] names.

use crate::core::Dialect;

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

/// What a route does: the handler it runs.
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
    /// The handler.
    pub op: Op,
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
pub static ROUTES: [Spec; 18] = [
    Spec {
        path: "/keys/batch_allocate",
        op: Op::Allocate,
        label: "batch_allocate",
        reads_body: true,
        keyed: true,
        durable: true,
        ..BASE
    },
    Spec {
        path: "/keys/confirm_write",
        op: Op::Confirm,
        label: "confirm_write",
        reads_body: true,
        keyed: true,
        durable: true,
        ..BASE
    },
    Spec { path: "/keys/batch_exists", op: Op::Exists, label: "batch_exists", reads_body: true, keyed: true, ..BASE },
    Spec {
        path: "/keys/get_locations",
        op: Op::Locations,
        label: "get_locations",
        reads_body: true,
        keyed: true,
        ..BASE
    },
    Spec { path: "/clear", op: Op::Clear, label: "clear", durable: true, admin: true, ..BASE },
    Spec {
        path: "/rank/{rank}/initialize",
        op: Op::Initialize,
        label: "initialize",
        reads_body: true,
        durable: true,
        ..BASE
    },
    // SGLang HiCache: `{rank}` never matches `keys` or `rank`, so these
    // never take a vLLM path (`/keys/confirm_write` is vLLM's).
    Spec { path: "/{rank}/initialize", op: Op::Initialize, label: "initialize", durable: true, ..SGLANG },
    Spec { path: "/{rank}/exists", op: Op::Exists, label: "exists", keyed: true, ..SGLANG },
    Spec {
        path: "/{rank}/reserve_and_allocate_page_indices",
        op: Op::Allocate,
        label: "reserve_and_allocate_page_indices",
        keyed: true,
        durable: true,
        ..SGLANG
    },
    Spec {
        path: "/{rank}/confirm_write",
        op: Op::Confirm,
        label: "confirm_write",
        keyed: true,
        durable: true,
        ..SGLANG
    },
    Spec { path: "/{rank}/delete_keys", op: Op::Delete, label: "delete_keys", keyed: true, durable: true, ..SGLANG },
    Spec { path: "/{rank}/clear", op: Op::Clear, label: "clear", durable: true, ..SGLANG },
    Spec { path: "/{rank}/get_page_indices", op: Op::Locations, label: "get_page_indices", keyed: true, ..SGLANG },
    Spec { method: Method::Get, path: "/metrics", dialect: None, op: Op::Metrics, label: "metrics", ..BASE },
    Spec { method: Method::Get, path: "/health", dialect: None, op: Op::Health, label: "health", open: true, ..BASE },
    Spec { method: Method::Get, path: "/ready", dialect: None, op: Op::Ready, label: "ready", open: true, ..BASE },
    Spec { method: Method::Get, path: "/stats", dialect: None, op: Op::Stats, label: "stats", ..BASE },
    Spec { method: Method::Get, path: "/openapi.json", dialect: None, op: Op::OpenApi, label: "openapi", ..BASE },
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

/// The `{rank}` segment of a matched path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankParam {
    /// The route has no `{rank}`.
    None,
    /// Decimal digits that fit an `i64`.
    Int(i64),
    /// Anything else, verbatim, for the 422 that names it.
    Invalid(Box<str>),
}

impl RankParam {
    fn parse(s: &str) -> RankParam {
        match s.parse::<i64>() {
            Ok(r) if s.bytes().all(|b| b.is_ascii_digit()) => RankParam::Int(r),
            _ => RankParam::Invalid(s.into()),
        }
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

/// Whether `path` matches `pattern`; the `{rank}` segment when it has one.
fn matches<'p>(pattern: &str, path: &'p str) -> Option<Option<&'p str>> {
    // A `char` search (memchr), not `find("{rank}")`: a string pattern
    // builds a two-way searcher per route per request, 1-3% of a 128-key
    // lookup's instructions (perf/RESULTS.md). `{` appears in patterns only there.
    let Some(i) = pattern.find('{').filter(|&i| pattern[i..].starts_with("{rank}")) else {
        return (pattern == path).then_some(None);
    };
    let (head, tail) = (&pattern[..i], &pattern[i + "{rank}".len()..]);
    let seg = path.strip_prefix(head)?.strip_suffix(tail)?;
    (!seg.is_empty() && !seg.contains('/') && !RESERVED.contains(&seg)).then_some(Some(seg))
}

/// Routes a request by its method and path.
pub fn find(method: Method, path: &str) -> Found {
    let mut other_method = None;
    for (i, spec) in ROUTES.iter().enumerate() {
        let Some(rank) = matches(spec.path, path) else { continue };
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
        assert_eq!(find(Post, "/rank/exists"), Found::NotFound);
        assert_eq!(find(Post, "/keys/clear"), Found::NotFound);
        assert_eq!(find(Get, "/0/exists"), Found::MethodNotAllowed(Post));
        assert_eq!(find(Post, "/0/1/exists"), Found::NotFound);
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
