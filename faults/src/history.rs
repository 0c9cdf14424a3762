//! The history of a run: every request a worker sent, with its invoke and
//! completion times, its outcome and what the server answered.
//!
//! Outcomes follow Jepsen's rule: `ok` (acknowledged), `fail` only where the
//! server provably changed nothing (a refusal before the body was read, a
//! connection the relay never accepted, a 4xx/typed 500), and `info` where
//! the request may or may not have been applied (a timeout, a reset, a 503
//! given after the request may have run).

use serde::{Deserialize, Serialize};

/// How a request ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Acknowledged: a 2xx.
    Ok,
    /// Refused with nothing changed.
    Fail,
    /// May or may not have taken effect.
    Info,
}

/// Which API a key lives in: vLLM's ranks or SGLang's page space `(0, "kv")`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// vLLM: a key's world spans `world` ranks.
    Vllm,
    /// SGLang: one page space, a world of one.
    Sglang,
}

/// One request and, when answered with a 2xx, what it said.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Call {
    /// vLLM `batch_allocate` / SGLang `reserve_and_allocate_page_indices`:
    /// the pages given (`-1`: none), when ok.
    Allocate { dialect: Dialect, rank: u32, keys: Vec<String>, pages: Vec<i64> },
    /// vLLM / SGLang `confirm_write`: binds `pairs`, frees `release` (each
    /// named with the key it was reserved for, which the harness knows).
    Confirm { dialect: Dialect, rank: u32, pairs: Vec<(String, i64)>, release: Vec<(String, i64)> },
    /// vLLM `batch_exists` / SGLang `exists`: the flags, when ok.
    Exists { dialect: Dialect, keys: Vec<String>, found: Vec<bool> },
    /// vLLM `get_locations` / SGLang `get_page_indices`: the pages, when ok.
    Locations { dialect: Dialect, rank: u32, keys: Vec<String>, pages: Vec<Option<i64>> },
}

impl Call {
    /// Whether the call may change the server's state.
    pub fn is_write(&self) -> bool {
        matches!(self, Call::Allocate { .. } | Call::Confirm { .. })
    }

    /// The route's short name, for the figures.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Allocate { .. } => "allocate",
            Call::Confirm { .. } => "confirm",
            Call::Exists { .. } => "exists",
            Call::Locations { .. } => "locations",
        }
    }
}

/// One recorded request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Op {
    /// Its index in the history.
    pub id: u64,
    /// The worker that sent it.
    pub worker: u32,
    /// Microseconds from the run's start when it was sent…
    pub invoke_us: u64,
    /// …and when its answer (or its failure) came.
    pub complete_us: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The HTTP status (0: no answer).
    pub status: u16,
    /// The epoch of the leader that answered a 2xx (`x-hf3fs-meta-epoch`).
    pub epoch: Option<u64>,
    /// The node that led at that epoch (from the nodes' `/health`).
    pub node: Option<String>,
    /// Why it was not a 2xx: the 503's reason class or the I/O error.
    pub reason: Option<String>,
    /// Sent by the final read-back after the heal.
    #[serde(default)]
    pub final_read: bool,
    /// What was asked and answered.
    #[serde(flatten)]
    pub call: Call,
}

impl Op {
    /// Whether this op was acknowledged.
    pub fn ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }
}

/// Classifies a non-2xx answer or a transport error for a request that
/// `may_change` state: the outcome and a short reason.
///
/// A 503 naming "Not the leader" with `Connection: close` is the gate's
/// refusal on arrival (the body left unread, nothing changed): `fail`. The
/// same text without the close is an answer withdrawn after the request ran
/// (its deadline passed meanwhile): `info`. A durability or replication 503
/// comes after the change was applied in memory: `info`. A 4xx or a typed
/// 500 is checked before anything is applied: `fail`.
pub fn classify(status: u16, body: &str, closes: bool, may_change: bool) -> (Outcome, String) {
    let reason = reason_of(status, body);
    let outcome = match status {
        200..=299 => Outcome::Ok,
        503 if body.contains("Not the leader") && closes => Outcome::Fail,
        503 if body.contains("allocations are refused until it can") => Outcome::Fail,
        400..=500 => Outcome::Fail,
        _ if !may_change => Outcome::Fail,
        _ => Outcome::Info,
    };
    (outcome, reason)
}

/// A short, stable name for why a request was not acknowledged.
pub fn reason_of(status: u16, body: &str) -> String {
    let class = if body.contains("this node is a follower") {
        "follower"
    } else if body.contains("is becoming leader") {
        "promoting"
    } else if body.contains("could not renew its leadership") {
        "fenced"
    } else if body.contains("synchronous standby") {
        "standby did not acknowledge"
    } else if body.contains("Durability failure") {
        "durability failure"
    } else if body.contains("Confirmation failed") {
        "typed confirm error"
    } else {
        "other"
    };
    format!("{status} {class}")
}

#[cfg(test)]
mod tests {
    use super::{classify, Outcome};

    #[test]
    fn only_what_provably_changed_nothing_is_a_fail() {
        let refused = r#"{"detail":"Not the leader: this node is a follower; retry (through the relay)"}"#;
        // The gate's refusal on arrival closes the connection (the body unread).
        assert_eq!(classify(503, refused, true, true).0, Outcome::Fail);
        // The same text without the close: an answer withdrawn after the request ran.
        assert_eq!(classify(503, refused, false, true).0, Outcome::Info);
        let unsynced = r#"{"detail":"Durability failure: not acknowledged by the synchronous standby: …"}"#;
        assert_eq!(classify(503, unsynced, false, true), (Outcome::Info, "503 standby did not acknowledge".into()));
        assert_eq!(classify(500, r#"{"detail":"Confirmation failed: …"}"#, false, true).0, Outcome::Fail);
        assert_eq!(classify(400, "{}", false, true).0, Outcome::Fail);
        assert_eq!(classify(204, "", false, true).0, Outcome::Ok);
        // A read changes nothing whatever its answer.
        assert_eq!(classify(502, "", false, false).0, Outcome::Fail);
        assert_eq!(classify(502, "", false, true).0, Outcome::Info);
    }
}
