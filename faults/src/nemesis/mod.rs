//! The nemeses: one fault per run, injected in the middle of the workload
//! and healed before its end. Targets (the leader, its standby, etcd's raft
//! leader) are resolved when the fault starts; the other choices (which
//! member, which byte) come from the run's seeded generator.
//!
//! Every fault type is one row of the `faults!` table below: its name
//! (`--nemesis NAME`), a one-line description (`hf3fs-faults list`), how
//! long it is held and what outage it may cause ([`Timing`]), what the run
//! must provide for it ([`Need`]) and its injection (a function of
//! [`inject`]; [`Applied`] says how it is healed). Adding a fault type is
//! adding a row (and, for a new kind of fault, its injection function).

mod inject;

pub(crate) use inject::{clock_env, heal, Applied, Ctx, Stamps};

use crate::cluster::{SYNC_TIMEOUT, TTL};
use crate::proxy::Mode;
use inject::{
    clock, corrupt, cut, fill_disk, flaky, fsync, kill, pause, power_cut, proxy, read_only, Peers, Power, Who,
};
use rand::Rng;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The failover budget: a killed leader's lease expires (one TTL), its
/// successor waits one more, catches up and serves; plus one sync timeout
/// and 2 s of slack for a loaded machine.
pub(crate) const FAILOVER_BUDGET: Duration =
    Duration::from_millis(3 * TTL.as_millis() as u64 + SYNC_TIMEOUT.as_millis() as u64 + 2000);

/// How long a fault is held, and how long it may leave the service without
/// an acknowledged write beyond [`FAILOVER_BUDGET`] (its allowed outage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timing {
    /// Held for `--fault-secs`; no outage beyond the budget.
    Held,
    /// Held for `--fault-secs`, all of it allowed as an outage: limits by
    /// design (clients cut off from a leader etcd still sees healthy get
    /// nothing for the whole cut; a lossy link or a slow clock promise no
    /// rate).
    Outage,
    /// Held for this many halves of the lease TTL, all of it allowed as an
    /// outage (a pause).
    HalfTtls(u32),
    /// Held for `--fault-secs` but at least this many seconds, with no
    /// outage: the leader's standby cut off for longer than any bound, so
    /// the leader must name another caught-up node, not wait out the cut.
    AtLeastSecs(u64),
}

impl Timing {
    /// (hold, allowed outage) for a run whose `--fault-secs` is `fault`.
    fn of(self, fault: Duration) -> (Duration, Duration) {
        match self {
            Timing::Held => (fault, Duration::ZERO),
            Timing::Outage => (fault, fault),
            Timing::HalfTtls(n) => (TTL * n / 2, TTL * n / 2),
            Timing::AtLeastSecs(s) => (fault.max(Duration::from_secs(s)), Duration::ZERO),
        }
    }
}

/// What a fault needs of the run beyond the default cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// The nodes' data on ext4 images ([`crate::cluster::Disk::Ext4`])
    /// rather than tmpfs.
    Ext4,
    /// Every node under libfaketime's preload ([`clock_env`]), its clock
    /// file at `+0` until the fault.
    Faketime,
    /// `strace` (its `-e inject`) on the PATH.
    Strace,
    /// The nodes' data on forgetful file systems
    /// ([`crate::cluster::Disk::Forget`]; root and `/dev/fuse`).
    Forgetfs,
    /// One node without HA ([`crate::cluster::Setup::single`]).
    Single,
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Need::Ext4 => "ext4",
            Need::Faketime => "libfaketime",
            Need::Strace => "strace",
            Need::Forgetfs => "forgetfs",
            Need::Single => "a single node",
        })
    }
}

/// One row of the table: everything about one fault type.
struct Spec {
    name: &'static str,
    about: &'static str,
    timing: Timing,
    needs: &'static [Need],
    inject: fn(&mut Ctx) -> Result<Applied, String>,
}

/// The fault types, one row each: `Variant "name" "description" timing
/// [needs] injection;`. The order is `ALL`'s (and `list`'s).
macro_rules! faults {
    ($($variant:ident $name:literal $about:literal $timing:expr, [$($need:ident),*], $inject:expr;)*) => {
        /// A fault type (`--nemesis NAME`; `list` names them all).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub(crate) enum Fault {
            $(#[doc = $about] $variant,)*
        }

        impl Fault {
            /// Every fault type, in the table's order.
            pub(crate) const ALL: &'static [Fault] = &[$(Fault::$variant),*];
        }

        const SPECS: &[Spec] = &[$(Spec {
            name: $name,
            about: $about,
            timing: $timing,
            needs: &[$(Need::$need),*],
            inject: $inject,
        }),*];
    };
}

