//! Per-key linearizability of bind, release and read (Wing & Gong's search
//! with Lowe's memoization): find an order of the key's operations that
//! respects real time and explains every acknowledged answer with the
//! model below.
//!
//! A key's state is one `Option<page>` per rank of its world. `Bind(r, p)`
//! binds rank `r` to `p` unless it is bound already (the key keeps its first
//! page, as `confirm_write` does); `Unbind(r, p)` frees it if bound to `p`;
//! `Exists(b)` answers whether every rank is bound; `Locate(r, v)` answers
//! rank `r`'s page when the key is complete, else none; `Stored(r, p)` (an
//! allocate's answer) is `p` when rank `r` is bound, anything otherwise.
//!
//! An `ok` operation takes effect once between its invocation and its
//! completion; an `info` one at any time after its invocation, or never; a
//! `fail` one never (it is not given to the checker).
//!
//! In eviction runs a key may also be evicted at any moment: every rank
//! unbound in one step, as readers see it. The model allows that step
//! between any two operations (it ignores read leases, which the `lease`
//! checker holds the pages to), so what stays forbidden is a read that
//! no binding of the key's own explains: another page, or a key reported
//! complete with a rank it never had.

use std::collections::HashSet;

/// What one operation did to, or saw of, one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A confirm of page `.1` on rank `.0`.
    Bind(u32, i64),
    /// A release of page `.1` on rank `.0`.
    Unbind(u32, i64),
    /// An exists answer.
    Exists(bool),
    /// A location answer on a rank.
    Locate(u32, Option<i64>),
    /// An allocate's page on a rank.
    Stored(u32, i64),
}

/// One operation on a key: its interval (`complete: None` for `info`) and
/// its event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyOp {
    /// Index into the history (for the report).
    pub id: u64,
    /// When it was sent.
    pub invoke: u64,
    /// When it was acknowledged; `None`: it may take effect any time after
    /// `invoke`, or never.
    pub complete: Option<u64>,
    /// What it did.
    pub event: Event,
}

/// The most operations of one key the search takes (a bit mask of them).
pub(crate) const MAX_OPS: usize = 64;

type State = Vec<Option<i64>>;

/// Applies `e` to `s`: the next state, or `None` if `e`'s answer is not the
/// model's.
fn step(s: &State, e: Event) -> Option<State> {
    let complete = s.iter().all(Option::is_some);
    match e {
        Event::Bind(r, p) => {
            let mut n = s.clone();
            let slot = n.get_mut(r as usize)?;
            if slot.is_none() {
                *slot = Some(p);
            }
            Some(n)
        }
        Event::Unbind(r, p) => {
            let mut n = s.clone();
            let slot = n.get_mut(r as usize)?;
            if *slot == Some(p) {
                *slot = None;
            }
            Some(n)
        }
        Event::Exists(b) => (b == complete).then(|| s.clone()),
        Event::Locate(r, v) => {
            let want = if complete { *s.get(r as usize)? } else { None };
            (v == want).then(|| s.clone())
        }
        Event::Stored(r, p) => match s.get(r as usize)? {
            Some(q) if *q != p => None,
            _ => Some(s.clone()),
        },
    }
}

/// Whether `ops` (of one key whose world has `world` ranks, starting
/// unbound; evicted at any moment when `evictable`) are linearizable;
/// `Err` when there are too many to search.
pub(crate) fn linearizable(world: u32, ops: &[KeyOp], evictable: bool) -> Result<bool, String> {
    if ops.len() > MAX_OPS {
        return Err(format!("{} operations on one key (the search takes at most {MAX_OPS})", ops.len()));
    }
    let must: u64 = ops.iter().enumerate().filter(|(_, o)| o.complete.is_some()).fold(0, |m, (i, _)| m | (1 << i));
    let mut seen: HashSet<(u64, State)> = HashSet::new();
    Ok(search(ops, must, evictable, 0, vec![None; world as usize], &mut seen))
}

