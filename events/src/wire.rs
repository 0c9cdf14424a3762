//! The wire format: vLLM's `KVEventBatch` in msgpack, written field by
//! field (the layout is fixed; docs/kv-events.md has it byte by byte).
//!
//! A batch is always the 3-element array `[ts, [events…], data_parallel_rank]`
//! (`ts` a float64 of Unix seconds): vLLM's own encoder drops a null last
//! element, which Dynamo's decoder rejects, so the rank is always written.
//! An event is, in the `map` format (current vLLM and SGLang), a map whose
//! first key is `"type"` (the class name) followed by every field vLLM
//! 0.33.0 requires, in its declared order:
//!
//! - `BlockStored`: `block_hashes`, `parent_block_hash` (nil),
//!   `token_ids` (empty: a metadata server never sees tokens),
//!   `block_size`, `lora_id` (nil), `medium`, `lora_name` (nil);
//! - `BlockRemoved`: `block_hashes`, `medium`;
//! - `AllBlocksCleared`: nothing else.
//!
//! The `array` format (msgspec's `array_like`, older vLLM releases and the
//! consumers still built for them) writes the same values positionally,
//! the tag first. Fields with a default (`extra_keys`, `locality`, ...)
//! are left out in both, as msgspec's `omit_defaults` does.

use hf3fs_meta_core::Key;

/// How events are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Tagged maps (vLLM ≥ 0.2x, SGLang).
    Map,
    /// Positional arrays, the tag first (msgspec `array_like`).
    Array,
}

/// How a key becomes a block hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashForm {
    /// The key's digest read big-endian, its low 64 bits, as an unsigned
    /// integer (vLLM under `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`; what
    /// llm-d computes from bytes).
    U64,
    /// The digest's bytes (16 for vLLM's keys, 32 for SGLang's): vLLM's
    /// default `bytes` form.
    Bytes,
    /// The first 16 hex digits as a signed 64-bit integer: SGLang's
    /// `hash_str_to_int64`, the hash of SGLang's own GPU and CPU events.
    Sglang,
}

/// One block hash as it goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockHash {
    /// An unsigned integer.
    U(u64),
    /// A signed integer.
    I(i64),
    /// Raw bytes (msgpack bin).
    B(Box<[u8]>),
}

/// The digest a key's events name: a vLLM key's 16 bytes, an SGLang key's
/// 32 (its `-k`/`-v` or `_<pool>` suffix names the same block); `None`
/// for keys of other shapes.
fn digest(key: &Key) -> Option<&[u8]> {
    match key {
        Key::Hex(b) => Some(b),
        Key::Digest(d) => Some(&d.bytes),
        Key::Text(_) => None,
    }
}

impl HashForm {
    /// The block hash of `key` (see [`HashForm`]); `None` for a key that
    /// is not a digest.
    pub fn of(self, key: &Key) -> Option<BlockHash> {
        let d = digest(key)?;
        let eight = |at: usize| -> [u8; 8] { d[at..at + 8].try_into().expect("8 bytes") };
        Some(match self {
            HashForm::U64 => BlockHash::U(u64::from_be_bytes(eight(d.len() - 8))),
            HashForm::Bytes => BlockHash::B(d.into()),
            HashForm::Sglang => BlockHash::I(i64::from_be_bytes(eight(0))),
        })
    }
}

/// One event as it goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    /// `BlockStored` of these hashes.
    Stored(Vec<BlockHash>),
    /// `BlockRemoved` of these hashes.
    Removed(Vec<BlockHash>),
    /// `AllBlocksCleared`.
    Cleared,
}

/// What every batch of one publisher shares.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Maps or arrays.
    pub format: Format,
    /// `medium` of every event (`STORAGE` by default).
    pub medium: String,
    /// `block_size` of `BlockStored` (the tokens per block the consumers
    /// expect; 0 when unknown).
    pub block_size: u32,
    /// The batch's `data_parallel_rank`.
    pub dp_rank: u32,
}

// Writes to a Vec never fail: rmp's errors are the writer's.
fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) {
    r.expect("writing msgpack to a Vec cannot fail");
}