faults! {
    None "none" "no fault: the workload alone"
        Timing::Held, [], |_| Ok(Applied::Nothing);
    KillLeader "kill-leader" "kill the leader (SIGKILL), restart it at the heal"
        Timing::Held, [], |c| kill(c, Who::Leader);
    KillStandby "kill-standby" "kill the leader's standby, restart it at the heal"
        Timing::Held, [], |c| kill(c, Who::Standby);
    KillRelay "kill-relay" "kill the relay the clients send through, restart it at the heal"
        Timing::Outage, [], |c| kill(c, Who::Relay);
    KillEtcdMember "kill-etcd-member" "kill an etcd member that is not the raft leader (chosen by the seed)"
        Timing::Held, [], |c| kill(c, Who::EtcdMember);
    KillEtcdLeader "kill-etcd-leader" "kill etcd's raft leader"
        Timing::Held, [], |c| kill(c, Who::EtcdLeader);
    PauseLeaderHalfTtl "pause-leader-0.5ttl" "SIGSTOP the leader for half a lease TTL"
        Timing::HalfTtls(1), [], |c| pause(c, Who::Leader);
    PauseLeader1Ttl "pause-leader-1ttl" "SIGSTOP the leader for one lease TTL"
        Timing::HalfTtls(2), [], |c| pause(c, Who::Leader);
    PauseLeader3Ttl "pause-leader-3ttl" "SIGSTOP the leader for three lease TTLs (it loses its lease)"
        Timing::HalfTtls(6), [], |c| pause(c, Who::Leader);
    PauseStandby3Ttl "pause-standby-3ttl" "SIGSTOP the leader's standby for three lease TTLs"
        Timing::HalfTtls(6), [], |c| pause(c, Who::Standby);
    PauseEtcdLeader1Ttl "pause-etcd-leader-1ttl" "SIGSTOP etcd's raft leader for one lease TTL"
        Timing::HalfTtls(2), [], |c| pause(c, Who::EtcdLeader);
    PartitionLeaderEtcd "partition-leader-etcd" "cut the leader from every etcd member (nft)"
        Timing::Held, [], |c| cut(c, Who::Leader, Peers::Etcd);
    PartitionLeaderStandby "partition-leader-standby" "cut the leader from its standby only"
        Timing::AtLeastSecs(16), [], |c| cut(c, Who::Leader, Peers::One(Who::Standby));
    PartitionRelayLeader "partition-relay-leader" "cut the relay from the leader (etcd still sees it healthy)"
        Timing::Outage, [], |c| cut(c, Who::Relay, Peers::One(Who::Leader));
    PartitionEtcdMinority "partition-etcd-minority" "cut one etcd member (not the raft leader, chosen by the seed) from everyone"
        Timing::Held, [], |c| cut(c, Who::EtcdMember, Peers::Everyone);
    IsolateLeader "isolate-leader" "cut the leader from everyone"
        Timing::Held, [], |c| cut(c, Who::Leader, Peers::Everyone);
    IsolateStandby "isolate-standby" "cut the leader's standby from everyone"
        Timing::AtLeastSecs(16), [], |c| cut(c, Who::Standby, Peers::Everyone);
    FlakyLeader "flaky-leader" "10-40 % packet loss both ways and 2 % TCP resets on every link of the leader"
        Timing::Outage, [], flaky;
    ReplDelay "repl-delay" "delay the replication link to the standby by 200-1500 ms (the proxy)"
        Timing::Outage, [], |c| { let ms = c.rng.gen_range(200..1500); proxy(c, Mode::Delay(ms)) };
    ReplBlackhole "repl-blackhole" "blackhole the replication link to the standby"
        Timing::AtLeastSecs(16), [], |c| proxy(c, Mode::Blackhole);
    ReplReset "repl-reset" "reset every connection of the replication link to the standby"
        Timing::Held, [], |c| proxy(c, Mode::Reset);
    ClockJumpLeader "clock-jump-leader" "jump the leader's wall clock by +/-1 h"
        Timing::Held, [Faketime], |c| {
            let secs: i64 = if c.rng.gen_bool(0.5) { 3600 } else { -3600 };
            clock(c, &format!("{secs:+}\n"))
        };
    ClockSlowLeader "clock-slow-leader" "run the leader's wall clock and timers at half rate"
        Timing::Outage, [Faketime], |c| clock(c, "+0 x0.5\n");
    FsyncEioStandby "fsync-eio-standby" "restart the standby under strace failing one fsync with EIO"
        Timing::Held, [Strace], |c| fsync(c, true);
    FsyncSlowStandby "fsync-slow-standby" "restart the standby under strace making every fsync slower than the sync timeout"
        Timing::Held, [Strace], |c| fsync(c, false);
    DiskFullStandby "disk-full-standby" "fill the standby's tmpfs (ENOSPC)"
        Timing::Held, [], fill_disk;
    DiskRoStandby "disk-ro-standby" "turn the standby's ext4 disk read-only under its open files (EROFS)"
        Timing::Held, [Ext4], read_only;
    CorruptStandby "corrupt-standby" "flip one byte of one of the standby's files before it restarts"
        Timing::Held, [], corrupt;
    PowerCutSingle "power-cut-single" "cut the power of a node without HA: SIGKILL, its unsynced writes dropped (or torn)"
        Timing::Outage, [Forgetfs, Single], |c| power_cut(c, Power::One(Who::Leader));
    PowerCutLeader "power-cut-leader" "cut the leader's power: SIGKILL, its unsynced writes dropped (or torn)"
        Timing::Held, [Forgetfs], |c| power_cut(c, Power::One(Who::Leader));
    PowerCutStandby "power-cut-standby" "cut the standby's power: SIGKILL, its unsynced writes dropped (or torn)"
        Timing::Held, [Forgetfs], |c| power_cut(c, Power::One(Who::Standby));
    PowerCutCluster "power-cut-cluster" "cut every node's power at one instant (a rack): SIGKILL, unsynced writes dropped (or torn)"
        Timing::Outage, [Forgetfs], |c| power_cut(c, Power::All);
}

