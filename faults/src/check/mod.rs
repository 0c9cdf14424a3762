//! The checkers, over a run's whole history. Each returns its findings; a
//! run passes when none of them found anything.
//!
//! - [`lost`]: no acknowledged confirm lost, read back after the heal with
//!   each key's completeness rule (`get_locations` on every rank of a
//!   complete key, a re-save's answer on each acknowledged rank of an
//!   incomplete one);
//! - [`pages`]: no page bound to two keys, no read answered with (and no
//!   allocate handing out) a page another key was bound to;
//! - [`split_brain`]: no 2xx from an epoch older than one that had already
//!   answered a 2xx;
//! - [`linearizable`]: per key, bind, release and read ([`linear`]);
//! - [`liveness`]: a serving leader and an acknowledged write within a
//!   bound after the heal, and no window longer than the nemesis allows
//!   without an acknowledged write.
//!
//! The workload never unbinds a key it confirmed (it releases only pages
//! whose write it abandoned before any confirm), so, while eviction cannot
//! fire (its ranks have 2^20 pages), a binding observed once holds for the
//! rest of the run.
//!
//! Power-cut runs ([`power`]) hold `lost`, `pages` and `linearizable` as
//! they are wherever the promise of `--fsync always` (or a synchronous
//! standby that was not cut) covers every acknowledged confirm; where the
//! promise is `batch`'s, a loss is allowed only of a confirm acknowledged
//! after the last fsync of its store's journal before the cut (what the
//! forgetful file system stamped), and that key is excused from `pages`
//! and `linearizable` (its page may go to another key after the recovery;
//! what the readers saw of it before the cut was true then). How long
//! before the cut the oldest lost one was acknowledged is measured.
//!
//! Eviction runs (`--eviction`: small ranks, a 2 s read lease) may drop any
//! key that is not leased, so `lost` and `pages` do not apply to them; they
//! are checked by [`lease`] (no page of a read handed to another key within
//! the read's lease), [`split_brain`], [`linearizable`] with evictions
//! allowed at any moment, and [`evictions_seen`] (the run evicted at all).

pub(crate) mod linear;

use crate::history::{Call, Dialect, Op, Outcome};
use linear::{Event, KeyOp};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Keys a checker leaves out: (dialect, key).
pub(crate) type Excused = HashSet<(Dialect, String)>;

/// The syncer's period under `--fsync batch` (docs/durability.md: the
/// window a power cut loses while the syncer runs on time), for the
/// report's count of losses acknowledged within it.
pub(crate) const BATCH_PERIOD_US: u64 = 5_000;

/// One violation: the check, what it saw, and the history ops that show it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct Finding {
    /// The checker's name.
    pub check: &'static str,
    /// What it found.
    pub what: String,
    /// The ops (history ids) that show it.
    pub ops: Vec<u64>,
}

fn finding(check: &'static str, what: String, ops: Vec<u64>) -> Finding {
    Finding { check, what, ops }
}

/// The world of a key of `dialect` (SGLang's space is one rank).
fn world_of(dialect: Dialect, world: u32) -> u32 {
    match dialect {
        Dialect::Vllm => world,
        Dialect::Sglang => 1,
    }
}

/// Runs every safety checker (all but liveness) over `history`; in an
/// eviction run (`lease_us`: the read lease), those that hold with eviction.
pub(crate) fn safety(history: &[Op], world: u32, lease_us: Option<u64>) -> Vec<Finding> {
    let mut f = Vec::new();
    match lease_us {
        None => {
            f.extend(lost(history, world));
            f.extend(pages(history, &Excused::new()));
        }
        Some(l) => {
            f.extend(lease(history, l));
            if evictions_seen(history, world) == 0 {
                f.push(finding(
                    "lease",
                    "no complete key was ever read back absent: nothing was evicted".into(),
                    vec![],
                ));
            }
        }
    }
    f.extend(split_brain(history));
    f.extend(linearizable(history, world, lease_us.is_some(), &Excused::new()));
    f
}

/// A power cut, for [`power`]: when, and what it may lose.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PowerCut {
    /// When the unsynced data was dropped (µs from the run's start).
    pub cut_us: u64,
    /// Whether anything acknowledged may be lost (`batch` on the node that
    /// held it).
    pub may_lose: bool,
    /// When each store's journal (vLLM's, SGLang's) was last synced before
    /// the cut (µs; `None`: never): what was acknowledged before is on disk.
    pub synced_us: [Option<u64>; 2],
}

