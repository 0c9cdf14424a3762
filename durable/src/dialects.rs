//! A server's two durable stores: vLLM's (its one page space, in
//! `--data-dir`) and SGLang's spaces' (in `<data-dir>/sglang`, [`spaces`]).
//!
//! Each request waits for the store its dialect journals to; `/health`,
//! `/metrics`, the fatal exit and closing walk both, by [`Dialect`], so one
//! disk that fails shows once whichever dialect met it first.
//!
//! [`spaces`]: super::spaces

use super::{Durable, Health, WaitError};
use crate::core::Dialect;
use hf3fs_meta_metrics::Samples;
use std::sync::Arc;

/// vLLM's durable store and SGLang's spaces'.
pub struct Durability {
    /// vLLM's store.
    pub vllm: Durable,
    /// SGLang's spaces.
    pub sglang: Durable,
    /// The catalog naming SGLang's spaces (replication sends it).
    pub catalog: std::sync::Arc<super::spaces::Catalog>,
}

impl Durability {
    /// The store that `dialect`'s changes are journaled to.
    pub fn of(&self, dialect: Dialect) -> &Durable {
        match dialect {
            Dialect::Vllm => &self.vllm,
            Dialect::Sglang => &self.sglang,
        }
    }

    /// Both stores, by dialect, in [`Dialect::ALL`]'s order.
    pub fn stores(&self) -> [(Dialect, &Durable); 2] {
        Dialect::ALL.map(|d| (d, self.of(d)))
    }

    /// The worse of the two healths; SGLang's reason says whose it is.
    pub fn health(&self) -> Health {
        let mut worst = Health::Healthy;
        for (d, store) in self.stores() {
            let h = match store.health() {
                Health::Degraded(why) => Health::Degraded(whose(d, &why)),
                Health::Fatal(why) => Health::Fatal(whose(d, &why)),
                Health::Healthy => Health::Healthy,
            };
            worst = match (worst, h) {
                (f @ Health::Fatal(_), _) | (_, f @ Health::Fatal(_)) => f,
                (d @ Health::Degraded(_), _) | (_, d @ Health::Degraded(_)) => d,
                (Health::Healthy, Health::Healthy) => Health::Healthy,
            };
        }
        worst
    }

    /// Resolves when either store fails beyond in-process recovery.
    pub async fn fatal(&self) -> Arc<str> {
        tokio::select! {
            why = self.vllm.fatal() => whose(Dialect::Vllm, &why),
            why = self.sglang.fatal() => whose(Dialect::Sglang, &why),
        }
    }

    /// Closes both ([`Durable::close`]); the first failure is reported.
    pub fn close(&self) -> Result<(), WaitError> {
        self.stores().into_iter().map(|(_, s)| s.close()).fold(Ok(()), Result::and)
    }

    /// Appends both stores' series to a Prometheus text page, labelled
    /// `store="vllm"` and `store="sglang"`.
    pub fn render_metrics(&self, out: &mut String) {
        let series = self.stores().map(|(d, s)| (d, s.series()));
        for (i, (family, _)) in series[0].1.iter().enumerate() {
            let mut w = Samples::start(out, family);
            for (d, s) in &series {
                w.put(&[("store", &d.label())], s[i].1);
            }
        }
    }
}

/// A failure's reason, saying whose store it is when it is not vLLM's (the
/// server's first store, whose reasons have always stood alone).
fn whose(dialect: Dialect, why: &str) -> Arc<str> {
    match dialect {
        Dialect::Vllm => why.into(),
        Dialect::Sglang => format!("SGLang spaces' store: {why}").into(),
    }
}