impl Fault {
    fn spec(self) -> &'static Spec {
        &SPECS[self as usize]
    }

    /// The name (`--nemesis NAME`).
    pub(crate) fn name(self) -> &'static str {
        self.spec().name
    }

    /// A one-line description.
    pub(crate) fn about(self) -> &'static str {
        self.spec().about
    }

    /// How long it is held and what outage it may cause.
    pub(crate) fn timing(self) -> Timing {
        self.spec().timing
    }

    /// What the run must provide for it.
    pub(crate) fn needs(self) -> &'static [Need] {
        self.spec().needs
    }

    /// Injects it; what to heal.
    pub(crate) fn inject(self, c: &mut Ctx) -> Result<Applied, String> {
        (self.spec().inject)(c)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

fn known() -> String {
    Fault::ALL.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        Fault::ALL
            .iter()
            .copied()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown nemesis {s} (known: {})", known()))
    }
}

/// What a run injects: one fault type, or a pair `a+b` held at once for as
/// long as the longer one needs, allowed the sum of their outages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Nemesis(pub Vec<Fault>);

impl Nemesis {
    /// (hold, allowed outage) for a run whose `--fault-secs` is `fault`.
    pub(crate) fn timing(&self, fault: Duration) -> (Duration, Duration) {
        self.0
            .iter()
            .map(|f| f.timing().of(fault))
            .fold((Duration::ZERO, Duration::ZERO), |(a, b), (c, d)| (a.max(c), b + d))
    }

    /// Whether it cuts the power of nodes that may hold the only copy of an
    /// acknowledged change: a single node, the leader, or every node (a
    /// standby's cut leaves the leader's memory whole).
    pub(crate) fn cuts_the_leader(&self) -> bool {
        self.0.iter().any(|f| matches!(f, Fault::PowerCutSingle | Fault::PowerCutLeader | Fault::PowerCutCluster))
    }

    /// Whether it cuts every node at once (nothing is left that holds an
    /// acknowledged change in memory).
    pub(crate) fn cuts_every_node(&self) -> bool {
        self.0.iter().any(|f| matches!(f, Fault::PowerCutSingle | Fault::PowerCutCluster))
    }

    /// Whether one of its faults needs `need`.
    pub(crate) fn needs(&self, need: Need) -> bool {
        self.0.iter().any(|f| f.needs().contains(&need))
    }
}

impl From<Fault> for Nemesis {
    fn from(f: Fault) -> Nemesis {
        Nemesis(vec![f])
    }
}

impl fmt::Display for Nemesis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|x| x.name()).collect();
        f.pad(&names.join("+"))
    }
}

impl FromStr for Nemesis {
    type Err = String;

    fn from_str(s: &str) -> Result<Nemesis, String> {
        s.split('+').map(str::parse).collect::<Result<_, _>>().map(Nemesis)
    }
}

#[cfg(test)]
mod tests {
    use super::{Fault, Need, Nemesis, Timing, SPECS, TTL};
    use std::collections::BTreeSet;
    use std::time::Duration;