/// An unsigned integer in its shortest msgpack form (as rmp's
/// `write_uint`, inline: a block hash is one per key).
#[inline]
fn uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v <= u64::from(u8::MAX) {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= u64::from(u16::MAX) {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= u64::from(u32::MAX) {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn hashes(out: &mut Vec<u8>, hs: &[BlockHash]) {
    ok(rmp::encode::write_array_len(out, hs.len() as u32));
    out.reserve(hs.len() * 9);
    for h in hs {
        match h {
            BlockHash::U(v) => uint(out, *v),
            BlockHash::I(v) => ok(rmp::encode::write_sint(out, *v)),
            BlockHash::B(b) => ok(rmp::encode::write_bin(out, b)),
        }
    }
}

impl Layout {
    /// The msgpack of one batch at `ts` (Unix seconds).
    pub fn encode(&self, ts: f64, events: &[WireEvent]) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + events.len() * 128);
        ok(rmp::encode::write_array_len(&mut out, 3));
        ok(rmp::encode::write_f64(&mut out, ts));
        ok(rmp::encode::write_array_len(&mut out, events.len() as u32));
        for e in events {
            self.event(&mut out, e);
        }
        ok(rmp::encode::write_uint(&mut out, u64::from(self.dp_rank)));
        out
    }

    /// One event: its tag, then each field (a key before each in maps).
    fn event(&self, out: &mut Vec<u8>, e: &WireEvent) {
        let map = self.format == Format::Map;
        let (tag, n) = match e {
            WireEvent::Stored(_) => ("BlockStored", 8),
            WireEvent::Removed(_) => ("BlockRemoved", 3),
            WireEvent::Cleared => ("AllBlocksCleared", 1),
        };
        if map {
            ok(rmp::encode::write_map_len(out, n));
        } else {
            ok(rmp::encode::write_array_len(out, n));
        }
        let key = |out: &mut Vec<u8>, k: &str| {
            if map {
                ok(rmp::encode::write_str(out, k));
            }
        };
        key(out, "type");
        ok(rmp::encode::write_str(out, tag));
        match e {
            WireEvent::Stored(hs) => {
                key(out, "block_hashes");
                hashes(out, hs);
                key(out, "parent_block_hash");
                ok(rmp::encode::write_nil(out));
                key(out, "token_ids");
                ok(rmp::encode::write_array_len(out, 0));
                key(out, "block_size");
                ok(rmp::encode::write_uint(out, u64::from(self.block_size)));
                key(out, "lora_id");
                ok(rmp::encode::write_nil(out));
                key(out, "medium");
                ok(rmp::encode::write_str(out, &self.medium));
                key(out, "lora_name");
                ok(rmp::encode::write_nil(out));
            }
            WireEvent::Removed(hs) => {
                key(out, "block_hashes");
                hashes(out, hs);
                key(out, "medium");
                ok(rmp::encode::write_str(out, &self.medium));
            }
            WireEvent::Cleared => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hf3fs_meta_core::KeyRef;

    fn layout(format: Format) -> Layout {
        Layout { format, medium: "STORAGE".into(), block_size: 16, dp_rank: 0 }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn a_map_batch_is_these_bytes() {
        let events =
            [WireEvent::Stored(vec![BlockHash::U(1)]), WireEvent::Removed(vec![BlockHash::U(2)]), WireEvent::Cleared];
        let got = layout(Format::Map).encode(1.5, &events);
        let want = concat!(
            "93",                 // [ts, events, dp_rank]
            "cb3ff8000000000000", // 1.5
            "93",                 // three events
            "88",                 // BlockStored: a map of 8
            "a474797065",
            "ab426c6f636b53746f726564", // "type": "BlockStored"
            "ac626c6f636b5f686173686573",
            "9101", // "block_hashes": [1]
            "b1706172656e745f626c6f636b5f68617368",
            "c0", // "parent_block_hash": nil
            "a9746f6b656e5f696473",
            "90", // "token_ids": []
            "aa626c6f636b5f73697a65",
            "10", // "block_size": 16
            "a76c6f72615f6964",
            "c0", // "lora_id": nil
            "a66d656469756d",
            "a753544f52414745", // "medium": "STORAGE"
            "a96c6f72615f6e616d65",
            "c0", // "lora_name": nil
            "83", // BlockRemoved: a map of 3
            "a474797065",
            "ac426c6f636b52656d6f766564",
            "ac626c6f636b5f686173686573",
            "9102",
            "a66d656469756d",
            "a753544f52414745",
            "81",
            "a474797065",
            "b0416c6c426c6f636b73436c6561726564", // AllBlocksCleared
            "00",                                 // data_parallel_rank 0
        );
        assert_eq!(hex(&got), want);
    }

    #[test]
    fn an_array_batch_is_these_bytes() {
        let events =
            [WireEvent::Stored(vec![BlockHash::I(-1)]), WireEvent::Removed(vec![BlockHash::B(vec![0xab; 2].into())])];
        let got = Layout { dp_rank: 3, ..layout(Format::Array) }.encode(0.0, &events);
        let want = concat!(
            "93",
            "cb0000000000000000",
            "92",
            "98",
            "ab426c6f636b53746f726564",
            "91ff",
            "c0",
            "90",
            "10",
            "c0",
            "a753544f52414745",
            "c0",
            "93",
            "ac426c6f636b52656d6f766564",
            "91c402abab",
            "a753544f52414745",
            "03",
        );
        assert_eq!(hex(&got), want);
    }

    #[test]
    fn integers_take_rmps_shortest_form() {
        for v in [0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x1_0000, u64::from(u32::MAX), 1 << 32, u64::MAX] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            uint(&mut ours, v);
            rmp::encode::write_uint(&mut theirs, v).unwrap();
            assert_eq!(ours, theirs, "{v}");
        }
    }

    #[test]
    fn hashes_of_the_engines_keys() {
        let v = KeyRef::parse("000102030405060708090a0b0c0d0e0f").to_key();
        assert_eq!(HashForm::U64.of(&v), Some(BlockHash::U(0x08090a0b0c0d0e0f)));
        assert_eq!(HashForm::Sglang.of(&v), Some(BlockHash::I(0x0001020304050607)));
        assert_eq!(HashForm::Bytes.of(&v), Some(BlockHash::B((0u8..16).collect::<Vec<_>>().into())));
        // SGLang's key: the first 16 hex digits as a signed integer, as
        // SGLang's hash_str_to_int64 does; the suffixes name the base block.
        let base = "ff".repeat(8) + &"00".repeat(24);
        for k in [base.clone(), format!("{base}-k"), format!("{base}-v")] {
            let key = KeyRef::parse(&k).to_key();
            assert_eq!(HashForm::Sglang.of(&key), Some(BlockHash::I(-1)), "{k}");
            assert_eq!(HashForm::U64.of(&key), Some(BlockHash::U(0)), "{k}");
        }
        assert_eq!(HashForm::U64.of(&KeyRef::parse("not a digest").to_key()), None);
    }
}
