//! Confirm's second half (re-confirms, releases, quarantine and typed errors), `exists`/`locations`, and `/clear` (the second half of [`super`]).

use super::*;

// ===========================================================================
// POST /keys/confirm_write: every error code, each leaving the store as it was

/// `docs/error-codes.json`, the codes for the readers that cannot ask the
/// core (the Python suites, schemathesis's hooks, the docs' checks).
const ERROR_CODES_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/error-codes.json");

/// What `docs/error-codes.json` must hold: `ErrorCode::ALL`, in order, the
/// codes of confirm_write (`codes`) apart from the tenant codes
/// (`tenant_codes`).
fn error_codes_json() -> String {
    let list = |codes: &[ErrorCode]| -> String {
        codes.iter().map(|c| format!("    \"{}\"", c.as_str())).collect::<Vec<_>>().join(",\n")
    };
    let confirm: Vec<ErrorCode> = ErrorCode::ALL.into_iter().filter(|c| ErrorCode::CONFIRM.contains(c)).collect();
    let tenant: Vec<ErrorCode> = ErrorCode::ALL.into_iter().filter(|c| ErrorCode::TENANT.contains(c)).collect();
    assert_eq!(confirm.len() + tenant.len(), ErrorCode::ALL.len(), "every code is a confirm or a tenant code");
    format!(
        "{{\n  \"about\": \"The typed error codes (docs/api.md): confirm_write's, then the tenant refusals' \
         (docs/tenants.md), in the order of ErrorCode::ALL (core/src/error.rs), which this file is generated \
         from: {REGENERATE}\",\n  \"codes\": [\n{}\n  ],\n  \"tenant_codes\": [\n{}\n  ]\n}}\n",
        list(&confirm),
        list(&tenant)
    )
}

/// The command that writes `docs/error-codes.json` anew.
const REGENERATE: &str = "UPDATE_ERROR_CODES=1 cargo test -p hf3fs-meta-core --test core error_codes";

