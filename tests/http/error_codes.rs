//! The typed error codes of `confirm_write` in the documents that list them,
//! against their one source, the core's `ErrorCode::ALL` (the testkit's
//! [`ERROR_CODES`]): the OpenAPI document's enum, docs/api.md's table of
//! typed errors and the runbook's table of what to do about each. (The
//! metrics' series per code: `ops::metrics_parse_and_move_with_requests`;
//! `docs/error-codes.json`, which the Python suites read: the core's
//! `error_codes_on_the_wire_are_the_committed_list`.)

use serde_json::Value;
use std::collections::BTreeSet;
use testkit::{ERROR_CODES, TENANT_CODES};

/// A document of the repository.
fn doc(path: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `code`s named in the first column of the Markdown table whose header
/// line starts with `header`, in order.
fn first_column(text: &str, header: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table headed {header:?}");
    let mut out = Vec::new();
    for row in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cell = row.split('|').nth(1).unwrap_or_default();
        out.extend(cell.split('`').skip(1).step_by(2).map(str::to_string));
    }
    out
}

fn as_set<S: AsRef<str>>(v: &[S]) -> BTreeSet<String> {
    v.iter().map(|s| s.as_ref().to_string()).collect()
}

#[test]
fn the_openapi_document_enumerates_every_error_code_in_order() {
    let doc: Value = serde_json::from_str(testkit::schema::OPENAPI).expect("docs/openapi.json is JSON");
    let e = &doc["components"]["schemas"]["TypedConfirmError"]["properties"]["error"]["properties"]["code"]["enum"];
    let listed: Vec<&str> =
        e.as_array().expect("an enum of codes").iter().map(|c| c.as_str().expect("a code")).collect();
    assert_eq!(listed, *ERROR_CODES, "docs/openapi.json's TypedConfirmError codes vs ErrorCode::CONFIRM");
}

#[test]
fn the_openapi_document_enumerates_every_tenant_code_in_order() {
    let doc: Value = serde_json::from_str(testkit::schema::OPENAPI).expect("docs/openapi.json is JSON");
    let e = &doc["components"]["schemas"]["TenantErrorBody"]["properties"]["code"]["enum"];
    let listed: Vec<&str> =
        e.as_array().expect("an enum of codes").iter().map(|c| c.as_str().expect("a code")).collect();
    assert_eq!(listed, *TENANT_CODES, "docs/openapi.json's TenantErrorBody codes vs ErrorCode::TENANT");
}

#[test]
fn the_tenant_reference_describes_every_tenant_code_and_no_other() {
    let want = as_set(&*TENANT_CODES);
    let listed = first_column(&doc("docs/tenants.md"), "| `code` | Status |");
    assert_eq!(as_set(&listed), want, "docs/tenants.md's table of codes vs ErrorCode::TENANT");
}

#[test]
fn the_api_reference_and_the_runbook_describe_every_error_code_and_no_other() {
    let want = as_set(&*ERROR_CODES);
    let api = first_column(&doc("docs/api.md"), "| `code` | `<message>` |");
    assert_eq!(as_set(&api), want, "docs/api.md's table of typed errors vs ErrorCode::ALL");
    let runbook = first_column(&doc("docs/runbook.md"), "| Code (`error.code`) |");
    assert_eq!(as_set(&runbook), want, "docs/runbook.md's table of codes vs ErrorCode::ALL");
}
