//! SGLang HiCache's dialect (docs/api.md, "Dialect 2"): every route is
//! `POST /{rank}/{op}`; the request bodies as SGLang's client writes them
//! (in the default namespace), and readers of the answers the tools use.

use std::fmt::Display;

use crate::json::{push_key_pairs, push_keys, push_pairs_and_releases};

pub use crate::json::{exists, page_indices, reserved_indices};

/// `/{rank}/initialize`: body [`initialize_body`], answer 204.
pub const INITIALIZE: &str = "initialize";
/// `/{rank}/reserve_and_allocate_page_indices`: body [`reserve_body`],
/// answer read by [`reserved_indices`].
pub const RESERVE: &str = "reserve_and_allocate_page_indices";
/// `/{rank}/confirm_write`: body [`confirm_body`], answer 204.
pub const CONFIRM_WRITE: &str = "confirm_write";
/// `/{rank}/exists`: body [`keys_body`], answer read by [`exists`].
pub const EXISTS: &str = "exists";
/// `/{rank}/get_page_indices`: body [`keys_body`], answer read by [`page_indices`].
pub const GET_PAGE_INDICES: &str = "get_page_indices";
/// `/{rank}/delete_keys`: body [`keys_body`], answer 204.
pub const DELETE_KEYS: &str = "delete_keys";
/// `/{rank}/clear`: body [`CLEAR_BODY`], answer 204.
pub const CLEAR: &str = "clear";

/// The path of route `op` (one of the constants above) on `rank`.
pub fn path(rank: impl Display, op: &str) -> String {
    format!("/{rank}/{op}")
}

/// `{"num_pages":N}`.
pub fn initialize_body(num_pages: impl Display) -> Vec<u8> {
    format!("{{\"num_pages\":{num_pages}}}").into_bytes()
}

/// The clear body: the default namespace.
pub const CLEAR_BODY: &[u8] = b"{}";

/// `{"keys":["k",...]}`: exists, get_page_indices, delete_keys.
pub fn keys_body<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + 67 * 128);
    b.extend_from_slice(b"{\"keys\":");
    push_keys(&mut b, keys);
    b.push(b'}');
    b
}

/// `{"keys":[["k",""],...]}`: reserve_and_allocate_page_indices.
pub fn reserve_body<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + 72 * 128);
    b.extend_from_slice(b"{\"keys\":");
    push_key_pairs(&mut b, keys);
    b.push(b'}');
    b
}

/// `{"written_keys_to_confirm":[["k",p],...],"pages_to_release":[p,...]}`.
pub fn confirm_body<K: AsRef<[u8]>, P: Display, Q: Display>(
    written: impl IntoIterator<Item = (K, P)>,
    release: impl IntoIterator<Item = Q>,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + 80 * 128);
    b.extend_from_slice(b"{\"written_keys_to_confirm\":");
    push_pairs_and_releases(&mut b, written, release);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_byte_exact() {
        let k = [b'a'; 64];
        let ks = format!("\"{}\"", "a".repeat(64));
        assert_eq!(keys_body([&k]), format!("{{\"keys\":[{ks}]}}").as_bytes());
        assert_eq!(reserve_body([&k, &k]), format!("{{\"keys\":[[{ks},\"\"],[{ks},\"\"]]}}").as_bytes());
        assert_eq!(
            confirm_body([(&k, 3)], [4, 5]),
            format!("{{\"written_keys_to_confirm\":[[{ks},3]],\"pages_to_release\":[4,5]}}").as_bytes()
        );
        assert_eq!(path(0, EXISTS), "/0/exists");
        assert_eq!(initialize_body(9), b"{\"num_pages\":9}");
    }

    #[test]
    fn answers_are_read() {
        let mut l = Vec::new();
        page_indices(br#"{"indices":[null,4]}"#, &mut l).unwrap();
        assert_eq!(l, vec![None, Some(4)]);
        let mut ri = Vec::new();
        reserved_indices(br#"{"indices": [[true, 3], [false,-1]]}"#, &mut ri).unwrap();
        assert_eq!(ri, vec![(true, 3), (false, -1)]);
        assert!(reserved_indices(br#"{"indices":[[1,3]]}"#, &mut ri).is_none());
    }
}
