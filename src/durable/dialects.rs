//! A server's two durable stores: vLLM's (its one page space, in
//! `--data-dir`) and SGLang's spaces' (in `<data-dir>/sglang`, [`spaces`]).
//!
//! Each request waits for the store its dialect journals to; `/health`,
//! `/metrics` and the fatal exit look at both, so one disk that fails shows
//! once whichever dialect met it first.
//!
//! [`spaces`]: super::spaces

use super::{Durable, Health, WaitError};
use crate::routes::Dialect;
use std::fmt::Write as _;
use std::sync::Arc;

/// vLLM's durable store and SGLang's spaces'.
pub struct Durability {
    /// vLLM's store.
    pub vllm: Durable,
    /// SGLang's spaces.
    pub sglang: Durable,
}

impl Durability {
    /// The store that `dialect`'s changes are journaled to (the operations
    /// routes change vLLM's store).
    pub fn of(&self, dialect: Dialect) -> &Durable {
        match dialect {
            Dialect::Sglang => &self.sglang,
            Dialect::Vllm | Dialect::Ops => &self.vllm,
        }
    }

    /// The worse of the two healths; SGLang's reason says whose it is.
    pub fn health(&self) -> Health {
        let sglang = || match self.sglang.health() {
            Health::Degraded(why) => Health::Degraded(format!("SGLang spaces' store: {why}").into()),
            Health::Fatal(why) => Health::Fatal(format!("SGLang spaces' store: {why}").into()),
            Health::Healthy => Health::Healthy,
        };
        match (self.vllm.health(), sglang()) {
            (f @ Health::Fatal(_), _) | (_, f @ Health::Fatal(_)) => f,
            (d @ Health::Degraded(_), _) | (_, d @ Health::Degraded(_)) => d,
            (Health::Healthy, Health::Healthy) => Health::Healthy,
        }
    }

    /// Resolves when either store fails beyond in-process recovery.
    pub async fn fatal(&self) -> Arc<str> {
        tokio::select! {
            why = self.vllm.fatal() => why,
            why = self.sglang.fatal() => format!("SGLang spaces' store: {why}").into(),
        }
    }

    /// Closes both ([`Durable::close`]); the first failure is reported.
    pub fn close(&self) -> Result<(), WaitError> {
        let sglang = self.sglang.close();
        self.vllm.close().and(sglang)
    }

    /// Appends both stores' series to a Prometheus text page, labelled
    /// `store="vllm"` and `store="sglang"`.
    pub fn render_metrics(&self, out: &mut String) {
        let (v, s) = (self.vllm.series(), self.sglang.series());
        for ((name, kind, help, a), (.., b)) in v.into_iter().zip(s) {
            let _ = writeln!(
                out,
                "# HELP hf3fs_meta_{name} {help}\n# TYPE hf3fs_meta_{name} {kind}\n\
                 hf3fs_meta_{name}{{store=\"vllm\"}} {a}\nhf3fs_meta_{name}{{store=\"sglang\"}} {b}"
            );
        }
    }
}
