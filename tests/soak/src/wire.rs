//! What goes over the wire: the request bodies the soak writes (those of
//! [`hf3fs_meta_client::vllm`], typed for the model), and what it reads out of answers (through
//! serde_json: the soak checks that every answer is valid JSON, and reads
//! `/stats` and error bodies from it).

use bytes::Bytes;
use serde_json::Value;

use hf3fs_meta_client::vllm;
use hf3fs_perf::keys::HexKey;

/// `b` parsed as one JSON value (None: not valid JSON).
pub(crate) fn parse(b: &[u8]) -> Option<Value> {
    serde_json::from_slice(b).ok()
}

/// An integer field of a JSON object, when it fits an `i64`.
pub(crate) fn int(j: &Value, field: &str) -> Option<i64> {
    j.get(field).and_then(Value::as_i64)
}

/// At most 200 bytes of `b`, as text, for messages.
pub(crate) fn snippet(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}

/// A batch_allocate body of `keys` on `rank`.
pub(crate) fn alloc_body(rank: usize, keys: &[HexKey]) -> Bytes {
    Bytes::from(vllm::allocate_body(rank, keys))
}

/// A confirm_write body of `confirms` and `releases` on `rank`.
pub(crate) fn confirm_body(rank: usize, confirms: &[(HexKey, u32)], releases: &[u32]) -> Bytes {
    Bytes::from(vllm::confirm_body(rank, confirms.iter().map(|(k, p)| (k, p)), releases))
}

/// A batch_exists body (`rank` None) or a get_locations body.
pub(crate) fn keys_body(rank: Option<usize>, keys: &[HexKey]) -> Bytes {
    Bytes::from(match rank {
        None => vllm::exists_body(keys),
        Some(r) => vllm::locations_body(r, keys),
    })
}

/// The head of a POST of `content_length` bytes, for requests written by hand.
pub(crate) fn request_head(path: &str, content_length: usize) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\n\r\n"
    )
    .into_bytes()
}

/// The machine-readable part of a typed 500.
#[derive(Debug)]
pub(crate) struct TypedError {
    pub(crate) code: String,
    pub(crate) rank: Option<i64>,
    pub(crate) page: Option<i64>,
}

/// Reads a typed 500 of confirm_write: `{"detail":"Confirmation failed: ...","error":{"code":...}}`.
pub(crate) fn typed_error(body: &[u8]) -> Option<TypedError> {
    let j = parse(body)?;
    let detail = j.get("detail")?.as_str()?;
    if !detail.starts_with("Confirmation failed: ") {
        return None;
    }
    let e = j.get("error")?;
    Some(TypedError { code: e.get("code")?.as_str()?.to_string(), rank: int(e, "rank"), page: int(e, "page") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_are_read_from_the_body() {
        let e = typed_error(
            br#"{"detail":"Confirmation failed: page 7 is bound","error":{"code":"double_confirm","rank":3,"page":7,"key":"k"}}"#,
        )
        .unwrap();
        assert_eq!((e.code.as_str(), e.rank, e.page), ("double_confirm", Some(3), Some(7)));
        // A page beyond 64 bits is absent, not wrapped.
        let e = typed_error(br#"{"detail":"Confirmation failed: x","error":{"code":"c","page":18446744073709551616}}"#);
        assert_eq!(e.unwrap().page, None);
        assert!(typed_error(br#"{"detail":"Rank 1 not initialized"}"#).is_none());
        assert!(typed_error(b"{\"detail\":\"Confirmation failed: \"}x").is_none());
    }

    #[test]
    fn bodies_are_valid_json() {
        let k = hf3fs_perf::keys::stored_key(1);
        let c = parse(&confirm_body(2, &[(k, 5)], &[6, 7])).unwrap();
        assert_eq!(c["confirmations"][0][1], 5);
        assert_eq!(c["pages_to_release"][1], 7);
        let e = parse(&keys_body(Some(4), &[k, k])).unwrap();
        assert_eq!((e["rank"].as_i64(), e["keys"].as_array().map(Vec::len)), (Some(4), Some(2)));
        assert!(parse(&keys_body(None, &[])).is_some());
    }
}