/// What a power cut lost, as the history shows it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct PowerFigures {
    /// When the cut was (µs from the run's start).
    pub cut_us: u64,
    /// Whether nothing acknowledged could be lost (the promise of `always`,
    /// or of a standby that kept it in memory).
    pub strict: bool,
    /// Confirms (key × rank) acknowledged before the cut.
    pub acked_before: u64,
    /// Acknowledged confirms (key × rank) lost…
    pub lost: u64,
    /// …of which acknowledged after their journal's last fsync (allowed
    /// where the cut may lose anything)…
    #[serde(default)]
    pub after_last_sync: u64,
    /// …and of which acknowledged within the syncer's period before the
    /// cut ([`BATCH_PERIOD_US`]).
    #[serde(default)]
    pub within_period: u64,
    /// The oldest lost acknowledgement's age at the cut, ms (at least: from
    /// its answer's arrival at the client; 0 for one answered after the cut).
    pub oldest_lost_ms: Option<f64>,
}

/// The safety checkers of a power-cut run: [`lost`] and, outside the
/// allowed losses, [`pages`], [`split_brain`] and [`linearizable`]. Where
/// the cut may lose anything, a lost confirm is allowed when it was sent
/// before the cut and answered after its store's journal was last synced
/// (an answer of `batch` follows the write, so a sync applied after the
/// answer holds it); its key is then excused from `pages` and
/// `linearizable`, every other key held to them whole.
pub(crate) fn power(history: &[Op], world: u32, cut: PowerCut) -> (Vec<Finding>, PowerFigures) {
    let by_id: HashMap<u64, &Op> = history.iter().map(|o| (o.id, o)).collect();
    let mut fig = PowerFigures { cut_us: cut.cut_us, strict: !cut.may_lose, ..PowerFigures::default() };
    fig.acked_before = acknowledged(history)
        .values()
        .flat_map(|r| r.values())
        .filter(|(_, by)| by_id.get(by).is_some_and(|o| o.complete_us <= cut.cut_us))
        .count() as u64;
    let mut out = Vec::new();
    let mut excused = Excused::new();
    for l in losses(history, world, cut.may_lose) {
        let Some(op) = by_id.get(&l.by) else { continue };
        let age = cut.cut_us.saturating_sub(op.complete_us);
        fig.lost += 1;
        fig.oldest_lost_ms = Some(fig.oldest_lost_ms.unwrap_or(0.0).max(age as f64 / 1000.0));
        if age <= BATCH_PERIOD_US {
            fig.within_period += 1;
        }
        let synced = cut.synced_us[l.dialect as usize];
        let after_sync = synced.is_none_or(|s| op.complete_us > s);
        if after_sync {
            fig.after_last_sync += 1;
        }
        if cut.may_lose && after_sync && op.invoke_us < cut.cut_us {
            excused.insert((l.dialect, l.key.clone()));
            continue;
        }
        let mut f = l.finding();
        f.what += &if op.invoke_us >= cut.cut_us {
            format!(" (acknowledged {:.1} ms after the cut)", (op.complete_us - cut.cut_us) as f64 / 1000.0)
        } else {
            let s = synced.map_or("never".into(), |s| {
                format!("{:.1} ms before it", cut.cut_us.saturating_sub(s) as f64 / 1000.0)
            });
            format!(" (acknowledged {:.1} ms before the cut; its journal last synced {s})", age as f64 / 1000.0)
        };
        out.push(f);
    }
    out.extend(pages(history, &excused));
    out.extend(split_brain(history));
    out.extend(linearizable(history, world, false, &excused));
    (out, fig)
}

