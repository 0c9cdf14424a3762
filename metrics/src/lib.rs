//! Counters kept in per-thread shards, and the one writer of the Prometheus
//! text exposition format (0.0.4) that every layer of the server hands its
//! metric families to: the HTTP layer's request counters and page spaces,
//! the durable stores' health, HA's role and replication. No other crate
//! writes a `# HELP` or `# TYPE` line.
//!
//! - [`Sharded`]: a value per worker thread (each its own cache line), so the
//!   request path's `Relaxed` increments never share a line; a scrape sums.
//! - [`Family`] ([`counter`], [`gauge`], [`histogram`]): a family's name
//!   (after `hf3fs_meta_`), type and help text.
//! - [`Samples`]: a family's `# HELP` and `# TYPE` lines, then its samples,
//!   each `hf3fs_meta_<name>[suffix]{labels} value`.
//!
//! # Memory ordering
//!
//! Every counter is `Relaxed` ([`add`]): each is an independent monotonic
//! count, and a scrape that reads one shard slightly before another only
//! sees a slightly older total, which Prometheus tolerates by design.

use crossbeam_utils::CachePadded;
use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Shards: enough that worker threads rarely share one.
pub const SHARDS: usize = 32;

thread_local! {
    /// This thread's shard number, handed out round-robin on first use.
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

/// [`SHARDS`] values of `T`, each on its own cache line; a thread always
/// finds the same one.
pub struct Sharded<T> {
    shards: Box<[CachePadded<T>]>,
}

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Self { shards: (0..SHARDS).map(|_| CachePadded::new(T::default())).collect() }
    }
}

impl<T> Sharded<T> {
    /// This thread's shard.
    #[inline]
    pub fn local(&self) -> &T {
        &self.shards[SHARD.with(|s| *s)]
    }

    /// The sum over every shard of the counter `f` picks.
    pub fn sum(&self, f: impl Fn(&T) -> &AtomicU64) -> u64 {
        self.shards.iter().map(|s| f(s).load(Ordering::Relaxed)).sum()
    }
}

/// Adds `n` to the counter `c`.
#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    // Relaxed: independent monotonic counters (see the module note).
    c.fetch_add(n, Ordering::Relaxed);
}

/// A metric family: its name (after `hf3fs_meta_`), type and help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// The name after `hf3fs_meta_`.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// The help text.
    pub help: &'static str,
}

/// A counter family.
pub const fn counter(name: &'static str, help: &'static str) -> Family {
    Family { name, kind: "counter", help }
}

/// A gauge family.
pub const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family { name, kind: "gauge", help }
}

/// A histogram family.
pub const fn histogram(name: &'static str, help: &'static str) -> Family {
    Family { name, kind: "histogram", help }
}

/// The one series writer: a family's `# HELP` and `# TYPE` lines, then its
/// samples, each `hf3fs_meta_<name>[suffix]{labels} value`.
pub struct Samples<'o> {
    o: &'o mut String,
    name: &'static str,
}

/// A sample's labels, in order: name and value (escaped when written).
pub type Labels<'a> = [(&'static str, &'a dyn Display)];

impl<'o> Samples<'o> {
    /// Starts family `f` on `o`: its `# HELP` and `# TYPE` lines.
    pub fn start(o: &'o mut String, f: &Family) -> Self {
        let _ = writeln!(o, "# HELP hf3fs_meta_{0} {1}\n# TYPE hf3fs_meta_{0} {2}", f.name, f.help, f.kind);
        Samples { o, name: f.name }
    }

    /// One sample of the family.
    pub fn put(&mut self, labels: &Labels<'_>, value: impl Display) {
        self.put_suffixed("", labels, value);
    }

    /// One sample of the family's `suffix` series (`_bucket`, `_sum`, `_count`).
    pub fn put_suffixed(&mut self, suffix: &str, labels: &Labels<'_>, value: impl Display) {
        let _ = write!(self.o, "hf3fs_meta_{}{suffix}", self.name);
        for (i, (name, v)) in labels.iter().enumerate() {
            let _ = write!(self.o, "{}{name}=\"{}\"", if i == 0 { '{' } else { ',' }, label_value(&v.to_string()));
        }
        let close = if labels.is_empty() { "" } else { "}" };
        let _ = writeln!(self.o, "{close} {value}");
    }
}

/// Writes family `f` with one unlabelled sample, `value`.
pub fn single(o: &mut String, f: &Family, value: impl Display) {
    Samples::start(o, f).put(&[], value);
}

/// `value` escaped for a Prometheus label value.
pub fn label_value(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_its_help_type_and_samples() {
        let mut o = String::new();
        let f = counter("x_total", "Things.");
        let mut w = Samples::start(&mut o, &f);
        w.put(&[("a", &"b\"c")], 3);
        w.put_suffixed("_sum", &[], 1.5);
        single(&mut o, &gauge("y", "Why."), 0);
        assert_eq!(
            o,
            "# HELP hf3fs_meta_x_total Things.\n# TYPE hf3fs_meta_x_total counter\nhf3fs_meta_x_total{a=\"b\\\"c\"} 3\n\
             hf3fs_meta_x_total_sum 1.5\n# HELP hf3fs_meta_y Why.\n# TYPE hf3fs_meta_y gauge\nhf3fs_meta_y 0\n"
        );
    }

    #[test]
    fn shards_sum() {
        let s: Sharded<AtomicU64> = Sharded::default();
        add(s.local(), 2);
        add(s.local(), 3);
        std::thread::spawn(move || {
            add(s.local(), 4);
            assert_eq!(s.sum(|c| c), 9);
        })
        .join()
        .unwrap();
    }
}
