//! Loom models of a tenant's quota admission ([`AdmissionWord`],
//! `core/src/admission.rs`) on the real [`Store`]: its reservation and key
//! counters ([`Store::reserved_and_keys`]), its allocate and its confirm.
//! The check is the one http's `Tenant::admit_keys` makes for `max_keys`:
//! reserved pages + stored keys + pending keys + the batch ≤ the quota.
//! Each model asserts that no two allocates pass a quota of one key, and
//! that the store never holds more keys than the quota.

use crate::harness::{allocate, audit_store, check_orders, confirm, store, Actor, Check, Out, KA, KB};
use hf3fs_meta_core::{AdmissionWord, Store};
use loom::sync::Arc;

/// The quota of these models.
const MAX_KEYS: u64 = 1;

/// One allocate of `key` under the quota: admitted (the check on the
/// store's counts), allocated while admitted, the admission dropped, then
/// confirmed. Whether it was admitted.
fn admitted_write(s: &Store, w: &AdmissionWord, key: &str) -> Out {
    let admission = w.admit(1, |pending| {
        let (reserved, keys) = s.reserved_and_keys();
        if reserved + keys + pending.min(MAX_KEYS + 1) + 1 > MAX_KEYS {
            Err(())
        } else {
            Ok(())
        }
    });
    let Ok(admission) = admission else { return Out::Admitted(false) };
    let (page, o) = allocate(s, 0, key);
    assert_eq!((o.reserved, o.refused), (1, 0), "two pages: an admitted allocate always gets one");
    drop(admission);
    confirm(s, 0, key, page as u32).expect("its own reservation");
    Out::Admitted(true)
}

/// (q1) Two allocates of different keys under `max_keys = 1`, each
/// admitted, allocated, ended and confirmed, in every interleaving: one at
/// most is admitted, and the store ends with at most one key. (loom 0.7's
/// DPOR does not reach the interleaving where both checks run before
/// either admission's RMW: with the CAS replaced by a plain add this model
/// still passes; `core/src/admission.rs`'s unit tests run that
/// interleaving deterministically.)
#[test]
fn q1_two_allocates_never_both_pass_a_quota_of_one() {
    check_orders("q1_two_allocates_never_both_pass_a_quota_of_one", 3, 2, || {
        let s = Arc::new(store(1, 2, 0));
        let w = Arc::new(AdmissionWord::default());
        let (sa, sb, wa, wb) = (s.clone(), s.clone(), w.clone(), w.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || admitted_write(&sa, &wa, KA)), Box::new(move || admitted_write(&sb, &wb, KB))];
        let check: Check = Box::new(move |outs| {
            let admitted = outs.iter().filter(|o| **o == Out::Admitted(true)).count();
            assert_eq!(admitted, 1, "exactly one: the first to check always fits, the other never: {outs:?}");
            let stats = audit_store(&s);
            assert_eq!(stats.keys, 1);
            assert_eq!(w.pending(), 0);
        });
        (actors, check)
    });
}

/// (q2) A reservation made and ended before the model (KA's allocate, its
/// admission dropped) is confirmed while another allocate checks: the
/// check reads the reservation counter before the key counter, and the
/// confirm counts the key before it ends the reservation, so the check
/// sees KA in one or the other (or both) in every interleaving and
/// refuses.
#[test]
fn q2_a_confirm_moves_a_reservation_into_the_keys_without_a_gap() {
    check_orders("q2_a_confirm_moves_a_reservation_into_the_keys_without_a_gap", 3, 2, || {
        let s = Arc::new(store(1, 2, 0));
        let w = Arc::new(AdmissionWord::default());
        let (page, _) = allocate(&s, 0, KA);
        let (sa, sb, wb) = (s.clone(), s.clone(), w.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Confirm(confirm(&sa, 0, KA, page as u32))),
            Box::new(move || admitted_write(&sb, &wb, KB)),
        ];
        let check: Check = Box::new(move |outs| {
            assert!(matches!(outs[0], Out::Confirm(Ok(_))), "{outs:?}");
            assert_eq!(outs[1], Out::Admitted(false), "KA's reservation or key is always seen");
            assert_eq!(audit_store(&s).keys, 1);
        });
        (actors, check)
    });
}
