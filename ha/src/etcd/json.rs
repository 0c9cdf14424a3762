//! The JSON gateway's codec: base64 keys and values, 64-bit integers as
//! strings, fields equal to their default left out; etcd's error objects.

use super::model::{Compare, Error, Kv, TxnOp};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

/// etcd's error object as an [`Error::Refused`].
pub(super) fn refusal(status: u16, v: &Value) -> Error {
    let message = v["message"].as_str().or(v["error"].as_str()).map_or_else(|| v.to_string(), str::to_string);
    Error::Refused { status, code: int(&v["code"]), message }
}

/// A 64-bit integer field: a string, a number, or absent (0).
pub(super) fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

pub(super) fn bytes_field(v: &Value) -> Result<Vec<u8>, Error> {
    match v.as_str() {
        None => Ok(Vec::new()),
        Some(s) => B64.decode(s).map_err(|e| Error::Decode(format!("bad base64 from etcd: {e}"))),
    }
}

pub(super) fn kv(v: &Value) -> Result<Kv, Error> {
    Ok(Kv {
        key: bytes_field(&v["key"])?,
        value: bytes_field(&v["value"])?,
        create_revision: int(&v["create_revision"]),
        mod_revision: int(&v["mod_revision"]),
        lease: int(&v["lease"]),
    })
}

/// The `kvs` of a range answer.
pub(super) fn kvs(v: &Value) -> Result<Vec<Kv>, Error> {
    v["kvs"].as_array().map_or(&[][..], Vec::as_slice).iter().map(kv).collect()
}

pub(super) fn compare_json(c: &Compare) -> Value {
    match c {
        Compare::Created { key, revision } => json!({
            "target": "CREATE", "result": "EQUAL", "key": B64.encode(key), "createRevision": revision.to_string(),
        }),
        Compare::Value { key, value } => json!({
            "target": "VALUE", "result": "EQUAL", "key": B64.encode(key), "value": B64.encode(value),
        }),
    }
}

pub(super) fn op_json(op: &TxnOp) -> Value {
    match op {
        TxnOp::Put { key, value, lease } => {
            let mut put = json!({ "key": B64.encode(key), "value": B64.encode(value) });
            if let Some(l) = lease {
                put["lease"] = Value::String(l.to_string());
            }
            json!({ "requestPut": put })
        }
        TxnOp::Get(key) => json!({ "requestRange": { "key": B64.encode(key) } }),
        TxnOp::Delete(key) => json!({ "requestDeleteRange": { "key": B64.encode(key) } }),
    }
}

pub(super) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}
