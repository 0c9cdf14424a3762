//! The decoder's fast path against simd-json's tape walk, the oracle: every
//! route that has a fast path decodes the input on a decoder with it (reused
//! across inputs, as a connection's is) and on one without it
//! (`Decoder::tape_only`), and the two answers must be identical: the same
//! typed arguments or the same 400 detail text.
//!
//! The input is read two ways: as raw bytes, and as a recipe for a body near
//! the shapes the fast path accepts (first byte odd), rendered by `Recipe`, so
//! that most inputs reach deep into the scanner instead of failing at `{`.
//!
//! Shared by the fuzz target (`fuzz/fuzz_targets/fast.rs`, libFuzzer explores
//! from the seeds) and the seed replay in `tests/http/fuzz_corpus.rs` (every
//! file of `fuzz/corpus/fast/` and `fuzz/artifacts/fast/` through [`run`], on
//! every `cargo test`).

use arbitrary::{Arbitrary, Unstructured};
use hf3fs_meta::http::decode::answers::ROUTES;
use hf3fs_meta::http::decode::{Decoder, Limits};
use std::cell::RefCell;

const SMALL: Limits = Limits { max_keys: 4, max_key_len: 40 };
const LARGE: Limits = Limits { max_keys: 65_536, max_key_len: 1024 };

thread_local! {
    static FAST: RefCell<Decoder> = RefCell::new(Decoder::default());
}

/// Every route with a fast path, its answer rendered as text (with its
/// keys' classes, where it classifies them).
fn answers(d: &mut Decoder, body: &[u8], l: Limits) -> [String; ROUTES.len()] {
    ROUTES.map(|(_, decode)| decode(d, &mut body.to_vec(), l))
}

fn check(body: &[u8]) {
    FAST.with(|fast| {
        let mut fast = fast.borrow_mut();
        for limits in [SMALL, LARGE] {
            let got = answers(&mut fast, body, limits);
            let want = answers(&mut Decoder::tape_only(), body, limits);
            assert_eq!(got, want, "fast path and tape walk differ on {:?}", String::from_utf8_lossy(body));
        }
    });
}

/// A token of JSON text, mostly ones the fast path accepts.
#[derive(Arbitrary, Debug)]
enum Piece {
    Name(u8),
    Key(u8, u128),
    Int(i64),
    Odd(u8),
    Raw(u8),
}

const NAMES: [&str; 7] =
    ["rank", "keys", "confirmations", "pages_to_release", "written_keys_to_confirm", "namespace", "x"];
const ODD: [&str; 16] = [
    "-0",
    "01",
    "1.5",
    "1e3",
    "null",
    "nul",
    "\"\"",
    "\"a\\\"\"",
    "\"\\u0041\"",
    "\"\u{e9}\"",
    "\x0c",
    "  ",
    "\n",
    "true",
    "99999999999999999999",
    "999999999999999999",
];

impl Piece {
    fn render(&self, out: &mut Vec<u8>) {
        match self {
            Piece::Name(i) => out.extend(format!("\"{}\"", NAMES[usize::from(*i) % NAMES.len()]).bytes()),
            Piece::Key(len, k) => {
                let hex = format!("{k:032x}{k:032x}");
                out.push(b'"');
                out.extend(hex.bytes().take(usize::from(*len) % 70));
                out.push(b'"');
            }
            Piece::Int(n) => out.extend(n.to_string().bytes()),
            Piece::Odd(i) => out.extend(ODD[usize::from(*i) % ODD.len()].bytes()),
            Piece::Raw(b) => out.push(*b),
        }
    }
}

/// A body as a sequence of structural characters and tokens.
#[derive(Arbitrary, Debug)]
struct Recipe(Vec<(u8, Piece)>);

impl Recipe {
    fn render(&self) -> Vec<u8> {
        const STRUCT: &[u8] = b"{}[],: ";
        let mut out = Vec::new();
        for (s, piece) in &self.0 {
            // Low bits: a structural character before the token, or none.
            if let Some(c) = STRUCT.get(usize::from(*s % 10)) {
                out.push(*c);
            }
            if s & 0x80 == 0 {
                piece.render(&mut out);
            }
        }
        out
    }
}

/// One input through the oracles; panics when one fails.
pub fn run(data: &[u8]) {
    check(data);
    if data.first().is_some_and(|b| b & 1 == 1) {
        if let Ok(recipe) = Recipe::arbitrary_take_rest(Unstructured::new(&data[1..])) {
            check(&recipe.render());
        }
    }
}
