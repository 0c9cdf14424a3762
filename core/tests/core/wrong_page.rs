//! Never a wrong page, in the core: a key never comes to name bytes another writer
//! wrote, through the store's own calls (the HTTP sequences are tested
//! through the binary elsewhere; these pin each mechanism at its layer).
//!
//! - A reservation belongs to its key: a late confirm of a page whose
//!   reservation expired and went to another key is refused with
//!   `reserved_for_other_key` and changes nothing; the new writer's confirm
//!   succeeds. The same for SGLang's partial allocate (one code path).
//! - A re-save (an allocate answering a stored page) holds the page for at
//!   least the reservation TTL, with `--read-lease 0` too: churn through a
//!   full rank never hands it to another key meanwhile.
//! - The lease clock wraps instead of saturating: leases and quarantine
//!   work across the wrap.
//!
//! Time is the store's manual clock and its expiry epoch; nothing sleeps.

use hf3fs_meta_core::{ErrorCode, LeaseLength, Store, StoreConfig, TICKS_PER_TTL};

const K1: &str = "0123456789abcdef0123456789abcdef";
const K2: &str = "fedcba9876543210fedcba9876543210";

fn store(pages: i64, eviction: bool, read_lease: u32, ttl: u32) -> Store {
    let s = Store::new(StoreConfig {
        world_size: Some(1),
        eviction,
        read_lease: LeaseLength(read_lease),
        reservation_ttl: LeaseLength(ttl),
        manual_clock: true,
        ..StoreConfig::default()
    });
    s.initialize(0, pages).unwrap();
    s
}

fn alloc(s: &Store, keys: &[&str]) -> Vec<i64> {
    let mut out = Vec::new();
    s.allocate(0, keys, &mut out).unwrap();
    out.iter().map(|&(_, p)| p).collect()
}

fn locations(s: &Store, keys: &[&str]) -> Vec<Option<u32>> {
    let mut out = Vec::new();
    s.locations(0, keys, &mut out).unwrap();
    out
}

/// Lets every reservation made so far expire.
fn expire_all(s: &Store) {
    for _ in 0..=TICKS_PER_TTL {
        s.tick();
    }
}

/// Wrong-page sequence 1 (`seq1` of tests/process/never_a_wrong_page): K1's
/// write outlives its reservation, the page goes to K2, K1's late confirm
/// comes first.
#[test]
fn a_late_confirm_of_a_page_reserved_for_another_key_is_refused() {
    let s = store(1, false, 0, 0);
    assert_eq!(alloc(&s, &[K1]), [0]);
    expire_all(&s);
    assert_eq!(alloc(&s, &[K2]), [0], "the expired page goes to K2");
    let before = s.audit().unwrap();
    let e = s.confirm(0, &[(K1, 0)], &[]).unwrap_err();
    assert_eq!((e.code, e.rank, e.page, e.key.as_deref()), (ErrorCode::ReservedForOtherKey, 0, Some(0), Some(K1)));
    assert_eq!(e.code.as_str(), "reserved_for_other_key");
    assert!(e.to_string().contains("reserved for another key"), "{e}");
    assert_eq!(s.audit().unwrap(), before, "a refused confirm changes nothing");
    s.confirm(0, &[(K2, 0)], &[]).expect("K2's own confirm");
    assert_eq!(locations(&s, &[K1, K2]), [None, Some(0)]);
    s.audit().unwrap();
}

/// One wrong item fails the whole request, like every typed error: the
/// good confirmation and the release in it are not applied either.
#[test]
fn a_request_with_one_page_of_another_key_changes_nothing() {
    let s = store(8, false, 0, 0);
    let p = alloc(&s, &[K1, K2, "text key"]);
    let before = s.audit().unwrap();
    let e = s.confirm(0, &[(K1, p[0]), (K2, p[2])], &[p[1]]).unwrap_err();
    assert_eq!((e.code, e.page), (ErrorCode::ReservedForOtherKey, Some(p[2])));
    assert_eq!(s.audit().unwrap(), before);
    // Swapped keys are refused too; each key on its own page binds.
    assert_eq!(s.confirm(0, &[(K1, p[1]), (K2, p[0])], &[]).unwrap_err().code, ErrorCode::ReservedForOtherKey);
    s.confirm(0, &[(K1, p[0]), (K2, p[1]), ("text key", p[2])], &[]).unwrap();
    assert_eq!(locations(&s, &[K1, K2, "text key"]), [0, 1, 2].map(|i| Some(p[i] as u32)));
}

