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

use hf3fs_meta_core::{Block, Event};
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

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

impl HashForm {
    /// The block hash of `block` (see [`HashForm`]).
    pub fn of(self, block: &Block) -> BlockHash {
        let d = block.digest();
        match self {
            HashForm::U64 => BlockHash::U(low64(d)),
            HashForm::Bytes => BlockHash::B(d.into()),
            HashForm::Sglang => BlockHash::I(high64(d)),
        }
    }
}

/// A digest's last 8 bytes, big-endian.
#[inline]
fn low64(d: &[u8]) -> u64 {
    u64::from_be_bytes(d[d.len() - 8..].try_into().expect("8 bytes"))
}

/// A digest's first 8 bytes, big-endian, signed.
#[inline]
fn high64(d: &[u8]) -> i64 {
    i64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// A block's hash in the `U64` form, written at the start of `out`;
/// returns its length.
fn u64_hash(out: &mut [u8; 9], b: &Block) -> usize {
    let v = match b {
        Block::Hex(x) => u64::from_be_bytes([x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]]),
        Block::Digest(d) => {
            let x = &d.bytes;
            u64::from_be_bytes([x[24], x[25], x[26], x[27], x[28], x[29], x[30], x[31]])
        }
    };
    if v > u64::from(u32::MAX) {
        out[0] = 0xcf;
        out[1..].copy_from_slice(&v.to_be_bytes());
        9
    } else {
        let mut w = &mut out[..];
        ok(rmp::encode::write_uint(&mut w, v));
        9 - w.len()
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
        match e {
            WireEvent::Stored(hs) | WireEvent::Removed(hs) => {
                let stored = matches!(e, WireEvent::Stored(_));
                self.head(out, stored);
                hashes(out, hs);
                self.tail(out, stored);
            }
            WireEvent::Cleared => {
                self.start(out, "AllBlocksCleared", 1);
            }
        }
    }

    /// A map's (or array's) length and the event's tag.
    fn start(&self, out: &mut Vec<u8>, tag: &str, n: u32) {
        if self.format == Format::Map {
            ok(rmp::encode::write_map_len(out, n));
            ok(rmp::encode::write_str(out, "type"));
        } else {
            ok(rmp::encode::write_array_len(out, n));
        }
        ok(rmp::encode::write_str(out, tag));
    }

    /// A key, in maps.
    fn key(&self, out: &mut Vec<u8>, k: &str) {
        if self.format == Format::Map {
            ok(rmp::encode::write_str(out, k));
        }
    }

    /// A `BlockStored` (or `BlockRemoved`) up to its hashes.
    fn head(&self, out: &mut Vec<u8>, stored: bool) {
        if stored {
            self.start(out, "BlockStored", 8);
        } else {
            self.start(out, "BlockRemoved", 3);
        }
        self.key(out, "block_hashes");
    }

    /// The fields after the hashes.
    fn tail(&self, out: &mut Vec<u8>, stored: bool) {
        if stored {
            self.key(out, "parent_block_hash");
            ok(rmp::encode::write_nil(out));
            self.key(out, "token_ids");
            ok(rmp::encode::write_array_len(out, 0));
            self.key(out, "block_size");
            ok(rmp::encode::write_uint(out, u64::from(self.block_size)));
            self.key(out, "lora_id");
            ok(rmp::encode::write_nil(out));
        }
        self.key(out, "medium");
        ok(rmp::encode::write_str(out, &self.medium));
        if stored {
            self.key(out, "lora_name");
            ok(rmp::encode::write_nil(out));
        }
    }
}

/// A hasher for digests, which are uniform already: their first 8 bytes.
#[derive(Default)]
struct FirstWord(u64);

impl Hasher for FirstWord {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        if bytes.len() >= 8 {
            self.0 = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        }
    }
    fn write_usize(&mut self, _: usize) {}
}