fn search(ops: &[KeyOp], must: u64, evictable: bool, done: u64, s: State, seen: &mut HashSet<(u64, State)>) -> bool {
    if done & must == must {
        return true;
    }
    if !seen.insert((done, s.clone())) {
        return false;
    }
    // The earliest completion among the ok operations not yet placed: no
    // operation invoked after it may come before it.
    let horizon = ops
        .iter()
        .enumerate()
        .filter(|(i, _)| done & (1 << i) == 0)
        .filter_map(|(_, o)| o.complete)
        .min()
        .unwrap_or(u64::MAX);
    for (i, o) in ops.iter().enumerate() {
        if done & (1 << i) != 0 || o.invoke > horizon {
            continue;
        }
        if let Some(n) = step(&s, o.event) {
            if search(ops, must, evictable, done | (1 << i), n, seen) {
                return true;
            }
        }
    }
    // The eviction of the whole key, between this operation and the next.
    evictable && s.iter().any(Option::is_some) && search(ops, must, evictable, done, vec![None; s.len()], seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(id: u64, invoke: u64, complete: u64, event: Event) -> KeyOp {
        KeyOp { id, invoke, complete: Some(complete), event }
    }
    fn info(id: u64, invoke: u64, event: Event) -> KeyOp {
        KeyOp { id, invoke, complete: None, event }
    }

    #[test]
    fn a_save_then_loads_is_linearizable() {
        let ops = [
            ok(0, 0, 10, Event::Bind(0, 7)),
            ok(1, 11, 20, Event::Bind(1, 3)),
            ok(2, 21, 30, Event::Exists(true)),
            ok(3, 21, 30, Event::Locate(1, Some(3))),
        ];
        assert_eq!(linearizable(2, &ops, false), Ok(true));
    }

    #[test]
    fn a_read_concurrent_with_the_last_bind_may_see_either() {
        let ops = [
            ok(0, 0, 10, Event::Bind(0, 7)),
            ok(1, 11, 20, Event::Bind(1, 3)),
            ok(2, 12, 13, Event::Exists(false)),
            ok(3, 14, 19, Event::Exists(true)),
        ];
        assert_eq!(linearizable(2, &ops, false), Ok(true));
    }

    #[test]
    fn a_lost_bind_is_not_linearizable() {
        // Acknowledged on both ranks, then read back as absent.
        let ops =
            [ok(0, 0, 10, Event::Bind(0, 7)), ok(1, 11, 20, Event::Bind(1, 3)), ok(2, 30, 40, Event::Locate(0, None))];
        assert_eq!(linearizable(2, &ops, false), Ok(false));
    }

    #[test]
    fn a_read_of_the_wrong_page_is_not_linearizable() {
        let ops = [ok(0, 0, 10, Event::Bind(0, 7)), ok(1, 30, 40, Event::Locate(0, Some(8)))];
        assert_eq!(linearizable(1, &ops, false), Ok(false));
    }

    #[test]
    fn an_info_bind_may_take_effect_late_or_never() {
        let late =
            [info(0, 0, Event::Bind(0, 7)), ok(1, 5, 6, Event::Exists(false)), ok(2, 50, 60, Event::Exists(true))];
        assert_eq!(linearizable(1, &late, false), Ok(true));
        let never = [info(0, 0, Event::Bind(0, 7)), ok(1, 50, 60, Event::Exists(false))];
        assert_eq!(linearizable(1, &never, false), Ok(true));
    }

    #[test]
    fn an_info_bind_cannot_take_effect_before_it_was_sent() {
        let ops = [ok(0, 0, 5, Event::Exists(true)), info(1, 10, Event::Bind(0, 7))];
        assert_eq!(linearizable(1, &ops, false), Ok(false));
    }

    #[test]
    fn a_bound_key_keeps_its_first_page_and_a_release_unbinds_it() {
        let keeps = [
            ok(0, 0, 1, Event::Bind(0, 7)),
            ok(1, 2, 3, Event::Bind(0, 9)),
            ok(2, 4, 5, Event::Locate(0, Some(7))),
            ok(3, 4, 5, Event::Stored(0, 7)),
        ];
        assert_eq!(linearizable(1, &keeps, false), Ok(true));
        let released =
            [ok(0, 0, 1, Event::Bind(0, 7)), ok(1, 2, 3, Event::Unbind(0, 7)), ok(2, 4, 5, Event::Exists(true))];
        assert_eq!(linearizable(1, &released, false), Ok(false));
        let stored_elsewhere = [ok(0, 0, 1, Event::Bind(0, 7)), ok(1, 2, 3, Event::Stored(0, 8))];
        assert_eq!(linearizable(1, &stored_elsewhere, false), Ok(false));
    }

    #[test]
    fn too_many_operations_are_refused_not_guessed() {
        let ops: Vec<KeyOp> = (0..65).map(|i| ok(i, i, i + 1, Event::Exists(false))).collect();
        assert!(linearizable(1, &ops, false).is_err());
    }

    #[test]
    fn an_evicted_key_may_vanish_but_never_read_another_page() {
        let ops = [
            ok(0, 0, 10, Event::Bind(0, 7)),
            ok(1, 11, 20, Event::Locate(0, Some(7))),
            ok(2, 21, 30, Event::Exists(false)),
            ok(3, 31, 40, Event::Locate(0, None)),
        ];
        assert_eq!(linearizable(1, &ops, false), Ok(false), "without eviction the key cannot vanish");
        assert_eq!(linearizable(1, &ops, true), Ok(true));
        // Evicted, it is gone: a later read of its page is not explained.
        let back = [
            ok(0, 0, 10, Event::Bind(0, 7)),
            ok(1, 11, 20, Event::Exists(false)),
            ok(2, 21, 30, Event::Locate(0, Some(7))),
        ];
        assert_eq!(linearizable(1, &back, true), Ok(false));
        let wrong = [ok(0, 0, 10, Event::Bind(0, 7)), ok(1, 11, 20, Event::Locate(0, Some(8)))];
        assert_eq!(linearizable(1, &wrong, true), Ok(false));
    }
}