/// Keys acknowledged on every rank of their world that a later read found
/// absent: in an eviction run, the keys seen evicted.
pub(crate) fn evictions_seen(history: &[Op], world: u32) -> usize {
    // (dialect, key) → rank → when its first acknowledged confirm completed.
    let mut bound: HashMap<(Dialect, &str), BTreeMap<u32, u64>> = HashMap::new();
    for op in history.iter().filter(|o| o.ok()) {
        if let Call::Confirm { dialect, rank, pairs, .. } = &op.call {
            for (k, _) in pairs {
                let t = bound.entry((*dialect, k.as_str())).or_default().entry(*rank).or_insert(op.complete_us);
                *t = (*t).min(op.complete_us);
            }
        }
    }
    let mut gone: std::collections::BTreeSet<(Dialect, &str)> = std::collections::BTreeSet::new();
    for op in history.iter().filter(|o| o.ok()) {
        if let Call::Locations { dialect, keys, pages, .. } = &op.call {
            for (k, p) in keys.iter().zip(pages) {
                // Complete before this read was sent.
                let complete = bound.get(&(*dialect, k.as_str())).is_some_and(|r| {
                    r.len() as u32 == world_of(*dialect, world) && r.values().all(|&t| t < op.invoke_us)
                });
                if p.is_none() && complete {
                    gone.insert((*dialect, k));
                }
            }
        }
    }
    gone.len()
}

/// The read-lease rule: a page that a read answered for a key is handed to
/// no other key while the lease that read started lasts. The lease runs
/// `lease_us` from when the read's answer was built, which is after it was
/// sent; so an operation that claims the page for another key (an
/// allocate's answer, a confirm, a read's answer) broke the lease for sure
/// when it was sent after the read's answer arrived and was answered before
/// the read was sent plus `lease_us`.
pub(crate) fn lease(history: &[Op], lease_us: u64) -> Vec<Finding> {
    type Page = (Dialect, u32, i64);
    let mut claims: Vec<(Page, &String, &Op)> = Vec::new();
    for op in history.iter().filter(|o| o.ok()) {
        match &op.call {
            Call::Confirm { dialect, rank, pairs, .. } => {
                claims.extend(pairs.iter().map(|(k, p)| ((*dialect, *rank, *p), k, op)));
            }
            Call::Locations { dialect, rank, keys, pages } => {
                claims.extend(keys.iter().zip(pages).filter_map(|(k, p)| p.map(|p| ((*dialect, *rank, p), k, op))))
            }
            Call::Allocate { dialect, rank, keys, pages } => claims
                .extend(keys.iter().zip(pages).filter(|(_, p)| **p >= 0).map(|(k, p)| ((*dialect, *rank, *p), k, op))),
            Call::Exists { .. } => {}
        }
    }
    let mut reads: HashMap<Page, Vec<(&String, &Op)>> = HashMap::new();
    for (page, k, op) in &claims {
        if matches!(op.call, Call::Locations { .. }) {
            reads.entry(*page).or_default().push((k, op));
        }
    }
    let mut out = Vec::new();
    for (page, k, op) in &claims {
        let Some(rs) = reads.get(page) else { continue };
        if let Some((rk, r)) = rs
            .iter()
            .find(|(rk, r)| rk != k && op.invoke_us >= r.complete_us && op.complete_us < r.invoke_us + lease_us)
        {
            let (d, rank, p) = page;
            out.push(finding(
                "lease",
                format!(
                    "{d:?} rank {rank} page {p}: read for {rk} at {:.3} s, then {} for {k} at {:.3} s, within the {:.1} s lease",
                    r.invoke_us as f64 / 1e6,
                    op.call.name(),
                    op.complete_us as f64 / 1e6,
                    lease_us as f64 / 1e6
                ),
                vec![r.id, op.id],
            ));
        }
    }
    out
}

/// Acknowledged confirms: (dialect, key) → rank → (page, op id).
fn acknowledged(history: &[Op]) -> BTreeMap<(Dialect, String), BTreeMap<u32, (i64, u64)>> {
    let mut acked: BTreeMap<(Dialect, String), BTreeMap<u32, (i64, u64)>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.ok() && !o.final_read) {
        if let Call::Confirm { dialect, rank, pairs, .. } = &op.call {
            for (k, p) in pairs {
                acked.entry((*dialect, k.clone())).or_default().entry(*rank).or_insert((*p, op.id));
            }
        }
    }
    acked
}

/// One acknowledged confirm the final read-back did not find.
struct Loss {
    dialect: Dialect,
    key: String,
    rank: u32,
    page: i64,
    /// The op that acknowledged it.
    by: u64,
    /// What the read-back answered, and its op (`None`: no final answer).
    seen: Option<(Option<i64>, u64)>,
}

