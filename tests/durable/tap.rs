//! The replication tap ([`hf3fs_meta::durable::tap`]) as the writer drives
//! it: frames are built only while the attached layer wants them, a frame
//! that starts with a `/clear` is handed on regardless, and the first
//! frame after a pause names, in `from`, where the last one handed on (or
//! skipped) ended, so a consumer sees what it missed.

use hf3fs_meta::core::{Store, StoreConfig};
use hf3fs_meta::durable::codec::{self, Record};
use hf3fs_meta::durable::tap::{BoxFuture, Frame, Replication};
use hf3fs_meta::durable::{Durable, FsyncMode, Options};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Collects the frames it is handed; wants them while `wants` is set.
struct Collector {
    wants: AtomicBool,
    frames: crossbeam_channel::Sender<Frame>,
}

impl Replication for Collector {
    fn written(&self, frame: Frame) {
        let _ = self.frames.send(frame);
    }

    fn broken(&self) {}

    fn wants_frames(&self) -> bool {
        self.wants.load(Ordering::Acquire)
    }

    fn acknowledged(&self, _upto: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

fn open(dir: &std::path::Path) -> (std::sync::Arc<Store>, Durable) {
    let cfg = StoreConfig { world_size: Some(1), max_ranks: 4, max_pages_per_rank: 1 << 10, ..StoreConfig::default() };
    let opts = Options { checkpoint_every: None, ..Options::new(FsyncMode::Always, cfg) };
    let (s, d, _) = Durable::open(dir, opts).unwrap_or_else(|e| panic!("open: {e}"));
    (s, d)
}

fn records(f: &Frame) -> Vec<Record> {
    let mut out = Vec::new();
    codec::decode_log(&f.records, |r| out.push(r)).expect("decodable records");
    out
}

#[test]
fn frames_are_built_only_while_wanted_and_a_clear_always_travels() {
    let dir = tempfile::tempdir().unwrap();
    let (s, d) = open(dir.path());
    let (tx, rx) = crossbeam_channel::unbounded();
    let c = std::sync::Arc::new(Collector { wants: AtomicBool::new(false), frames: tx });
    assert!(d.attach(c.clone()));
    let wait = || d.sync_blocking(Duration::from_secs(30)).expect("durable");
    let next = || rx.recv_timeout(Duration::from_secs(30)).expect("a frame within the failsafe");

    // Not wanted: written and durable, but no frame is built.
    s.initialize(0, 64).unwrap();
    let mut out = Vec::new();
    s.allocate(0, &["0123456789abcdef0123456789abcdef"], &mut out).unwrap();
    wait();
    let skipped_to = d.head();
    assert!(skipped_to >= 2, "the rank and the reservation were numbered");
    // A /clear is handed on even so; frames come in order from one thread,
    // so it being the first one received shows nothing before it was.
    s.clear();
    wait();
    let f = next();
    assert!(f.clear, "{f:?}");
    assert_eq!(f.from, skipped_to, "the skipped passes still moved the position on");
    assert_eq!(f.upto, d.head());
    let after_clear = f.upto;

    // Wanted again: the next pass's frame follows on, with its records.
    c.wants.store(true, Ordering::Release);
    s.initialize(1, 32).unwrap();
    wait();
    let f = next();
    assert!(!f.clear);
    assert_eq!((f.from, f.upto), (after_clear, d.head()));
    assert!(matches!(records(&f)[..], [Record::Initialize { rank: 1, num_pages: 32 }]), "{:?}", records(&f));
    assert!(rx.try_recv().is_err(), "one pass, one frame");
}
