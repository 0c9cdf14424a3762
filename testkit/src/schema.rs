//! Every answer of the HTTP tests, checked against `docs/openapi.json`.
//!
//! [`crate::Client::request`] calls [`assert_conforms`] on each response it
//! reads, so any test that talks to the server through it also checks the
//! published contract: the status must be documented for the route and
//! method, the content type must be the documented one, a JSON body must
//! validate against the documented schema (with the `jsonschema` crate,
//! draft 2020-12, which OpenAPI 3.1 schemas are), a documented "no content"
//! answer must have no body, and required headers (`Allow`,
//! `WWW-Authenticate`) must be present and valid.
//!
//! Paths that match no route of the document must answer the document's
//! `NotFound` response; a route asked with a method it does not have, its
//! `MethodNotAllowed` response.

use crate::Response;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The committed document, as the server serves it.
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// Answers validated so far by this test binary (every test adds to it).
pub static VALIDATED: AtomicUsize = AtomicUsize::new(0);

/// The parsed document and the validators compiled from it, one per schema
/// location, compiled on first use.
struct Contract {
    doc: Value,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

fn contract() -> &'static Contract {
    static C: OnceLock<Contract> = OnceLock::new();
    C.get_or_init(|| Contract {
        doc: serde_json::from_str(OPENAPI).expect("docs/openapi.json is not JSON"),
        validators: Mutex::new(HashMap::new()),
    })
}

/// Panics with the request and the answer unless the answer conforms.
pub fn assert_conforms(method: &str, target: &str, r: &Response) {
    if let Err(e) = check(method, target, r) {
        panic!("answer not described by docs/openapi.json: {e}\nrequest: {method} {target}\nanswer: {r:?}");
    }
}

/// Checks an answer to `method target` against the document.
pub fn check(method: &str, target: &str, r: &Response) -> Result<(), String> {
    let c = contract();
    let path = path_of(target);
    let (pointer, response) = expected_response(&c.doc, method, &path, r.status)?;
    let response = resolve(&c.doc, response)?;
    check_headers(c, &pointer, response, r)?;
    match response.get("content").and_then(Value::as_object) {
        None => {
            if !r.body.is_empty() {
                return Err(format!("{pointer} documents no body, got {} bytes", r.body.len()));
            }
        }
        Some(content) => {
            let got = r.header("content-type").ok_or_else(|| format!("{pointer}: no Content-Type"))?;
            let media = got.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            let Some(entry) = content.get(&media) else {
                let want: Vec<&String> = content.keys().collect();
                return Err(format!("{pointer}: Content-Type {got:?}, documented {want:?}"));
            };
            let schema_ptr = format!("{pointer}/content/{}/schema", escape(&media));
            let schema = entry.get("schema").ok_or_else(|| format!("{schema_ptr} missing"))?;
            let instance = if media == "application/json" {
                serde_json::from_slice(&r.body).map_err(|e| format!("{pointer}: body is not JSON: {e}"))?
            } else {
                Value::String(String::from_utf8(r.body.clone()).map_err(|_| format!("{pointer}: body not UTF-8"))?)
            };
            validate(c, &schema_ptr, schema, &instance)?;
        }
    }
    VALIDATED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The path of a request target: origin-form as is, absolute-form without
/// its scheme and authority, and without the query either way; a tenant's
/// `/t/<tenant>` prefix (the document's second server) taken off.
fn path_of(target: &str) -> String {
    let rest = target.strip_prefix("http://").or_else(|| target.strip_prefix("https://"));
    let path = match rest {
        Some(r) => r.find('/').map_or("/", |i| &r[i..]),
        None => target,
    };
    let path = path.split('?').next().unwrap_or("");
    match path.strip_prefix("/t/") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]).to_string(),
        None => path.to_string(),
    }
}

/// The document's response for `status` to `method path`, with its JSON
/// pointer (for messages and the validator cache).
fn expected_response<'d>(doc: &'d Value, method: &str, path: &str, status: u16) -> Result<(String, &'d Value), String> {
    let paths = doc["paths"].as_object().ok_or("no paths")?;
    // The most specific template wins: `/keys/confirm_write` over a
    // `/{rank}/confirm_write`, as in the server's route table.
    let params = |t: &str| t.matches('{').count();
    let Some((template, item)) = paths.iter().filter(|(t, _)| matches(t, path)).min_by_key(|(t, _)| params(t)) else {
        return shared(doc, "NotFound", 404, status, &format!("{path} matches no route"));
    };
    let Some(op) = item.get(method.to_ascii_lowercase()) else {
        return shared(doc, "MethodNotAllowed", 405, status, &format!("{template} has no {method}"));
    };
    let code = status.to_string();
    let response = op["responses"]
        .get(&code)
        .or_else(|| op["responses"].get("default"))
        .ok_or_else(|| format!("status {status} is not documented for {method} {template}"))?;
    Ok((format!("#/paths/{}/{}/responses/{code}", escape(template), method.to_ascii_lowercase()), response))
}

/// One of the responses every route shares (404, 405).
fn shared<'d>(doc: &'d Value, name: &str, want: u16, got: u16, why: &str) -> Result<(String, &'d Value), String> {
    if got != want {
        return Err(format!("{why}: expected {want}, got {got}"));
    }
    let pointer = format!("#/components/responses/{name}");
    let r = doc.pointer(&pointer[1..]).ok_or_else(|| format!("{pointer} missing"))?;
    Ok((pointer, r))
}

/// Whether a path template (`/rank/{rank}/initialize`) matches `path`; a
/// parameter stands for one non-empty segment.
fn matches(template: &str, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| if t.starts_with('{') { !p.is_empty() } else { t == p })
}

/// Follows a `$ref` to a shared response.
fn resolve<'d>(doc: &'d Value, v: &'d Value) -> Result<&'d Value, String> {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(r.trim_start_matches('#')).ok_or_else(|| format!("dangling {r}")),
        None => Ok(v),
    }
}

/// Checks the headers the document marks as required.
fn check_headers(c: &Contract, pointer: &str, response: &Value, r: &Response) -> Result<(), String> {
    let Some(headers) = response.get("headers").and_then(Value::as_object) else {
        return Ok(());
    };
    for (name, h) in headers {
        let required = h.get("required").and_then(Value::as_bool).unwrap_or(false);
        match r.header(name) {
            None if required => return Err(format!("{pointer}: required header {name} missing")),
            None => {}
            Some(v) => {
                let schema = h.get("schema").ok_or_else(|| format!("{pointer}: header {name} has no schema"))?;
                let ptr = format!("{pointer}/headers/{}/schema", escape(name));
                validate(c, &ptr, schema, &json!(v))?;
            }
        }
    }
    Ok(())
}

/// Validates `instance` against `schema`, whose `$ref`s point into the
/// document's components: the schema is wrapped in a root that carries them.
fn validate(c: &Contract, pointer: &str, schema: &Value, instance: &Value) -> Result<(), String> {
    let validator = {
        let mut cache = c.validators.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match cache.get(pointer) {
            Some(v) => v.clone(),
            None => {
                let root = json!({
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "allOf": [schema],
                    "components": c.doc["components"],
                });
                let v = Arc::new(
                    jsonschema::draft202012::new(&root).map_err(|e| format!("{pointer}: not a valid schema: {e}"))?,
                );
                cache.insert(pointer.to_string(), v.clone());
                v
            }
        }
    };
    let errors: Vec<String> =
        validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{pointer}: {}", errors.join("; ")))
    }
}

/// Escapes a JSON pointer token (`~` and `/`).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
