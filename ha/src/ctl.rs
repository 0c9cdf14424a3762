//! `hf3fs-meta ctl`: the cluster seen and steered from the command line,
//! with the same etcd flags as the nodes.
//!
//! - `ctl status [--json]`: every live node (from `P/members/`), with its
//!   role, epoch, release and protocol range (`P/nodes/`, its `/health`),
//!   whether it is caught up with the leader, the leader's lag, and the
//!   synchronous standby named in `P/sync`; the cluster's version.
//! - `ctl switchover [--to NODE] [--json]`: asks the leader to hand its
//!   leadership to a caught-up standby ([`super::switchover`]) and waits
//!   until another node serves; refused, with the reason, when nobody is
//!   caught up, when the leader runs a release without switchover (0.1.0:
//!   hand over with SIGTERM instead), or when `NODE` is not a live member.
//!
//! - `ctl health [--url URL] [--path /ready]`: one GET of a node's
//!   `/health` or `/ready`, exit 0 on a 200, 1 otherwise: the container
//!   image's health check ([`health`]).
//!
//! Exit status: 0 done, 1 refused or not done in time, 2 when etcd or a
//! flag is wrong. Each node's `/health` is read over plain HTTP/1.1 (open
//! even with `--auth-all`), bounded in time.

use super::etcd::{self, LeaseId};
use super::node::LeaderRecord;
use super::switchover::{Request, State};
use super::version::{self, ClusterVersion, NodeInfo};
use super::EtcdArgs;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod health;

/// `hf3fs-meta ctl`'s commands.
#[derive(Debug, Clone, Subcommand)]
pub enum Ctl {
    /// Every node of the cluster: role, epoch, release, protocol range,
    /// caught up or not, lag, and the named synchronous standby.
    Status(StatusArgs),
    /// Hand the leadership to a caught-up standby without stopping any
    /// process; waits until another node serves.
    Switchover(SwitchoverArgs),
    /// GET a node's `/health` (or `/ready`) over plain HTTP: exit 0 on a
    /// 200, 1 otherwise (the container image's health check).
    Health(health::HealthArgs),
}

/// `ctl status`'s flags.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The etcd connection, as the nodes have it.
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// One JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `ctl switchover`'s flags.
#[derive(Debug, Clone, Args)]
pub struct SwitchoverArgs {
    /// The etcd connection, as the nodes have it.
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The node to hand over to (default: the synchronous standby). The
    /// leader streams to it first and waits (at most 10 s) for it to catch
    /// up.
    #[arg(long)]
    pub to: Option<String>,
    /// Seconds to wait for another node to serve.
    #[arg(long, default_value_t = 20)]
    pub timeout: u64,
    /// One JSON object on stdout instead of a sentence.
    #[arg(long)]
    pub json: bool,
    /// Hand over only if the node named by `--node-id` leads; when another
    /// node leads, or none, there is nothing to hand over: exit 0. For a
    /// pod's preStop hook, where the node's own `HF3FS_META_NODE_ID` names it.
    #[arg(long, requires = "node_id")]
    pub if_leader: bool,
    /// The node `--if-leader` asks about.
    #[arg(long, env = "HF3FS_META_NODE_ID")]
    pub node_id: Option<String>,
}

/// Runs `ctl`.
pub fn main(ctl: Ctl) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hf3fs-meta ctl: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let r = rt.block_on(async {
        match ctl {
            Ctl::Status(a) => status(a).await,
            Ctl::Switchover(a) => switchover(a).await,
            Ctl::Health(a) => Ok(health::run(&a)),
        }
    });
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hf3fs-meta ctl: {e}");
            ExitCode::from(2)
        }
    }
}

fn client(args: &EtcdArgs) -> Result<etcd::EtcdClient, String> {
    args.client(Duration::from_secs(2))
}