    #[test]
    fn every_fault_has_its_row_and_its_name_parses_back() {
        assert_eq!(SPECS.len(), Fault::ALL.len());
        let names: BTreeSet<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), Fault::ALL.len(), "two fault types share a name");
        for (i, f) in Fault::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
            assert_eq!(f.name().parse::<Fault>(), Ok(*f));
            assert_eq!(f.to_string(), f.name());
            assert!(!f.about().is_empty() && !f.about().contains('\n'), "{f}");
        }
        assert!("kill-leader ".parse::<Fault>().is_err());
        assert!("pause-leader".parse::<Fault>().unwrap_err().contains("known: none, kill-leader"));
    }

    #[test]
    fn a_pair_parses_prints_and_adds_its_outages() {
        let p: Nemesis = "kill-leader+pause-leader-3ttl".parse().unwrap();
        assert_eq!(p, Nemesis(vec![Fault::KillLeader, Fault::PauseLeader3Ttl]));
        assert_eq!(p.to_string(), "kill-leader+pause-leader-3ttl");
        let f = Duration::from_secs(10);
        assert_eq!(p.timing(f), (f, TTL * 3));
        assert!("kill-leader+nope".parse::<Nemesis>().is_err());
        assert!(Nemesis::from(Fault::DiskRoStandby).needs(Need::Ext4));
        assert!(!p.needs(Need::Ext4) && !p.needs(Need::Faketime));
        assert!("clock-slow-leader+kill-standby".parse::<Nemesis>().unwrap().needs(Need::Faketime));
    }

    #[test]
    fn every_nemesis_has_a_timing_and_pauses_last_their_ttls() {
        let f = Duration::from_secs(10);
        for n in Fault::ALL {
            let (hold, outage) = n.timing().of(f);
            assert!(hold > Duration::ZERO && outage <= hold, "{n}: {hold:?} {outage:?}");
        }
        assert_eq!(Fault::PauseLeaderHalfTtl.timing().of(f), (TTL / 2, TTL / 2));
        assert_eq!(Fault::PauseLeader3Ttl.timing().of(f), (TTL * 3, TTL * 3));
        assert_eq!(Fault::PartitionLeaderStandby.timing().of(f), (Duration::from_secs(16), Duration::ZERO));
        assert_eq!(Fault::FlakyLeader.timing(), Timing::Outage);
        assert_eq!(
            Fault::PartitionLeaderStandby.timing().of(f).1,
            Duration::ZERO,
            "the standby cut promises availability"
        );
    }

    #[test]
    fn the_power_cuts_run_on_the_forgetful_file_system_and_say_whom_they_cut() {
        let power = [Fault::PowerCutSingle, Fault::PowerCutLeader, Fault::PowerCutStandby, Fault::PowerCutCluster];
        for f in Fault::ALL {
            assert_eq!(f.needs().contains(&Need::Forgetfs), power.contains(f), "{f}");
            assert_eq!(f.needs().contains(&Need::Single), *f == Fault::PowerCutSingle, "{f}");
        }
        let n = |f: Fault| Nemesis::from(f);
        assert!(n(Fault::PowerCutLeader).cuts_the_leader() && !n(Fault::PowerCutLeader).cuts_every_node());
        assert!(!n(Fault::PowerCutStandby).cuts_the_leader());
        assert!(n(Fault::PowerCutCluster).cuts_every_node() && n(Fault::PowerCutSingle).cuts_every_node());
        assert!(!n(Fault::KillLeader).cuts_the_leader(), "a SIGKILL loses nothing the page cache holds");
    }

    /// docs/reliability.md's matrices (the tables whose header starts
    /// `| fault | runs |`) name fault types: the first (the latest
    /// campaign) names every fault type but `none`, and none names one
    /// that does not exist. The prose around them may say anything.
    #[test]
    fn the_reliability_doc_names_exactly_the_fault_types() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reliability.md")).unwrap();
        let mut matrices: Vec<BTreeSet<String>> = Vec::new();
        let mut inside = false;
        for line in doc.lines() {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
            if line.trim_start().starts_with('|') && cells.len() > 1 && cells[0] == "fault" && cells[1] == "runs" {
                matrices.push(BTreeSet::new());
                inside = true;
            } else if inside && line.trim_start().starts_with('|') {
                if cells[0].starts_with("---") {
                    continue;
                }
                // `a+b` is a pair, `name +eviction` an eviction run of it,
                // `name --fsync batch` a run of it under those server flags.
                let name = cells[0].split(" --").next().unwrap_or_default();
                let name = name.trim_end_matches("+eviction").trim();
                matrices.last_mut().unwrap().extend(name.split('+').map(str::to_string));
            } else {
                inside = false;
            }
        }
        assert!(!matrices.is_empty(), "docs/reliability.md has no matrix of fault types");
        let all: BTreeSet<String> =
            Fault::ALL.iter().filter(|f| **f != Fault::None).map(|f| f.name().to_string()).collect();
        assert_eq!(matrices[0], all, "the latest matrix of docs/reliability.md against Fault::ALL");
        for (i, m) in matrices.iter().enumerate() {
            let stale: Vec<&String> = m.iter().filter(|n| n.parse::<Fault>().is_err()).collect();
            assert!(stale.is_empty(), "matrix {} of docs/reliability.md names unknown fault types {stale:?}", i + 1);
        }
    }
}
