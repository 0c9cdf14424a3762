//! A response before it becomes an HTTP response, and the answers every
//! dialect shares: `{"detail": …}`, the 400 of a body that does not decode,
//! FastAPI's 422 for a bad `{rank}`, the typed 500 of a rejected confirm.
//!
//! Handlers return `Result<Reply, Reply>`: the error side is an answer too,
//! so a failed step is one `?` (a [`DecodeError`] converts by [`From`]).
//! Mapping core errors to statuses and bodies happens in the handlers and
//! here, nowhere else.

use super::decode::DecodeError;
use super::encode;
use crate::core::ConfirmError;
use hyper::StatusCode;

/// The JSON content type.
pub const JSON: &str = "application/json";

/// A response, before it becomes an HTTP response.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The body (empty for 204).
    pub body: Vec<u8>,
    /// The content type, when there is a body.
    pub content_type: &'static str,
    /// Keys (or items) the request carried, for metrics.
    pub keys: usize,
    /// Extra header: `Allow` for 405s.
    pub allow: Option<&'static str>,
    /// Close the connection after this answer (the request was cut short).
    pub close: bool,
    /// Extra header: `Retry-After` in seconds, when not 0 (the HA gate's
    /// 503 says 1: a failover takes a few seconds, and the clients,
    /// urllib3's Retry, honour it; a tenant's 429s say theirs).
    pub retry_after: u32,
}

impl Reply {
    /// A JSON `body` with `status`, for a request of `keys` keys.
    pub fn json(status: StatusCode, body: Vec<u8>, keys: usize) -> Reply {
        Reply { status, body, content_type: JSON, keys, allow: None, close: false, retry_after: 0 }
    }

    /// `{"detail": msg}` with `status`.
    pub fn detail(status: StatusCode, msg: &str) -> Reply {
        let mut body = Vec::with_capacity(msg.len() + 16);
        encode::detail(&mut body, msg);
        Reply::json(status, body, 0)
    }

    /// `{"message": msg}` with `status`.
    pub fn message(status: StatusCode, msg: &str) -> Reply {
        let mut body = Vec::with_capacity(msg.len() + 16);
        encode::message(&mut body, msg);
        Reply::json(status, body, 0)
    }

    /// 204, for a request of `keys` keys.
    pub fn no_content(keys: usize) -> Reply {
        Reply::json(StatusCode::NO_CONTENT, Vec::new(), keys)
    }

    /// The 500 of a route the table sends to a handler that has no such
    /// operation (a bug in the table, never a client's fault).
    pub fn internal(what: &str) -> Reply {
        Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &format!("internal error: {what}"))
    }

    /// The same answer, counted as a request of `keys` keys.
    pub fn keys(self, keys: usize) -> Reply {
        Reply { keys, ..self }
    }
}

/// A body that does not decode: 400 with the decoder's exact text.
impl From<DecodeError> for Reply {
    fn from(e: DecodeError) -> Reply {
        Reply::detail(StatusCode::BAD_REQUEST, &e.to_string())
    }
}

/// FastAPI's 422 for a path parameter that is not a non-negative integer.
pub fn rank_validation_error(raw: &str) -> Reply {
    let negative = raw.strip_prefix('-').is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    let (msg, typ) = if negative {
        ("Input should be greater than or equal to 0", "greater_than_equal")
    } else {
        ("Input should be a valid integer, unable to parse string as an integer", "int_parsing")
    };
    let mut body = Vec::new();
    encode::validation_error(&mut body, &["path", "rank"], msg, typ, raw);
    Reply::json(StatusCode::UNPROCESSABLE_ENTITY, body, 0)
}

/// The typed 500 of a rejected confirm, and its log line.
pub fn confirm_error(e: &ConfirmError) -> Reply {
    let msg = e.to_string();
    tracing::error!("Confirm write for keys failed: {msg}");
    let mut body = Vec::with_capacity(msg.len() + 128);
    encode::typed_error(
        &mut body,
        &format!("Confirmation failed: {msg}"),
        e.code.as_str(),
        e.rank,
        e.page,
        e.key.as_deref(),
    );
    Reply::json(StatusCode::INTERNAL_SERVER_ERROR, body, 0)
}