/// The generator of `docs/error-codes.json`: fails when the committed file
/// is not `ErrorCode::ALL`; with `UPDATE_ERROR_CODES=1`, writes it.
#[test]
fn error_codes_on_the_wire_are_the_committed_list() {
    let want = error_codes_json();
    if std::env::var_os("UPDATE_ERROR_CODES").is_some() {
        std::fs::write(ERROR_CODES_FILE, &want).expect("write docs/error-codes.json");
    }
    let have = std::fs::read_to_string(ERROR_CODES_FILE).unwrap_or_default();
    assert!(have == want, "docs/error-codes.json is not ErrorCode::ALL; regenerate it: `{REGENERATE}`\n{want}");
    // Every code is snake_case, and no two are the same.
    let names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert!(names.iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')), "{names:?}");
    let distinct: std::collections::HashSet<&str> = names.iter().copied().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
}

#[test]
fn confirm_rank_not_initialized() {
    let f = Fixture::new();
    let good = f.good_confs();
    for rank in [2, 7, 8, 1000, -1, i64::MIN] {
        // Even an empty request names an unknown rank.
        rejected(&f.s, rank, &[], &[], ErrorCode::RankNotInitialized, None, None);
        rejected(&f.s, rank, &good, &f.good_rels(), ErrorCode::RankNotInitialized, None, None);
    }
    f.good_part_still_works();
}

#[test]
fn confirm_page_out_of_range_in_confirmations() {
    for bad in [16, 17, -1, -16, i64::MIN, i64::MAX, 1 << 32, (1 << 32) + 1] {
        let f = Fixture::new();
        f.reject(&[(E, bad)], &[], ErrorCode::PageOutOfRange, bad, Some(E));
    }
}

#[test]
fn confirm_page_out_of_range_aliasing_a_reserved_page() {
    // 2^32 + q0 must not be truncated to q0.
    let f = Fixture::new();
    let bad = (1i64 << 32) + f.q[0];
    rejected(&f.s, 0, &[(C, bad)], &[], ErrorCode::PageOutOfRange, Some(bad), Some(C));
    rejected(&f.s, 0, &[], &[bad], ErrorCode::PageOutOfRange, Some(bad), None);
    let bad = (1i64 << 32) + f.q[1];
    rejected(&f.s, 0, &[(A, bad)], &[], ErrorCode::PageOutOfRange, Some(bad), Some(A));
    f.good_part_still_works();
}

#[test]
fn confirm_page_out_of_range_in_releases() {
    for bad in [16, -1, i64::MIN, i64::MAX, 1 << 32] {
        let f = Fixture::new();
        f.reject(&[], &[bad], ErrorCode::PageOutOfRange, bad, None);
    }
}

#[test]
fn confirm_unallocated_never_reserved() {
    let f = Fixture::new();
    f.reject(&[(E, 15)], &[], ErrorCode::ConfirmUnallocated, 15, Some(E));
}

#[test]
fn confirm_unallocated_released_pages() {
    // q2 and q4 were handed out then released; q2 sits between the good pages.
    let f = Fixture::new();
    f.reject(&[(E, f.q[2])], &[], ErrorCode::ConfirmUnallocated, f.q[2], Some(E));
    let f = Fixture::new();
    f.reject(&[(TEXT, f.q[4])], &[], ErrorCode::ConfirmUnallocated, f.q[4], Some(TEXT));
}

#[test]
fn double_confirm_page_bound_to_another_key() {
    let f = Fixture::new();
    // q3 is bound to B.
    for key in [E, A, TEXT, ZERO, EMPTY] {
        let err = rejected(&f.s, 0, &[(key, f.q[3])], &[], ErrorCode::DoubleConfirm, Some(f.q[3]), Some(key));
        assert!(err.already_bound);
    }
    f.reject(&[(E, f.q[3])], &[], ErrorCode::DoubleConfirm, f.q[3], Some(E));
}

#[test]
fn double_confirm_text_and_hex_owners_differ() {
    let s = store_with(None, &[8]);
    let p = save(&s, 0, &[TEXT, A, ZERO]);
    rejected(&s, 0, &[(A, p[0])], &[], ErrorCode::DoubleConfirm, Some(p[0]), Some(A));
    rejected(&s, 0, &[(A_UPPER, p[1])], &[], ErrorCode::DoubleConfirm, Some(p[1]), Some(A_UPPER));
    rejected(&s, 0, &[(TEXT, p[1])], &[], ErrorCode::DoubleConfirm, Some(p[1]), Some(TEXT));
    rejected(&s, 0, &[("block/text-kez", p[0])], &[], ErrorCode::DoubleConfirm, Some(p[0]), Some("block/text-kez"));
    rejected(&s, 0, &[(EMPTY, p[2])], &[], ErrorCode::DoubleConfirm, Some(p[2]), Some(EMPTY));
    assert_eq!(confirm_ok(&s, 0, &[(TEXT, p[0]), (A, p[1]), (ZERO, p[2])], &[]), outcome(0, 3, 0, 0));
}

#[test]
fn double_confirm_one_page_two_keys_in_one_request() {
    let f = Fixture::new();
    let q0 = f.q[0];
    for confs in [[(C, q0), (E, q0)], [(E, q0), (C, q0)]] {
        let before = snapshot(&f.s);
        let err = f.s.confirm(0, &confs, &[]).unwrap_err();
        assert_eq!((err.code, err.rank, err.page), (ErrorCode::DoubleConfirm, 0, Some(q0)));
        assert!(matches!(err.key.as_deref(), Some(C) | Some(E)), "{err:?}");
        assert!(!err.already_bound);
        assert_eq!(snapshot(&f.s), before);
    }
    // Also with a bound page (q1 is A's) and a reconfirm of the right key.
    let before = snapshot(&f.s);
    let err = f.s.confirm(0, &[(A, f.q[1]), (B, f.q[1])], &[]).unwrap_err();
    assert_eq!((err.code, err.page), (ErrorCode::DoubleConfirm, Some(f.q[1])));
    assert_eq!(snapshot(&f.s), before);
    let err = f.s.confirm(0, &[(C, f.q[0]), (A, f.q[5]), (D, f.q[5]), (E, 15)], &[]).unwrap_err();
    assert_eq!(err.code, ErrorCode::DoubleConfirm, "{err:?}");
    assert_eq!(snapshot(&f.s), before);
    f.good_part_still_works();
}

#[test]
fn release_unallocated() {
    let f = Fixture::new();
    f.reject(&[], &[15], ErrorCode::ReleaseUnallocated, 15, None);
    let f = Fixture::new();
    f.reject(&[], &[f.q[2]], ErrorCode::ReleaseUnallocated, f.q[2], None);
}

#[test]
fn double_release() {
    // A bound page and a free page listed twice, beside the good items.
    let f = Fixture::new();
    f.reject(&[], &[f.q[3], f.q[3]], ErrorCode::DoubleRelease, f.q[3], None);
    let f = Fixture::new();
    f.reject(&[], &[f.q[2], f.q[2]], ErrorCode::DoubleRelease, f.q[2], None);
    // A reserved page and the good part's own bound page, listed twice.
    let f = Fixture::new();
    rejected(&f.s, 0, &[], &[f.q[0], f.q[0]], ErrorCode::DoubleRelease, Some(f.q[0]), None);
    rejected(&f.s, 0, &[], &[f.q[1], f.q[5], f.q[1]], ErrorCode::DoubleRelease, Some(f.q[1]), None);
    f.good_part_still_works();
}

#[test]
fn confirm_and_release_same_page() {
    let f = Fixture::new();
    // Reserved q5 (already in the good part as a confirmation): also released.
    rejected(&f.s, 0, &f.good_confs(), &[f.q[5], f.q[1]], ErrorCode::ConfirmAndRelease, Some(f.q[5]), Some(D));
    // Bound q3, reconfirmed by its key and released.
    f.reject(&[(B, f.q[3])], &[f.q[3]], ErrorCode::ConfirmAndRelease, f.q[3], Some(B));
}

#[test]
fn rejected_request_keeps_reservations_for_a_retry() {
    // The client retries a 500: after any rejection, the same pages are
    // still reserved and confirmable. The bad page sits first, in the middle
    // and last in the claim order (pages are claimed in page order).
    let s = store_with(None, &[40]);
    let mut held: Vec<(String, i64)> =
        (0..40).map(|i| format!("{i:032x}")).collect::<Vec<_>>().into_iter().zip(0..).collect();
    let keys: Vec<&str> = held.iter().map(|(k, _)| k.as_str()).collect();
    let pages = alloc(&s, 0, &keys);
    for (h, p) in held.iter_mut().zip(pages) {
        h.1 = p;
    }
    held.sort_by_key(|h| h.1);
    assert_eq!(held.iter().map(|h| h.1).collect::<Vec<_>>(), (0..40).collect::<Vec<_>>());
    for idx in [0usize, 20, 39] {
        let bad = held[idx].1;
        confirm_ok(&s, 0, &[], &[bad]);
        let mut confs: Vec<(&str, i64)> = held.iter().filter(|h| h.1 != bad).map(|(k, p)| (k.as_str(), *p)).collect();
        confs.insert(confs.len() / 2, ("late key", bad));
        rejected(&s, 0, &confs, &[], ErrorCode::ConfirmUnallocated, Some(bad), Some("late key"));
        let rels: Vec<i64> = held.iter().map(|h| h.1).collect();
        rejected(&s, 0, &[], &rels, ErrorCode::ReleaseUnallocated, Some(bad), None);
        assert_eq!(free_res_bound(&s, 0), (1, 39, 0));
        let refill = format!("refill {idx}");
        assert_eq!(alloc1(&s, 0, &refill), bad);
        held[idx].0 = refill;
    }
    let confs: Vec<(&str, i64)> = held.iter().map(|(k, p)| (k.as_str(), *p)).collect();
    assert_eq!(confirm_ok(&s, 0, &confs, &[]), outcome(40, 0, 0, 0));
    s.audit().unwrap();
}

// ===========================================================================
// POST /keys/batch_exists and /keys/get_locations: world size

#[test]
fn world_size_from_initialized_ranks() {
    let s = store_with(None, &[8, 8, 8]);
    let p0 = save(&s, 0, &[A])[0];
    let p2 = save(&s, 2, &[A])[0];
    assert!(!exists1(&s, A), "2 of 3 ranks");
    assert_eq!(locations(&s, 0, &[A]).unwrap(), vec![None]);
    let p1 = save(&s, 1, &[A])[0];
    assert!(exists1(&s, A));
    for (r, p) in [(0, p0), (1, p1), (2, p2)] {
        assert_eq!(loc1(&s, r, A), Some(p as u32));
    }
    assert_eq!(s.stats().complete_keys, 1);
}

#[test]
fn world_size_is_fixed_at_first_confirm() {
    // Parity: a key confirmed while only rank 0 exists has world 1.
    let s = store_with(None, &[8]);
    let p = save(&s, 0, &[A])[0];
    assert!(exists1(&s, A));
    s.initialize(1, 8).unwrap();
    assert!(exists1(&s, A), "world stays 1");
    assert_eq!(loc1(&s, 0, A), Some(p as u32));
    assert_eq!(loc1(&s, 1, A), None, "complete, but rank 1 holds no page");
    // A key first confirmed now has world 2.
    save(&s, 0, &[B]);
    assert!(!exists1(&s, B));
    save(&s, 1, &[B]);
    assert!(exists1(&s, B));
    // Once every binding is gone the key is forgotten; its next first confirm
    // fixes the world again.
    confirm_ok(&s, 0, &[], &[p]);
    assert!(!exists1(&s, A));
    save(&s, 0, &[A]);
    assert!(!exists1(&s, A), "world is 2 now");
}

#[test]
fn world_size_pinned() {
    let s = Store::new(StoreConfig { world_size: Some(2), ..cfg(None) });
    s.initialize(0, 8).unwrap();
    let p0 = save(&s, 0, &[A])[0];
    assert!(!exists1(&s, A), "pinned to 2 while one rank exists");
    s.initialize(1, 8).unwrap();
    s.initialize(2, 8).unwrap();
    let p1 = save(&s, 1, &[A])[0];
    assert!(exists1(&s, A), "pinned 2 of 3 initialized ranks");
    assert_eq!((loc1(&s, 0, A), loc1(&s, 1, A), loc1(&s, 2, A)), (Some(p0 as u32), Some(p1 as u32), None));
    // Any two ranks complete it.
    save(&s, 0, &[B]);
    save(&s, 2, &[B]);
    assert!(exists1(&s, B));

    let s = Store::new(StoreConfig { world_size: Some(1), ..cfg(None) });
    s.initialize(0, 8).unwrap();
    s.initialize(1, 8).unwrap();
    let p = save(&s, 1, &[A])[0];
    assert!(exists1(&s, A));
    assert_eq!((loc1(&s, 0, A), loc1(&s, 1, A)), (None, Some(p as u32)));
}

#[test]
fn exists_answers_per_key_in_order() {
    let s = store_with(None, &[8]);
    save(&s, 0, &[B, TEXT]);
    alloc1(&s, 0, A); // reserved, not confirmed: does not exist
    assert_eq!(exists(&s, &[A, B, TEXT, B, C, EMPTY]), vec![false, true, true, true, false, false]);
    assert!(exists(&s, &[]).is_empty());
    // No rank at all: still an answer.
    let empty = Store::new(cfg(None));
    assert_eq!(exists(&empty, &[A, B]), vec![false, false]);
}

#[test]
fn locations_answers_per_key_and_needs_the_rank() {
    let s = store_with(None, &[8]);
    let p = save(&s, 0, &[B, TEXT]);
    alloc1(&s, 0, A);
    assert_eq!(
        locations(&s, 0, &[A, B, TEXT, B, C]).unwrap(),
        vec![None, Some(p[0] as u32), Some(p[1] as u32), Some(p[0] as u32), None]
    );
    assert_eq!(locations(&s, 0, &[]).unwrap(), vec![]);
    for rank in [1, 8, -1, i64::MAX] {
        assert_eq!(locations(&s, rank, &[B]), Err(RankNotInitialized(rank)));
    }
}

// ===========================================================================
// POST /clear

#[test]
fn clear_forgets_ranks_and_keys() {
    let s = store_with(None, &[8, 8]);
    let p = save(&s, 0, &[A, B]);
    save(&s, 1, &[A, B]);
    let r = alloc1(&s, 0, C);
    s.clear();
    let st = s.audit().unwrap();
    assert!(st.ranks.is_empty());
    assert_eq!((st.keys, st.complete_keys), (0, 0));
    assert_eq!(exists(&s, &[A, B, C]), vec![false, false, false]);
    let mut out = Vec::new();
    assert_eq!(s.allocate(0, &[A], &mut out), Err(RankNotInitialized(0)));
    assert_eq!(locations(&s, 0, &[A]), Err(RankNotInitialized(0)));
    rejected(&s, 0, &[(C, r)], &[], ErrorCode::RankNotInitialized, None, None);
    // Workers must initialize again, and may pick another size.
    assert_eq!(s.initialize(0, 8), Ok(Initialized::Created));
    assert_eq!(free_res_bound(&s, 0), (8, 0, 0));
    assert_eq!(locations(&s, 0, &[A, B]).unwrap(), vec![None, None]);
    rejected(&s, 0, &[(A, p[0])], &[], ErrorCode::ConfirmUnallocated, Some(p[0]), Some(A));
    rejected(&s, 0, &[], &[p[1]], ErrorCode::ReleaseUnallocated, Some(p[1]), None);
    // The world size counts only ranks initialized since the clear.
    save(&s, 0, &[A]);
    assert!(exists1(&s, A), "one rank initialized since the clear: world 1");
    assert_eq!(s.initialize(1, 3), Ok(Initialized::Created), "another size after a clear");
    assert_eq!(free_res_bound(&s, 1), (3, 0, 0));
    s.clear();
    s.clear();
    assert!(s.audit().unwrap().ranks.is_empty());
}

// ===========================================================================
// Reservation expiry (the server's sweeper calls tick(); here, a fake clock)

#[test]
fn reservation_survives_ttl_ticks_and_expires_after_one_more() {
    let s = store_with(None, &[64, 64]);
    // Repeat across the 8-bit epoch wrap.
    for round in 0..70u64 {
        let p = alloc1(&s, 0, A);
        for t in 0..TICKS_PER_TTL {
            assert_eq!(s.tick(), 0, "round {round}: tick {t} of the TTL");
            assert_eq!(free_res_bound(&s, 0), (63, 1, 0));
        }
        assert_eq!(s.tick(), 1, "round {round}: TTL + 1 ticks");
        assert_eq!(free_res_bound(&s, 0), (64, 0, 0));
        assert_eq!(s.stats().expired, round + 1);
        rejected(&s, 0, &[(A, p)], &[], ErrorCode::ConfirmUnallocated, Some(p), Some(A));
        rejected(&s, 0, &[], &[p], ErrorCode::ReleaseUnallocated, Some(p), None);
    }
    assert!(s.epoch() > 256);
}

#[test]
fn reservation_confirmed_within_ttl_is_kept() {
    let s = store_with(None, &[64]);
    let p = alloc(&s, 0, &[A, B]);
    for _ in 0..TICKS_PER_TTL {
        s.tick();
    }
    assert_eq!(confirm_ok(&s, 0, &[(A, p[0])], &[]), outcome(1, 0, 0, 0));
    assert_eq!(s.tick(), 1, "only B's reservation expires");
    assert_eq!(free_res_bound(&s, 0), (63, 0, 1));
    assert_eq!(loc1(&s, 0, A), Some(p[0] as u32));
    rejected(&s, 0, &[(B, p[1])], &[], ErrorCode::ConfirmUnallocated, Some(p[1]), Some(B));
}

#[test]
fn bound_pages_never_expire() {
    let s = store_with(None, &[64]);
    let p = save(&s, 0, &[A, TEXT]);
    for _ in 0..600 {
        assert_eq!(s.tick(), 0);
    }
    assert_eq!(locations(&s, 0, &[A, TEXT]).unwrap(), vec![Some(p[0] as u32), Some(p[1] as u32)]);
    assert_eq!(free_res_bound(&s, 0), (62, 0, 2));
    assert_eq!(s.stats().expired, 0);
    assert_eq!(confirm_ok(&s, 0, &[(A, p[0]), (TEXT, p[1])], &[]), outcome(0, 2, 0, 0));
}

#[test]
fn expiry_is_never_early() {
    // However reservations share state words, none is freed before
    // TICKS_PER_TTL + 1 ticks, and all are once TICKS_PER_TTL + 1 ticks have
    // passed since the newest.
    let s = store_with(None, &[32]);
    let mut born: Vec<(i64, u32)> = Vec::new();
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    for (i, k) in keys.iter().enumerate() {
        born.push((alloc1(&s, 0, k), s.epoch()));
        if i % 2 == 0 {
            s.tick();
        }
        let c = free_res_bound(&s, 0);
        let young = born.iter().filter(|&&(_, e)| s.epoch() - e <= TICKS_PER_TTL).count() as u64;
        assert!(c.1 >= young, "step {i}: {} reserved, {young} are young", c.1);
    }
    for _ in 0..=TICKS_PER_TTL {
        s.tick();
    }
    assert_eq!(free_res_bound(&s, 0), (32, 0, 0));
    s.audit().unwrap();
}

#[test]
fn tick_after_clear_and_on_empty_store() {
    let s = Store::new(cfg(None));
    assert_eq!(s.tick(), 0);
    s.initialize(0, 8).unwrap();
    alloc1(&s, 0, A);
    s.clear();
    s.initialize(0, 8).unwrap();
    for _ in 0..=TICKS_PER_TTL {
        assert_eq!(s.tick(), 0, "the cleared generation's reservation is gone with it");
    }
    assert_eq!(free_res_bound(&s, 0), (8, 0, 0));
}

// ===========================================================================
// Statistics

#[test]
fn stats_count_keys_and_pages() {
    let s = store_with(None, &[10, 20]);
    save(&s, 0, &[A, B, C]);
    save(&s, 1, &[A]);
    alloc(&s, 1, &[D, E]);
    let st = s.audit().unwrap();
    assert_eq!((st.keys, st.complete_keys), (3, 1));
    assert_eq!(st.ranks.iter().map(|r| (r.rank, r.num_pages)).collect::<Vec<_>>(), vec![(0, 10), (1, 20)]);
    assert_eq!(free_res_bound(&s, 0), (7, 0, 3));
    assert_eq!(free_res_bound(&s, 1), (17, 2, 1));
}

/// `StoreConfig` is public and accepts `world_size: Some(0)` (the CLI refuses
/// 0, the core does not): a new key's entry is then "complete" before its
/// first binding, so `bind` counts no transition and the complete counter
/// drifts from the index. Latent through the server, real for library users.
#[test]

fn world_size_zero_keeps_counters_consistent() {
    let s = Store::new(StoreConfig { world_size: Some(0), ..cfg(None) });
    s.initialize(0, 8).unwrap();
    let p = save(&s, 0, &[A])[0];
    s.audit().unwrap();
    confirm_ok(&s, 0, &[], &[p]);
    s.audit().unwrap();
}