/// The cluster as etcd and each node's `/health` show it (`ctl status
/// --json`).
pub async fn cluster(args: &EtcdArgs) -> Result<Value, String> {
    let etcd = client(args)?;
    let keys = args.keys();
    fn e(what: &'static str) -> impl Fn(etcd::Error) -> String {
        move |err| format!("reading {what} in etcd: {err}")
    }
    let members = etcd.get_prefix(&keys.members()).await.map_err(e("the members"))?;
    let nodes_prefix = keys.nodes();
    let infos = version::infos(&nodes_prefix, &etcd.get_prefix(&nodes_prefix).await.map_err(e("the nodes"))?);
    let leader = etcd.get(&keys.leader()).await.map_err(e("the leader"))?;
    let leader = leader.and_then(|kv| LeaderRecord::decode(&kv.value, kv.create_revision));
    let sync = etcd.get(&keys.sync()).await.map_err(e("the standby"))?.map(|kv| text(&kv.value));
    let cluster = etcd.get(&keys.version()).await.map_err(e("the version"))?;
    let cluster = cluster.and_then(|kv| ClusterVersion::decode(&kv.value));
    let prefix = keys.members();
    let mut nodes = Vec::new();
    for kv in members {
        let Some(node) = kv.key.get(prefix.len()..).map(text) else { continue };
        let url = text(&kv.value);
        let info = infos.get(&node).cloned();
        let health = tokio::task::spawn_blocking({
            let url = url.clone();
            move || get_json(&url, "/health", Duration::from_secs(2))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        nodes.push(node_json(&node, &url, info.as_ref(), health, leader.as_ref(), sync.as_deref()));
    }
    Ok(json!({
        "cluster": args.ha_cluster,
        "leader": leader.as_ref().map(|l| json!({"node": l.node, "epoch": l.epoch, "serving": l.serving})),
        "standby": sync,
        "version": cluster.map(|c| json!({"version": c.version(), "protocol": c.range.to_string()})),
        "nodes": nodes,
    }))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One node's line of the status.
fn node_json(
    node: &str,
    url: &str,
    info: Option<&NodeInfo>,
    health: Result<Value, String>,
    leader: Option<&LeaderRecord>,
    sync: Option<&str>,
) -> Value {
    let (release, protocol) = match info {
        Some(i) => (i.release.clone(), i.range.to_string()),
        None => ("0.1.0 or earlier (publishes no release)".into(), "2".into()),
    };
    let mut v = json!({
        "node": node, "url": url, "release": release, "protocol": protocol,
        "commit": info.map(|i| i.commit.clone()),
        "standby": sync == Some(node),
    });
    match health {
        Ok(h) => {
            let ha = &h["ha"];
            let r = &ha["replication"];
            let role = ha["role"].as_str().unwrap_or("?");
            v["role"] = json!(role);
            v["epoch"] = ha["epoch"].clone();
            v["serving"] = ha["serving"].clone();
            let at = leader.map_or(0, |l| l.epoch);
            let caught_up =
                r["as_standby"]["caught_up"].as_bool() == Some(true) && r["as_standby"]["epoch"].as_u64() == Some(at);
            v["caught_up"] = if role == "leader" { Value::Null } else { json!(caught_up) };
            v["lag_records"] = if role == "leader" { r["lag_records"].clone() } else { Value::Null };
            v["lag_seconds"] = if role == "leader" { r["lag_seconds"].clone() } else { Value::Null };
            v["streaming_to"] = r["streaming_to"].clone();
            v["compatible"] = ha["versions"]["compatible"].clone();
            v["refusal"] = ha["versions"]["refusal"].clone();
        }
        Err(e) => v["error"] = json!(e),
    }
    v
}

async fn status(a: StatusArgs) -> Result<ExitCode, String> {
    let c = cluster(&a.etcd).await?;
    if a.json {
        println!("{c}");
    } else {
        print!("{}", status_text(&c));
    }
    Ok(ExitCode::SUCCESS)
}

/// `ctl status` as a table.
pub fn status_text(c: &Value) -> String {
    let s = |v: &Value| match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let mut out = format!(
        "cluster {}: leader {}, synchronous standby {}, cluster version {}\n",
        s(&c["cluster"]),
        c["leader"]["node"].as_str().map_or("none".into(), |n| format!("{n} (epoch {})", c["leader"]["epoch"])),
        s(&c["standby"]),
        c["version"]["version"].as_u64().map_or("unrecorded".into(), |v| format!(
            "{v} (protocol {})",
            c["version"]["protocol"].as_str().unwrap_or("?")
        )),
    );
    out += &format!(
        "{:<12} {:<10} {:>6} {:<10} {:<8} {:<9} {:>10} {:>9}  {}\n",
        "node", "role", "epoch", "release", "protocol", "caught_up", "lag_rec", "lag_s", "notes"
    );
    for n in c["nodes"].as_array().into_iter().flatten() {
        let mut notes = Vec::new();
        if n["standby"] == json!(true) {
            notes.push("synchronous standby".to_string());
        }
        if let Some(e) = n["error"].as_str() {
            notes.push(format!("/health: {e}"));
        }
        if let Some(r) = n["refusal"].as_str() {
            notes.push(format!("NOT JOINING: {r}"));
        }
        let release = n["release"].as_str().unwrap_or("?");
        out += &format!(
            "{:<12} {:<10} {:>6} {:<10} {:<8} {:<9} {:>10} {:>9}  {}\n",
            s(&n["node"]),
            s(&n["role"]),
            s(&n["epoch"]),
            release.split_whitespace().next().unwrap_or(release),
            s(&n["protocol"]),
            s(&n["caught_up"]),
            s(&n["lag_records"]),
            n["lag_seconds"].as_f64().map_or("-".into(), |l| format!("{l:.3}")),
            notes.join("; "),
        );
    }
    out
}

/// `GET path` on the node at `url` (`http://host:port`): the JSON body of
/// any status, or why not.
fn get_json(url: &str, path: &str, timeout: Duration) -> Result<Value, String> {
    let buf = health::get(url, path, timeout)?;
    let at = buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no HTTP answer")?;
    serde_json::from_slice(&buf[at + 4..]).map_err(|e| format!("not JSON: {e}"))
}

async fn switchover(a: SwitchoverArgs) -> Result<ExitCode, String> {
    let etcd = client(&a.etcd)?;
    let keys = a.etcd.keys();
    let done = |ok: bool, v: Value| {
        if a.json {
            println!("{v}");
        } else if ok {
            println!("{}", v["message"].as_str().unwrap_or_default());
        } else {
            eprintln!("hf3fs-meta ctl switchover: refused: {}", v["reason"].as_str().unwrap_or_default());
        }
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
    };
    let refuse = |why: String| done(false, json!({"switched_over": false, "reason": why}));
    let err = |err: etcd::Error| format!("etcd: {err}");
    let leader = etcd.get(&keys.leader()).await.map_err(err)?;
    let leader = leader.and_then(|kv| LeaderRecord::decode(&kv.value, kv.create_revision));
    if let (true, Some(me)) = (a.if_leader, &a.node_id) {
        if leader.as_ref().is_none_or(|l| l.node != *me) {
            let leads = leader.as_ref().map_or("no node", |l| l.node.as_str());
            return done(
                true,
                json!({"switched_over": false, "message": format!("{me} does not lead ({leads} does): nothing to hand over")}),
            );
        }
    }
    let Some(leader) = leader else {
        return refuse("there is no leader to hand over from".into());
    };
    if !leader.serving {
        return refuse(format!("the leader {} is not serving yet (becoming leader)", leader.node));
    }
    if etcd.get(&keys.node(&leader.node)).await.map_err(err)?.is_none() {
        return refuse(format!(
            "the leader {} runs a release without planned switchover (0.1.0 or earlier: it publishes no release); \
             hand over with SIGTERM instead (a planned hand-over to the synchronous standby, docs/runbook.md)",
            leader.node
        ));
    }
    let sync = etcd.get(&keys.sync()).await.map_err(err)?.map(|kv| text(&kv.value));
    match (&a.to, &sync) {
        (Some(to), _) if *to == leader.node => return refuse(format!("{to} is the leader already")),
        (Some(to), _) => {
            if etcd.get(&keys.member(to)).await.map_err(err)?.is_none() {
                return refuse(format!("{to} is not a live member of the cluster"));
            }
        }
        (None, Some(s)) if *s != leader.node => {}
        (None, _) => {
            return refuse(format!(
                "no standby is caught up: P/sync names {} (the leader streams to nobody in sync)",
                sync.as_deref().unwrap_or("nobody")
            ))
        }
    }
    let lease: LeaseId = etcd.grant(Duration::from_secs(a.timeout.max(10) + 10)).await.map_err(err)?;
    let id = format!("{}-{}", std::process::id(), super::node::now());
    let req = Request { id, epoch: leader.epoch, to: a.to.clone(), state: State::Asked, reason: String::new(), lease };
    let asked = Instant::now();
    etcd.put(&keys.switchover(), &req.encode(), Some(lease)).await.map_err(err)?;
    let deadline = asked + Duration::from_secs(a.timeout);
    let outcome = loop {
        let now = etcd.get(&keys.switchover()).await.map_err(err)?.and_then(|kv| Request::decode(&kv.value));
        if let Some(r) = now.filter(|r| r.id == req.id && r.state == State::Refused) {
            break Err(r.reason);
        }
        let l = etcd.get(&keys.leader()).await.map_err(err)?;
        if let Some(l) = l.and_then(|kv| LeaderRecord::decode(&kv.value, kv.create_revision)) {
            if l.node != leader.node && l.serving {
                break Ok(l);
            }
        }
        if Instant::now() >= deadline {
            break Err(format!("no other node served within {} s", a.timeout));
        }
        // A poll of etcd, bounded by the deadline.
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let _ = etcd.revoke(lease).await;
    match outcome {
        Ok(l) => {
            let ms = asked.elapsed().as_secs_f64() * 1e3;
            let message = format!(
                "switched over: {} (epoch {}) -> {} (epoch {}), serving {ms:.0} ms after the request",
                leader.node, leader.epoch, l.node, l.epoch
            );
            done(
                true,
                json!({"switched_over": true, "from": leader.node, "to": l.node, "epoch": l.epoch, "ms": ms, "message": message}),
            )
        }
        Err(why) => refuse(why),
    }
}