/// Writes the events of one or more operations straight into the msgpack
/// of one batch: runs of stores (and of removals) become one event each,
/// and within one operation's run a `-k` and its `-v` (or `_<pool>`) key
/// name their block once. Its buffers are kept from batch to batch.
#[derive(Default)]
pub struct Writer {
    /// The events written so far, each complete.
    body: Vec<u8>,
    /// The hashes of the open run.
    run: Vec<u8>,
    /// The open run: of stores (`true`) or of removals.
    open: Option<bool>,
    /// Hashes in the open run.
    run_len: u32,
    /// Events in `body`.
    events: u32,
    /// The suffixed digests of the open run, within the operation at hand.
    seen: HashSet<[u8; 32], BuildHasherDefault<FirstWord>>,
    /// The fixed bytes around a run's hashes, for the layout last used.
    parts: Option<Parts>,
}

/// The bytes before and after the hashes of a `BlockStored` and of a
/// `BlockRemoved` in one layout (written once, copied into each event).
struct Parts {
    layout: Layout,
    stored: (Vec<u8>, Vec<u8>),
    removed: (Vec<u8>, Vec<u8>),
}

impl Parts {
    fn of(layout: &Layout) -> Parts {
        let part = |stored| {
            let (mut head, mut tail) = (Vec::new(), Vec::new());
            layout.head(&mut head, stored);
            layout.tail(&mut tail, stored);
            (head, tail)
        };
        Parts { layout: layout.clone(), stored: part(true), removed: part(false) }
    }
}

impl Writer {
    /// Starts the next operation's events (a repeat across operations is
    /// announced again, as each operation's own batch would).
    pub fn next_operation(&mut self) {
        self.seen.clear();
    }

    /// Adds one event.
    pub fn push(&mut self, layout: &Layout, form: HashForm, e: &Event) {
        self.push_all(layout, form, std::slice::from_ref(e));
    }

    /// Adds events, in order: one loop per hash form, each block's hash
    /// written as it is read (the request path's keys go through here).
    pub fn push_all(&mut self, layout: &Layout, form: HashForm, events: &[Event]) {
        match form {
            HashForm::U64 => {
                let n = self.hex_run(layout, events);
                self.each::<9>(layout, &events[n..], u64_hash);
            }
            HashForm::Sglang => self.each::<9>(layout, events, |out, b| {
                let mut w = &mut out[..];
                ok(rmp::encode::write_sint(&mut w, high64(b.digest())));
                9 - w.len()
            }),
            HashForm::Bytes => self.each::<34>(layout, events, |out, b| {
                let mut w = &mut out[..];
                ok(rmp::encode::write_bin(&mut w, b.digest()));
                34 - w.len()
            }),
        }
    }

    /// The leading run of one kind of vLLM (hex) blocks in the `U64` form,
    /// the common batch (a confirm's stores, a release's removals): each
    /// hash is `cf` and the key's last 8 bytes as they are (big-endian
    /// already), written into a 9-byte slot; returns the events taken.
    /// A run holding a hash below 2^32 (a shorter msgpack form) is written
    /// again the general way.
    fn hex_run(&mut self, layout: &Layout, events: &[Event]) -> usize {
        let stored = match events.first() {
            Some(Event::Stored(Block::Hex(_))) => true,
            Some(Event::Removed(Block::Hex(_))) => false,
            _ => return 0,
        };
        if self.open != Some(stored) {
            self.close(layout);
            self.open = Some(stored);
        }
        let at = self.run.len();
        self.run.resize(at + events.len() * 9, 0);
        let (mut taken, mut short) = (0, false);
        for (e, slot) in events.iter().zip(self.run[at..].chunks_exact_mut(9)) {
            let x = match (stored, e) {
                (true, Event::Stored(Block::Hex(x))) | (false, Event::Removed(Block::Hex(x))) => x,
                _ => break,
            };
            slot[0] = 0xcf;
            slot[1..].copy_from_slice(&x[8..]);
            short |= x[8..12] == [0; 4];
            taken += 1;
        }
        if short {
            self.run.truncate(at);
            self.each::<9>(layout, &events[..taken], u64_hash);
        } else {
            self.run.truncate(at + taken * 9);
            self.run_len += taken as u32;
        }
        taken
    }