impl Loss {
    fn finding(&self) -> Finding {
        let (d, k, r, p) = (self.dialect, &self.key, self.rank, self.page);
        match self.seen {
            Some((got, id)) => finding(
                "lost",
                format!("{d:?} key {k} rank {r}: acknowledged on page {p}, read back as {got:?}"),
                vec![self.by, id],
            ),
            None => finding(
                "lost",
                format!("{d:?} key {k} rank {r}: acknowledged on page {p}, never read back (no final answer)"),
                vec![self.by],
            ),
        }
    }
}

/// No acknowledged confirm lost: every acknowledged (key, rank, page) is
/// read back after the heal, through `get_locations` when the key was
/// acknowledged on every rank of its world, else through a re-save
/// (allocate) of the key on that rank, whose answer is the stored page.
pub(crate) fn lost(history: &[Op], world: u32) -> Vec<Finding> {
    losses(history, world, false).iter().map(Loss::finding).collect()
}

/// The acknowledged confirms [`lost`] reports. With `per_rank`, a complete
/// key `get_locations` found missing (it answers null for a key missing on
/// any rank) is judged rank by rank by the re-saves the read-back then
/// sent: where a power cut may lose one rank's confirm and keep another's.
/// Only there: a re-save's answer cannot tell a stored page from a
/// reservation of the same page that outlived its lost confirm.
fn losses(history: &[Op], world: u32, per_rank: bool) -> Vec<Loss> {
    // What the final read-back saw: (dialect, key, rank) → (answer, op).
    let mut located: HashMap<(Dialect, &str, u32), (Option<i64>, u64)> = HashMap::new();
    let mut stored: HashMap<(Dialect, &str, u32), (i64, u64)> = HashMap::new();
    for op in history.iter().filter(|o| o.final_read && o.ok()) {
        match &op.call {
            Call::Locations { dialect, rank, keys, pages } => {
                for (k, p) in keys.iter().zip(pages) {
                    located.insert((*dialect, k, *rank), (*p, op.id));
                }
            }
            Call::Allocate { dialect, rank, keys, pages } => {
                for (k, p) in keys.iter().zip(pages) {
                    stored.insert((*dialect, k, *rank), (*p, op.id));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for ((dialect, key), ranks) in acknowledged(history) {
        let complete = ranks.len() as u32 == world_of(dialect, world);
        for (rank, (page, by)) in ranks {
            let seen = if complete {
                // A null of get_locations says the key is missing on some
                // rank; with `per_rank`, the re-save the read-back then
                // sent says whether this one kept it.
                let re_saved = stored.get(&(dialect, key.as_str(), rank)).map(|&(p, id)| (Some(p), id));
                match located.get(&(dialect, key.as_str(), rank)).copied() {
                    Some((None, _)) if per_rank && re_saved.is_some() => re_saved,
                    l => l,
                }
            } else {
                stored.get(&(dialect, key.as_str(), rank)).map(|&(p, id)| (Some(p), id))
            };
            if !matches!(seen, Some((Some(p), _)) if p == page) {
                out.push(Loss { dialect, key: key.clone(), rank, page, by, seen });
            }
        }
    }
    out
}

/// No page bound to two keys, no read answered with a page another key was
/// bound to, no allocate handing out a page bound to another key once that
/// binding was known; the `excused` keys left out (a power cut's allowed
/// losses, [`power`]).
pub(crate) fn pages(history: &[Op], excused: &Excused) -> Vec<Finding> {
    let skip = |d: Dialect, k: &String| excused.contains(&(d, k.clone()));
    // (dialect, rank, page) → (key, op, completion) of its first binding seen.
    let mut bound: HashMap<(Dialect, u32, i64), (String, u64, u64)> = HashMap::new();
    let mut out = Vec::new();
    let mut ok: Vec<&Op> = history.iter().filter(|o| o.ok()).collect();
    ok.sort_by_key(|o| o.complete_us);
    for op in &ok {
        let claims: Vec<(Dialect, u32, &String, i64)> = match &op.call {
            Call::Confirm { dialect, rank, pairs, .. } => pairs.iter().map(|(k, p)| (*dialect, *rank, k, *p)).collect(),
            Call::Locations { dialect, rank, keys, pages } => {
                keys.iter().zip(pages).filter_map(|(k, p)| p.map(|p| (*dialect, *rank, k, p))).collect()
            }
            _ => continue,
        };
        for (d, r, k, p) in claims {
            if skip(d, k) {
                continue;
            }
            match bound.get(&(d, r, p)) {
                Some((other, by, _)) if other != k => out.push(finding(
                    "pages",
                    format!("{d:?} rank {r} page {p}: bound to {other}, then answered for {k} ({})", op.call.name()),
                    vec![*by, op.id],
                )),
                Some(_) => {}
                None => {
                    bound.insert((d, r, p), (k.clone(), op.id, op.complete_us));
                }
            }
        }
    }
    for op in &ok {
        if let Call::Allocate { dialect, rank, keys, pages } = &op.call {
            for (k, &p) in keys.iter().zip(pages).filter(|(k, _)| !skip(*dialect, k)) {
                if let Some((other, by, when)) = bound.get(&(*dialect, *rank, p)) {
                    if other != k && *when < op.invoke_us {
                        out.push(finding(
                            "pages",
                            format!("{dialect:?} rank {rank} page {p}: bound to {other}, then handed out to {k}"),
                            vec![*by, op.id],
                        ));
                    }
                }
            }
        }
    }
    out
}

/// No 2xx from an epoch older than one that had already answered a 2xx:
/// an ok op of epoch `e` sent after an ok op of a later epoch completed.
/// The finding gives the overlap: how long after the newer epoch's answer
/// the older one still answered (at least).
pub(crate) fn split_brain(history: &[Op]) -> Vec<Finding> {
    let mut answered: Vec<(u64, u64, u64)> =
        history.iter().filter(|o| o.ok()).filter_map(|o| o.epoch.map(|e| (o.complete_us, e, o.id))).collect();
    answered.sort();
    // Prefix maxima: by each completion time, the newest epoch that had answered.
    let mut newest: Vec<(u64, u64, u64)> = Vec::with_capacity(answered.len());
    let mut cur: Option<(u64, u64)> = None;
    for &(t, e, id) in &answered {
        if cur.is_none_or(|(me, _)| e > me) {
            cur = Some((e, id));
        }
        let (me, by) = cur.unwrap_or((e, id));
        newest.push((t, me, by));
    }
    let mut worst: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    for o in history.iter().filter(|o| o.ok()) {
        let Some(e) = o.epoch else { continue };
        let i = newest.partition_point(|&(t, _, _)| t < o.invoke_us);
        if i == 0 {
            continue;
        }
        let (_, me, by) = newest[i - 1];
        if me > e {
            // The first completion of an epoch above e: the overlap starts there.
            let since = answered.iter().find(|&&(_, ae, _)| ae > e).map_or(0, |a| a.0);
            let overlap = o.complete_us.saturating_sub(since);
            let w = worst.entry(e).or_insert((0, by, o.id));
            if overlap >= w.0 {
                *w = (overlap, by, o.id);
            }
        }
    }
    worst
        .into_iter()
        .map(|(e, (overlap, by, id))| {
            finding(
                "split_brain",
                format!(
                    "epoch {e} answered a 2xx {:.1} ms after a newer epoch had answered one",
                    overlap as f64 / 1000.0
                ),
                vec![by, id],
            )
        })
        .collect()
}

/// Per-key linearizability of bind, release and read ([`linear`]), with
/// evictions at any moment when `evictable`; the `excused` keys left out.
pub(crate) fn linearizable(history: &[Op], world: u32, evictable: bool, excused: &Excused) -> Vec<Finding> {
    let mut per_key: BTreeMap<(Dialect, String), Vec<KeyOp>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.outcome != Outcome::Fail) {
        let complete = (op.outcome == Outcome::Ok).then_some(op.complete_us);
        let mut add = |d: Dialect, k: &String, event: Event| {
            per_key.entry((d, k.clone())).or_default().push(KeyOp { id: op.id, invoke: op.invoke_us, complete, event });
        };
        match &op.call {
            Call::Confirm { dialect, rank, pairs, release } => {
                pairs.iter().for_each(|(k, p)| add(*dialect, k, Event::Bind(*rank, *p)));
                release.iter().for_each(|(k, p)| add(*dialect, k, Event::Unbind(*rank, *p)));
            }
            // Reads and allocates carry an answer only when acknowledged.
            _ if complete.is_none() => {}
            Call::Exists { dialect, keys, found } => {
                keys.iter().zip(found).for_each(|(k, b)| add(*dialect, k, Event::Exists(*b)));
            }
            Call::Locations { dialect, rank, keys, pages } => {
                keys.iter().zip(pages).for_each(|(k, p)| add(*dialect, k, Event::Locate(*rank, *p)));
            }
            Call::Allocate { dialect, rank, keys, pages } => {
                keys.iter()
                    .zip(pages)
                    .filter(|(_, p)| **p >= 0)
                    .for_each(|(k, p)| add(*dialect, k, Event::Stored(*rank, *p)));
            }
        }
    }
    let mut out = Vec::new();
    for ((d, k), ops) in per_key.into_iter().filter(|(dk, _)| !excused.contains(dk)) {
        match linear::linearizable(world_of(d, world), &ops, evictable) {
            Ok(true) => {}
            Ok(false) => out.push(finding(
                "linearizable",
                format!("{d:?} key {k}: no order of its {} operations explains their answers", ops.len()),
                ops.iter().map(|o| o.id).collect(),
            )),
            Err(e) => out.push(finding("linearizable", format!("{d:?} key {k}: {e}"), vec![])),
        }
    }
    out
}

/// The longest window (start, end) in `[from, to]` with no acknowledged
/// write (confirm) completing, in µs.
pub(crate) fn longest_gap(history: &[Op], from: u64, to: u64) -> (u64, u64) {
    let mut t: Vec<u64> = history
        .iter()
        .filter(|o| o.ok() && !o.final_read && matches!(o.call, Call::Confirm { .. }))
        .map(|o| o.complete_us)
        .filter(|&t| t >= from && t <= to)
        .collect();
    t.sort_unstable();
    let mut prev = from;
    let mut best = (from, from);
    for x in t.into_iter().chain(std::iter::once(to)) {
        if x - prev > best.1 - best.0 {
            best = (prev, x);
        }
        prev = x;
    }
    best
}

/// What liveness requires of a run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// When the fault began and when it was healed (µs from the start).
    pub fault: (u64, u64),
    /// When the workload stopped.
    pub end: u64,
    /// The longest window with no acknowledged write the nemesis allows
    /// between the fault's start and the end (its own outage plus a failover).
    pub max_gap_us: u64,
    /// How soon after the heal a write must be acknowledged.
    pub after_heal_us: u64,
}

/// Liveness: an acknowledged write within `after_heal_us` of the heal (which
/// also needs a serving leader: `leader_after_heal` is when one was first
/// seen), and no window longer than `max_gap_us` without one.
pub(crate) fn liveness(history: &[Op], b: Bounds, leader_after_heal: Option<u64>) -> Vec<Finding> {
    let mut out = Vec::new();
    let heal = b.fault.1;
    let first = history
        .iter()
        .filter(|o| o.ok() && o.call.is_write() && matches!(o.call, Call::Confirm { .. }) && o.invoke_us >= heal)
        .min_by_key(|o| o.complete_us);
    match first {
        Some(o) if o.complete_us - heal <= b.after_heal_us => {}
        Some(o) => out.push(finding(
            "liveness",
            format!(
                "first acknowledged write {:.2} s after the heal (bound {:.1} s)",
                (o.complete_us - heal) as f64 / 1e6,
                b.after_heal_us as f64 / 1e6
            ),
            vec![o.id],
        )),
        None => out.push(finding("liveness", "no acknowledged write after the heal".into(), vec![])),
    }
    match leader_after_heal {
        Some(t) if t.saturating_sub(heal) <= b.after_heal_us => {}
        _ => out.push(finding("liveness", "no serving leader within the bound after the heal".into(), vec![])),
    }
    let (s, e) = longest_gap(history, b.fault.0, b.end);
    if e - s > b.max_gap_us {
        out.push(finding(
            "liveness",
            format!(
                "no acknowledged write for {:.2} s ({:.2}–{:.2} s into the run; bound {:.1} s)",
                (e - s) as f64 / 1e6,
                s as f64 / 1e6,
                e as f64 / 1e6,
                b.max_gap_us as f64 / 1e6
            ),
            vec![],
        ));
    }
    out
}

#[cfg(test)]
mod tests;
