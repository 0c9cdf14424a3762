//! What a handler is handed: one [`Call`], and the [`Handler`] type every
//! row of the route table names ([`crate::routes::Spec::handler`]).
//!
//! A handler is a plain synchronous function of its call: the body is
//! already in memory and nothing awaits, so the scratch buffers are the
//! worker thread's (lent by the pipeline's handler stage,
//! [`crate::request`]) and no core call ever spans an `.await`. It answers
//! `Result<Reply, Reply>`: the error side is an answer too, so a failed step
//! is one `?`.

use crate::core::Registry;
use crate::decode::{Body, Limits};
use crate::reply::Reply;
use crate::scratch::Scratch;
use crate::tenants::{Tenant, Via};
use crate::Service;

/// A route's handler ([`crate::routes::Spec::handler`]).
pub type Handler = fn(Call<'_>) -> Result<Reply, Reply>;

/// One request as its handler sees it.
pub struct Call<'a> {
    /// The service: its settings, counters and hooks.
    pub app: &'a Service,
    /// The page spaces the request works on: the pipeline's
    /// [`Exchange::registry`](crate::request::Exchange::registry) (the
    /// service's own, or its tenant's). Handlers reach the state through
    /// this, never through `app`.
    pub registry: &'a Registry,
    /// Its tenant, with `--tenants`: its limits (`max_keys`,
    /// `strict_layout`).
    pub tenant: Option<&'a Tenant>,
    /// How its tenant was selected, with `--tenants` (`GET /tenant`).
    pub via: Option<Via>,
    /// The route's `{rank}` path segment.
    pub rank: &'a RankParam,
    /// This worker thread's reusable buffers (decoder, answer vectors).
    pub scratch: &'a mut Scratch,
    /// The request body, fully read (empty for a route without one).
    pub body: Body<'a>,
    /// The per-request bounds of `--max-keys-per-request` and `--max-key-len`.
    pub limits: Limits,
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
    /// The segment `s` as a rank.
    pub(crate) fn parse(s: &str) -> RankParam {
        match s.parse::<i64>() {
            Ok(r) if s.bytes().all(|b| b.is_ascii_digit()) => RankParam::Int(r),
            _ => RankParam::Invalid(s.into()),
        }
    }
}