    /// The loop of [`Writer::push_all`], a run of one kind at a time: the
    /// run's buffer is grown once to hold each of its hashes at its longest
    /// (`MAX` bytes), `write` writes one hash at the cursor and says how
    /// long it is, and the buffer is cut to what was written after the run
    /// (no capacity check, no look at the writer's fields, a key).
    #[inline(always)]
    fn each<const MAX: usize>(
        &mut self,
        layout: &Layout,
        events: &[Event],
        write: impl Fn(&mut [u8; MAX], &Block) -> usize,
    ) {
        let mut rest = events;
        while let Some(first) = rest.first() {
            let stored = match first {
                Event::Stored(_) => true,
                Event::Removed(_) => false,
                Event::Cleared => {
                    self.close(layout);
                    layout.event(&mut self.body, &WireEvent::Cleared);
                    self.events += 1;
                    rest = &rest[1..];
                    continue;
                }
            };
            if self.open != Some(stored) {
                self.close(layout);
                self.open = Some(stored);
            }
            let at = self.run.len();
            self.run.resize(at + rest.len() * MAX, 0);
            let (run, seen) = (&mut self.run, &mut self.seen);
            let out = &mut run[at..];
            let (mut w, mut taken, mut written) = (0, 0, 0);
            for e in rest {
                let b = match (stored, e) {
                    (true, Event::Stored(b)) | (false, Event::Removed(b)) => b,
                    _ => break,
                };
                taken += 1;
                if let Block::Digest(d) = b {
                    if d.suffix != hf3fs_meta_core::key::Suffix::NONE && !seen.insert(d.bytes) {
                        continue;
                    }
                }
                let slot: &mut [u8; MAX] = (&mut out[w..w + MAX]).try_into().expect("MAX bytes");
                w += write(slot, b);
                written += 1;
            }
            run.truncate(at + w);
            self.run_len += written;
            rest = &rest[taken..];
        }
    }

    /// Ends the open run: its event goes into the body.
    fn close(&mut self, layout: &Layout) {
        let Some(stored) = self.open.take() else { return };
        self.seen.clear();
        if self.run_len == 0 {
            return;
        }
        let parts = match &self.parts {
            Some(p) if p.layout == *layout => p,
            _ => self.parts.insert(Parts::of(layout)),
        };
        let (head, tail) =
            if stored { (&parts.stored.0, &parts.stored.1) } else { (&parts.removed.0, &parts.removed.1) };
        self.body.extend_from_slice(head);
        ok(rmp::encode::write_array_len(&mut self.body, self.run_len));
        self.body.extend_from_slice(&self.run);
        self.body.extend_from_slice(tail);
        self.run.clear();
        self.run_len = 0;
        self.events += 1;
    }

    /// Whether no event was written since the last batch.
    pub fn is_empty(&self) -> bool {
        self.events == 0 && self.run_len == 0
    }

