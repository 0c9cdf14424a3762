//! Arbitrary bytes into every `Decoder` method, with small and large limits,
//! on a fresh decoder and on one reused across inputs (as a connection's is).
//!
//! Oracles: no panic; a reused decoder answers exactly as a fresh one; every
//! success respects the limits it was decoded under (key count, key length,
//! no empty key); every error has a non-empty detail text.
//!
//! Shared by the fuzz target (`fuzz/fuzz_targets/decode.rs`, libFuzzer explores
//! from the seeds) and the seed replay in `tests/http/fuzz_corpus.rs` (every
//! file of `fuzz/corpus/decode/` and `fuzz/artifacts/decode/` through [`run`], on
//! every `cargo test`).

use hf3fs_meta::core::KeyRef;
use hf3fs_meta::http::decode::{Decoder, Limits};
use std::cell::RefCell;

const SMALL: Limits = Limits { max_keys: 4, max_key_len: 8 };
const LARGE: Limits = Limits { max_keys: 65_536, max_key_len: 1024 };

thread_local! {
    static REUSED: RefCell<Decoder> = RefCell::new(Decoder::default());
}

fn check_keys<S: AsRef<str>>(keys: &[S], limits: Limits) {
    assert!(keys.len() <= limits.max_keys, "{} keys > {}", keys.len(), limits.max_keys);
    for k in keys {
        let k = k.as_ref();
        assert!(!k.is_empty(), "an empty key was accepted");
        assert!(k.len() <= limits.max_key_len, "key of {} bytes > {}", k.len(), limits.max_key_len);
    }
}

fn detail<E: std::fmt::Display>(e: E) -> String {
    let s = e.to_string();
    assert!(!s.is_empty(), "empty error detail");
    s
}

/// Runs every method on its own copy of `data` (simd-json unescapes in place)
/// and renders each answer, so two decoders' answers can be compared.
fn run_all(d: &mut Decoder, data: &[u8], limits: Limits) -> [String; 5] {
    let init = match d.initialize(&mut data.to_vec()) {
        Ok(b) => format!("{b:?}"),
        Err(e) => detail(e),
    };
    let alloc = match d.allocate(&mut data.to_vec(), limits) {
        Ok(b) => {
            check_keys(&b.keys, limits);
            assert_eq!(b.parsed, b.keys.iter().map(|k| KeyRef::parse(k)).collect::<Vec<_>>(), "keys misclassified");
            format!("{b:?}")
        }
        Err(e) => detail(e),
    };
    let confirm = match d.confirm(&mut data.to_vec(), limits) {
        Ok(b) => {
            let keys: Vec<String> = b.confirmations.iter().map(|c| c.0.to_string()).collect();
            check_keys(&keys, Limits { max_keys: usize::MAX, ..limits });
            assert!(b.confirmations.len() + b.releases.len() <= limits.max_keys, "too many items accepted");
            format!("{b:?}")
        }
        Err(e) => detail(e),
    };
    let exists = match d.exists(&mut data.to_vec(), limits) {
        Ok(b) => {
            check_keys(&b.keys.iter().map(ToString::to_string).collect::<Vec<_>>(), limits);
            format!("{b:?}")
        }
        Err(e) => detail(e),
    };
    let locations = match d.locations(&mut data.to_vec(), limits) {
        Ok(b) => {
            check_keys(&b.keys.iter().map(ToString::to_string).collect::<Vec<_>>(), limits);
            format!("{b:?}")
        }
        Err(e) => detail(e),
    };
    [init, alloc, confirm, exists, locations]
}

/// One input through the oracles; panics when one fails.
pub fn run(data: &[u8]) {
    REUSED.with(|reused| {
        let mut reused = reused.borrow_mut();
        for limits in [SMALL, LARGE] {
            let fresh = run_all(&mut Decoder::default(), data, limits);
            let again = run_all(&mut reused, data, limits);
            assert_eq!(fresh, again, "a reused decoder answered differently from a fresh one");
        }
    });
}
