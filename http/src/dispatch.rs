//! From a routed request to its handler: the method mapping, the 404 and
//! 405 answers, and the dialect's handler on a fully read body.
//!
//! Every handler is a plain synchronous function: the body is already in
//! memory and nothing awaits, so the scratch buffers live in a thread-local
//! and no core call ever spans an `.await`.

use super::decode::{Body, Limits};
use super::reply::Reply;
use super::scratch::Scratch;
use super::{ops, sglang, vllm};
use crate::core::Dialect;
use crate::metrics::Endpoint;
use crate::routes;
use crate::Service;
use hyper::{Method, StatusCode};
use std::cell::RefCell;

/// The outcome of routing a request (see [`crate::routes`]).
pub use crate::routes::Found as Route;

/// Routes a request by its method and path, from [`crate::routes::ROUTES`].
/// A method the table does not know is answered like a wrong one.
pub fn route(method: &Method, path: &str) -> Route {
    let m = if *method == Method::POST {
        routes::Method::Post
    } else if *method == Method::GET {
        routes::Method::Get
    } else {
        return match routes::find(routes::Method::Get, path) {
            Route::Route(id, _) => Route::MethodNotAllowed(id.spec().method),
            other => other,
        };
    };
    routes::find(m, path)
}

/// The metrics series of a routed request.
pub fn endpoint(route: &Route) -> Endpoint {
    match route {
        Route::Route(id, _) => Endpoint::route(*id),
        Route::MethodNotAllowed(_) | Route::NotFound => Endpoint::OTHER,
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs the handler of `route` on a fully read `body`.
pub fn handle(app: &Service, route: &Route, body: &mut [u8]) -> Reply {
    handle_body(app, route, &mut Body::Borrowed(body))
}

/// [`handle`] of a body as the server read it: the lookup routes decode
/// it where it lies, the others copy it when it is still hyper's.
pub fn handle_body(app: &Service, route: &Route, body: &mut Body<'_>) -> Reply {
    let (id, rank) = match route {
        Route::Route(id, rank) => (*id, rank),
        Route::MethodNotAllowed(allow) => {
            let allow = allow.as_str();
            return Reply { allow: Some(allow), ..Reply::detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed") };
        }
        Route::NotFound => return Reply::detail(StatusCode::NOT_FOUND, "Not Found"),
    };
    let spec = id.spec();
    let limits = Limits { max_keys: app.cfg.max_keys_per_request, max_key_len: app.cfg.max_key_len };
    SCRATCH.with(|s| {
        // A re-entrant borrow cannot happen (handlers never call handle), but
        // answer rather than panic if it ever did.
        let Ok(mut s) = s.try_borrow_mut() else {
            return Reply::internal("scratch busy");
        };
        let answer = match spec.dialect {
            Some(Dialect::Vllm) => vllm::handle(app, spec.op, rank, &mut s, body, limits),
            Some(Dialect::Sglang) => sglang::handle(app, spec.op, rank, &mut s, body, limits),
            None => ops::handle(app, spec.op),
        };
        answer.unwrap_or_else(|refused| refused)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_methods_map_onto_the_table() {
        assert!(matches!(route(&Method::POST, "/keys/batch_exists"), Route::Route(..)));
        assert_eq!(route(&Method::PUT, "/keys/batch_exists"), Route::MethodNotAllowed(routes::Method::Post));
        assert_eq!(route(&Method::HEAD, "/metrics"), Route::MethodNotAllowed(routes::Method::Get));
        assert_eq!(route(&Method::DELETE, "/nowhere"), Route::NotFound);
    }
}