    /// The events written so far, as one batch at `ts` (Unix seconds), and
    /// how many events it holds; the writer starts over.
    pub fn finish(&mut self, layout: &Layout, ts: f64) -> (Vec<u8>, u32) {
        self.close(layout);
        let mut out = Vec::with_capacity(self.body.len() + 24);
        ok(rmp::encode::write_array_len(&mut out, 3));
        ok(rmp::encode::write_f64(&mut out, ts));
        ok(rmp::encode::write_array_len(&mut out, self.events));
        out.extend_from_slice(&self.body);
        uint(&mut out, u64::from(layout.dp_rank));
        let n = self.events;
        self.body.clear();
        self.events = 0;
        self.seen.clear();
        (out, n)
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

    fn block(s: &str) -> Block {
        Block::of(KeyRef::parse(s)).unwrap()
    }

    #[test]
    fn the_writer_writes_what_the_batch_of_its_runs_encodes() {
        let a = block(&format!("{:032x}", 0xa1_u32));
        let b = block(&format!("{:032x}", 0x1_0000_0000_u64));
        let base = "ab".repeat(32);
        let (k, v) = (block(&format!("{base}-k")), block(&format!("{base}-v")));
        for format in [Format::Map, Format::Array] {
            for form in [HashForm::U64, HashForm::Bytes, HashForm::Sglang] {
                let l = layout(format);
                let mut w = Writer::default();
                assert!(w.is_empty());
                // Two operations: their runs of stores merge; one
                // operation's -k and -v name their block once, the next
                // operation's -k again; a clear is an event of its own.
                w.next_operation();
                for e in [Event::Stored(a), Event::Stored(k), Event::Stored(v)] {
                    w.push(&l, form, &e);
                }
                w.next_operation();
                for e in [Event::Stored(b), Event::Stored(k), Event::Removed(a), Event::Cleared, Event::Removed(b)] {
                    w.push(&l, form, &e);
                }
                assert!(!w.is_empty());
                let (got, n) = w.finish(&l, 2.0);
                let h = |x: &Block| form.of(x);
                let want = [
                    WireEvent::Stored(vec![h(&a), h(&k), h(&b), h(&k)]),
                    WireEvent::Removed(vec![h(&a)]),
                    WireEvent::Cleared,
                    WireEvent::Removed(vec![h(&b)]),
                ];
                assert_eq!((hex(&got), n), (hex(&l.encode(2.0, &want)), 4), "{format:?} {form:?}");
                // It starts over: the next batch holds only what follows.
                assert!(w.is_empty());
                w.push(&l, form, &Event::Removed(v));
                let (got, n) = w.finish(&l, 3.0);
                assert_eq!((hex(&got), n), (hex(&l.encode(3.0, &[WireEvent::Removed(vec![h(&v)])])), 1));
            }
        }
    }

    #[test]
    fn a_run_of_vllm_blocks_is_what_the_batch_of_its_runs_encodes() {
        let long = |i: u64| block(&format!("{:032x}", (u128::from(i) << 40) | 0x00ff_ffff_ffff));
        let short = block(&format!("{:032x}", 7));
        let l = layout(Format::Map);
        // Long hashes only (the slots as they are), one with a short hash
        // (the run again the general way), and kinds mixed in one batch.
        for events in [
            vec![Event::Stored(long(1)), Event::Stored(long(2)), Event::Stored(long(3))],
            vec![Event::Removed(long(1)), Event::Removed(short), Event::Removed(long(2))],
            vec![Event::Removed(long(4)), Event::Stored(long(5)), Event::Stored(short), Event::Removed(long(6))],
        ] {
            let mut w = Writer::default();
            w.next_operation();
            w.push_all(&l, HashForm::U64, &events);
            let (got, _) = w.finish(&l, 1.0);
            let h = |e: &Event| match e {
                Event::Stored(b) | Event::Removed(b) => HashForm::U64.of(b),
                Event::Cleared => unreachable!(),
            };
            let mut runs: Vec<WireEvent> = Vec::new();
            for e in &events {
                match (runs.last_mut(), e) {
                    (Some(WireEvent::Stored(hs)), Event::Stored(_))
                    | (Some(WireEvent::Removed(hs)), Event::Removed(_)) => hs.push(h(e)),
                    (_, Event::Stored(_)) => runs.push(WireEvent::Stored(vec![h(e)])),
                    (_, _) => runs.push(WireEvent::Removed(vec![h(e)])),
                }
            }
            assert_eq!(hex(&got), hex(&l.encode(1.0, &runs)), "{events:?}");
        }
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
        let v = Block::of(KeyRef::parse("000102030405060708090a0b0c0d0e0f")).unwrap();
        assert_eq!(HashForm::U64.of(&v), BlockHash::U(0x08090a0b0c0d0e0f));
        assert_eq!(HashForm::Sglang.of(&v), BlockHash::I(0x0001020304050607));
        assert_eq!(HashForm::Bytes.of(&v), BlockHash::B((0u8..16).collect::<Vec<_>>().into()));
        // SGLang's key: the first 16 hex digits as a signed integer, as
        // SGLang's hash_str_to_int64 does; the suffixes name the base block.
        let base = "ff".repeat(8) + &"00".repeat(24);
        for k in [base.clone(), format!("{base}-k"), format!("{base}-v")] {
            let key = Block::of(KeyRef::parse(&k)).unwrap();
            assert_eq!(HashForm::Sglang.of(&key), BlockHash::I(-1), "{k}");
            assert_eq!(HashForm::U64.of(&key), BlockHash::U(0), "{k}");
        }
        assert_eq!(Block::of(KeyRef::parse("not a digest")), None);
    }
}
