//! Per-thread scratch reused across requests: the JSON decoder's buffers and
//! the core's output vectors, one set per worker thread
//! (the pipeline's handler stage, [`crate::request`], lends it to each
//! handler in its [`crate::call::Call`]).

use super::decode::Decoder;
use crate::core::{AllocSlot, KeyRef};

/// The buffers one handler call may use; each handler clears what it fills.
#[derive(Default)]
pub struct Scratch {
    /// The JSON decoder and its reusable tape.
    pub decoder: Decoder,
    /// vLLM's allocate answer: (key index, page).
    pub pages: Vec<(usize, i64)>,
    /// An exists answer.
    pub flags: Vec<bool>,
    /// A locations answer.
    pub locations: Vec<Option<u32>>,
    /// SGLang's reserve answer.
    pub slots: Vec<AllocSlot>,
    /// A longest-prefix query's key chain, computed from token ids.
    pub chain: Vec<KeyRef<'static>>,
    /// The bytes one block of that chain hashes.
    pub text: Vec<u8>,
}
