//! The tenants' own routes: `GET /tenant` (which tenant the server sees
//! for this connection and path, and how it chose it: what a relay started
//! with `--tenant` checks) and the admin route `POST /tenants/reload` (the
//! tenants file read again, as on SIGHUP). docs/tenants.md.

use crate::call::Call;
use crate::core::ErrorCode;
use crate::encode;
use crate::reply::Reply;
use crate::tenants::refusal;
use hyper::StatusCode;

/// `GET /tenant`: `{"tenant":<name>,"via":<how>}`, or nulls on a server
/// without `--tenants`.
pub(crate) fn tenant(c: Call<'_>) -> Result<Reply, Reply> {
    let mut body = b"{\"tenant\":".to_vec();
    match c.tenant {
        Some(t) => encode::json_str(&mut body, &t.name),
        None => body.extend_from_slice(b"null"),
    }
    body.extend_from_slice(b",\"via\":");
    match c.via {
        Some(v) => encode::json_str(&mut body, v.as_str()),
        None => body.extend_from_slice(b"null"),
    }
    body.push(b'}');
    Ok(Reply::json(StatusCode::OK, body, 0))
}

/// `POST /tenants/reload`: the tenants file read again and served, as on
/// SIGHUP; `{"tenants":[…]}` with the names served after it. Guarded by
/// the admin token (the pipeline's authorization stage); without
/// `--admin-token` a 403, without `--tenants` a 404, and a file that fails
/// a 422 `tenants_reload_failed` that changed nothing.
pub(crate) fn reload(c: Call<'_>) -> Result<Reply, Reply> {
    if c.app.cfg.admin_token.is_none() {
        return Err(Reply::detail(
            StatusCode::FORBIDDEN,
            "Forbidden: the tenants reload route needs a server started with --admin-token (or use SIGHUP)",
        ));
    }
    let Some(reloader) = c.app.tenants.as_ref().and_then(|t| t.reloader()) else {
        return Err(Reply::detail(StatusCode::NOT_FOUND, "Not Found: this server was started without --tenants"));
    };
    let reloaded = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        // Opening a new tenant's durable stores blocks: off the worker.
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(|| reloader.reload()),
        _ => reloader.reload(),
    };
    match reloaded {
        Ok(names) => {
            tracing::info!(tenants = ?names, "tenants file reloaded (admin route)");
            let mut body = b"{\"tenants\":[".to_vec();
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                encode::json_str(&mut body, n);
            }
            body.extend_from_slice(b"]}");
            Ok(Reply::json(StatusCode::OK, body, 0))
        }
        Err(e) => {
            tracing::error!("tenants file not reloaded (admin route), the running tenants are kept: {e}");
            let detail = format!("Tenants file not reloaded, the running tenants are kept: {e}");
            Err(refusal(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::TenantsReloadFailed, None, &detail))
        }
    }
}