/// SGLang's allocate and confirm are the same code: the same refusal, for
/// its digest keys and any text key.
#[test]
fn sglang_keys_are_checked_the_same_way() {
    let sha = |i: u32| format!("{:064x}-k", u128::from(i) * 0x9E37_79B9);
    let (a, b) = (sha(1), sha(2));
    let s = store(1, false, 0, 0);
    let mut slots = Vec::new();
    s.allocate_partial(0, &[&a], &mut slots).unwrap();
    assert_eq!(slots[0].page, 0);
    expire_all(&s);
    s.allocate_partial(0, &["plain"], &mut slots).unwrap();
    assert_eq!(slots[0].page, 0);
    assert_eq!(s.confirm(0, &[(&a, 0)], &[]).unwrap_err().code, ErrorCode::ReservedForOtherKey);
    s.confirm(0, &[("plain", 0)], &[]).unwrap();
    expire_all(&s);
    s.confirm(0, &[], &[0]).unwrap();
    s.allocate_partial(0, &[&b], &mut slots).unwrap();
    assert_eq!(s.confirm(0, &[(&a, 0)], &[]).unwrap_err().code, ErrorCode::ReservedForOtherKey);
    s.confirm(0, &[(&b, 0)], &[]).unwrap();
    s.audit().unwrap();
}

/// A release names no key, so it cannot be checked: a late writer's
/// release frees the page another writer now holds (documented in
/// docs/differences.md). That writer's confirm then fails cleanly; no key
/// is bound to the page.
#[test]
fn a_release_cannot_tell_whose_reservation_it_frees() {
    let s = store(1, false, 0, 0);
    alloc(&s, &[K1]);
    expire_all(&s);
    alloc(&s, &[K2]);
    s.confirm(0, &[], &[0]).expect("a key-less release is accepted");
    assert_eq!(s.confirm(0, &[(K2, 0)], &[]).unwrap_err().code, ErrorCode::ConfirmUnallocated);
    assert_eq!(locations(&s, &[K1, K2]), [None, None]);
}

/// Wrong-page sequence 3 (`seq3` of tests/process/never_a_wrong_page): a
/// re-save with `--read-lease 0` and eviction on; 40 new keys churn through the 8-page rank while the rewrite may run.
#[test]
fn a_resave_keeps_its_page_through_eviction_for_the_reservation_ttl() {
    const TTL: u32 = 40;
    let s = store(8, true, 0, TTL);
    let k = alloc(&s, &[K1])[0];
    s.confirm(0, &[(K1, k)], &[]).unwrap();
    assert_eq!(alloc(&s, &[K1]), [k], "the re-save gets the stored page");
    for i in 0..40u32 {
        let key = format!("{:032x}", 0x1000 + i);
        let p = alloc(&s, &[&key])[0];
        assert!(p >= 0, "room is made by evicting the other keys");
        assert_ne!(p, k, "churn key {i} was handed the page a re-save is rewriting");
        s.confirm(0, &[(&key, p)], &[]).unwrap();
        s.maintain(64);
        // Time passes, up to the last tick the reuse lease covers.
        s.set_clock(i * TTL / 40);
    }
    s.confirm(0, &[(K1, k)], &[]).expect("the re-save's confirm is a no-op");
    assert_eq!(locations(&s, &[K1]), [Some(k as u32)]);
    s.audit().unwrap();
    // Once the lease (1.25 TTL, a tick and an eighth of slack more) has
    // passed, K1 may go.
    s.set_clock(2 * TTL);
    let mut evicted = false;
    for i in 0..16u32 {
        let key = format!("{:032x}", 0x2000 + i);
        let p = alloc(&s, &[&key])[0];
        evicted |= p == k;
        s.confirm(0, &[(&key, p)], &[]).unwrap();
    }
    assert!(evicted, "after its lease the re-saved key is evictable like any other");
    s.audit().unwrap();
}

/// The lease clock near the end of its 31-bit ring: a lease taken before
/// the wrap still protects after it, and passes when it should.
#[test]
fn leases_and_quarantine_work_across_the_clock_wrap() {
    const END: u32 = (1 << 31) - 1;
    let s = store(2, true, 100, 0);
    s.set_clock(END - 10);
    let p = alloc(&s, &[K1])[0];
    s.confirm(0, &[(K1, p)], &[]).unwrap();
    assert_eq!(locations(&s, &[K1]), [Some(p as u32)], "a read leases K1 until tick ~91 after the wrap");
    s.set_clock(5); // wrapped
    assert_eq!(s.confirm(0, &[], &[p]).unwrap().quarantined, 1, "still leased after the wrap");
    s.set_clock(60);
    s.maintain(64);
    assert_eq!(s.stats().ranks[0].quarantined, 1, "held until the lease passes");
    s.set_clock(200);
    s.maintain(64);
    assert_eq!(s.stats().ranks[0].quarantined, 0, "free once it has");
    s.audit().unwrap();
}
