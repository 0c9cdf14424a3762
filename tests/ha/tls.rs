//! TLS on every hop, against real etcd that serves clients over TLS only
//! and demands a client certificate (`--client-cert-auth`), with every
//! certificate made at test time ([`testkit::pki`]): the etcd client
//! and its refusals, a replicated cluster whose ports, replication stream
//! and relay all use mutual TLS, the refusals of the TLS port counted by
//! reason, forged hellos (both forms: version 2's and version 3's) with the right
//! secret and an epoch or node etcd does not name, and certificates rotated
//! under load without a failed request.

use super::cluster::{Cluster, Nodes, PROBE};
use super::etcd::{self, client_of, Etcd, EtcdTls};
use super::http::{read_answer, HttpAnswer};
use hf3fs_meta::ha::replicate::wire::{Msg, Range, MIN_VERSION};
use hf3fs_meta::tls::{load, Identity, PemFile};
use serde_json::Value;
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;
use testkit::pki::{Leaf, Pki};
use testkit::process::ServerProcess;
use testkit::wait_for;
use testkit::{request_bytes, FAILSAFE};

/// One request over TLS to `addr` (verified as `name` against `ca`,
/// presenting `leaf` if given) on a new connection; `Err` says why the
/// connection or handshake failed.
pub fn tls_request(
    addr: &str,
    ca: &std::path::Path,
    leaf: Option<&Leaf>,
    name: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<HttpAnswer, String> {
    let id = leaf.map(|l| Identity { cert: PemFile::new("cert", &l.cert), key: PemFile::new("key", &l.key) });
    let cfg = load::client_config(&PemFile::new("ca", ca), id.as_ref())?;
    let name = rustls::pki_types::ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    let mut s = rustls::StreamOwned::new(conn, sock);
    s.write_all(&request_bytes(method, path, &[("Connection", "close")], body.as_bytes()))
        .map_err(|e| format!("sending: {e}"))?;
    // A refused client certificate shows on the first read (TLS 1.3).
    let mut probe = [0u8; 0];
    let _ = std::io::Read::read(&mut s, &mut probe);
    read_answer(&mut s).ok_or_else(|| match s.conn.process_new_packets() {
        Err(e) => e.to_string(),
        Ok(_) => "no answer".to_string(),
    })
}

/// The test CA and the certificates of every party.
struct Certs {
    pki: Pki,
    /// etcd's (127.0.0.1 only: `localhost` is a wrong name for it).
    etcd_server: Leaf,
    /// The nodes' (server and client: the port, the replication stream).
    node: Leaf,
    /// The client certificate of the nodes and relays for etcd.
    etcd_client: Leaf,
    /// The relays'.
    relay: Leaf,
    /// An operator's client certificate (the tests' probes).
    operator: Leaf,
}

impl Certs {
    fn new() -> Certs {
        let pki = Pki::new("cluster-ca");
        Certs {
            etcd_server: pki.leaf("etcd", &["127.0.0.1"]),
            node: pki.leaf("node", &["127.0.0.1", "localhost"]),
            etcd_client: pki.leaf("etcd-client", &["hf3fs-meta"]),
            relay: pki.leaf("relay", &["relay"]),
            operator: pki.leaf("operator", &["operator"]),
            pki,
        }
    }

    fn etcd(&self) -> EtcdTls<'_> {
        EtcdTls { pki: &self.pki, server: self.etcd_server.clone(), client: self.etcd_client.clone() }
    }

    /// The flags of a node whose port and stream speak mutual TLS.
    fn node_flags(&self) -> Vec<String> {
        let mut f = self.node.flags("tls");
        f.extend(["--tls-client-ca".to_string(), self.pki.ca().display().to_string()]);
        f
    }

    /// A request to node `p` with the operator's certificate.
    fn get(&self, p: &ServerProcess, path: &str) -> Option<HttpAnswer> {
        tls_request(&p.addr.to_string(), &self.pki.ca(), Some(&self.operator), "127.0.0.1", "GET", path, "").ok()
    }

    /// The `ha` object of `p`'s `/health`.
    fn ha(&self, p: &ServerProcess) -> Option<Value> {
        self.get(p, "/health").filter(|a| a.status == 200).map(|a| a.json()["ha"].clone())
    }

    /// (leader index, epoch, standby index) once one node leads and names
    /// the other its standby (named only once it is in sync).
    fn leader_and_standby(&self, nodes: &Nodes<'_>) -> (usize, u64, usize) {
        wait_for("a TLS leader with an in-sync standby", || {
            (0..nodes.ids.len()).find_map(|i| {
                let h = self.ha(nodes.get(i))?;
                let serving = h["role"] == "leader" && h["serving"] == true;
                let s = nodes.ids.iter().position(|id| Some(*id) == h["standby"].as_str())?;
                serving.then(|| (i, h["epoch"].as_u64().unwrap_or(0), s))
            })
        })
    }
}

/// A counter's value in a Prometheus text (0 when absent).
fn metric(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn etcd_serves_only_tls_with_client_certificates_and_every_wrong_client_fails_clearly() {
    let _s = super::serial();
    if !etcd::available() {
        return;
    }
    let certs = Certs::new();
    let etcd = Etcd::start_tls(1, &certs.etcd());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // The right CA and a client certificate: reads, writes, watches.
    let c = etcd.client();
    rt.block_on(async {
        let mut w = c.watch(b"/tls/k", false, 0).await.expect("a watch over TLS");
        c.put(b"/tls/k", b"v", None).await.expect("a put over TLS");
        assert_eq!(c.get(b"/tls/k").await.unwrap().unwrap().value, b"v");
        let (_, events) = w.next().await.unwrap().unwrap();
        assert_eq!(events.len(), 1);
    });
    let endpoints = etcd.endpoints();
    let port = endpoints.rsplit(':').next().unwrap().to_string();
    let ca = certs.pki.ca().display().to_string();
    let fails = |endpoints: &str, flags: Vec<String>| -> String {
        let c = client_of(endpoints, &flags).expect("a client");
        let e = rt.block_on(c.get(b"/tls/k")).expect_err("refused");
        e.to_string()
    };
    // Another CA: etcd's certificate is not trusted.
    let other = Pki::new("other-ca");
    let mut flags = vec!["--etcd-ca".into(), other.ca().display().to_string()];
    flags.extend(certs.etcd_client.flags("etcd"));
    let e = fails(&endpoints, flags);
    assert!(e.contains("UnknownIssuer") || e.contains("unknown issuer"), "{e}");
    // No client certificate: etcd refuses the handshake.
    let e = fails(&endpoints, vec!["--etcd-ca".into(), ca.clone()]);
    assert!(e.to_lowercase().contains("alert") || e.contains("Certificate"), "{e}");
    // A client certificate of another CA: refused too.
    let stranger = other.leaf("stranger", &["x"]);
    let mut flags = vec!["--etcd-ca".into(), ca.clone()];
    flags.extend(stranger.flags("etcd"));
    let e = fails(&endpoints, flags);
    assert!(e.to_lowercase().contains("alert") || e.contains("certificate"), "{e}");
    // A name etcd's certificate does not carry: refused by this side.
    let mut flags = vec!["--etcd-ca".into(), ca.clone()];
    flags.extend(certs.etcd_client.flags("etcd"));
    let e = fails(&format!("https://localhost:{port}"), flags.clone());
    assert!(e.contains("NotValidForName") || e.contains("not valid for name"), "{e}");
    // Plain HTTP to the TLS port gets no answer.
    let e = fails(&format!("http://127.0.0.1:{port}"), vec![]);
    assert!(e.contains("no etcd endpoint answered"), "{e}");
    // https:// without a CA is refused when the client is made.
    let e = client_of(&endpoints, &[]).expect_err("no CA");
    assert!(e.contains("--etcd-ca"), "{e}");
}

#[test]
fn the_server_refuses_a_plain_listener_off_loopback() {
    let certs = Certs::new();
    let mut args: Vec<String> = certs.node.flags("tls");
    args.extend(["--plain-listen".into(), "0.0.0.0:18099".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    testkit::process::refused_at_start_up(&args, &["--plain-listen", "loopback"], "a plain listener on 0.0.0.0");
}

#[test]
fn a_tls_cluster_serves_through_relays_and_refuses_what_it_cannot_trust() {
    let _s = super::serial();
    if !etcd::available() {
        return;
    }
    let certs = Certs::new();
    let cluster = Cluster::on(Etcd::start_tls(3, &certs.etcd())).with_https();
    let flags = certs.node_flags();
    let nodes =
        cluster.replicated_nodes(&["a", "b", "c"], "strict", &flags.iter().map(String::as_str).collect::<Vec<_>>());
    let (l, epoch, s) = certs.leader_and_standby(&nodes);
    let (leader, standby) = (nodes.get(l), nodes.get(s));
    let mut relay_flags = vec!["--tls-ca".to_string(), certs.pki.ca().display().to_string()];
    relay_flags.extend(certs.relay.flags("tls"));
    let relay = cluster.relay(None, &relay_flags.iter().map(String::as_str).collect::<Vec<_>>());

    // The engine's side: plain HTTP to the relay, mutual TLS beyond it; a
    // change is acknowledged once the standby has it.
    super::writes::init(&relay.addr, 64);
    let saved = super::writes::save(&relay.addr, &super::writes::keys(0, 8));
    super::writes::assert_kept(&relay.addr, &saved);
    let as_standby = |p| certs.ha(p).expect("the standby's health")["replication"]["as_standby"].clone();
    let before = as_standby(standby);

    // Clients the leader cannot trust read nothing and change nothing.
    let addr = leader.addr.to_string();
    let ca = certs.pki.ca();
    let refused = |leaf: Option<&Leaf>, ca: &std::path::Path, name: &str| {
        let r = tls_request(&addr, ca, leaf, name, "POST", "/clear", "");
        assert!(r.is_err(), "answered: {r:?}");
        r.unwrap_err()
    };
    let e = refused(None, &ca, "127.0.0.1");
    assert!(e.to_lowercase().contains("alert") || e.contains("Certificate"), "no client certificate: {e}");
    let other = Pki::new("other-ca");
    refused(Some(&other.leaf("stranger", &["x"])), &ca, "127.0.0.1");
    refused(Some(&certs.pki.leaf_valid("expired", &["operator"], -30, -1)), &ca, "127.0.0.1");
    // The operator, checking the leader's name: a name it does not carry.
    let e = refused(Some(&certs.operator), &ca, "meta-0.example");
    assert!(e.contains("NotValidForName") || e.contains("not valid for name"), "{e}");
    // A plain client on the TLS port: a plain 400 saying so.
    let plain =
        super::http::request_within(&addr, "POST", PROBE.0, PROBE.1, Duration::from_secs(5)).expect("an answer");
    assert_eq!(plain.status, 400, "{plain:?}");
    assert!(plain.body.contains("TLS"), "{plain:?}");
    super::writes::assert_kept(&relay.addr, &saved);
    let m = certs.get(leader, "/metrics").unwrap().body;
    for reason in ["missing_client_certificate", "unknown_ca", "expired_certificate", "plain_on_tls_port"] {
        let series = format!("hf3fs_meta_tls_handshake_failures_total{{reason=\"{reason}\"}}");
        assert!(metric(&m, &series) >= 1, "{series} not counted:\n{m}");
    }
    assert!(metric(&m, "hf3fs_meta_tls_certificate_expiry_seconds{role=\"server\"}") > 1_700_000_000, "{m}");

    // A forged hello: a stolen node certificate and the right secret, an
    // epoch etcd does not name. Refused, counted, and nothing changes.
    let key = format!("{}/replication/{}", cluster.prefix, nodes.ids[s]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let repl = rt.block_on(cluster.etcd.client().get(key.as_bytes())).unwrap().expect("the standby's address");
    let repl = String::from_utf8(repl.value).unwrap();
    let id = Identity { cert: PemFile::new("c", &certs.node.cert), key: PemFile::new("k", &certs.node.key) };
    let cfg = Arc::new(load::client_config(&PemFile::new("ca", &ca), Some(&id)).unwrap());
    let secret = std::fs::read_to_string(cluster.token_file()).unwrap().trim().as_bytes().to_vec();
    // Both forms of the hello (version 2's one version, version 3's
    // range) are held to the same rule.
    let forgeries = [(1_000_000_000_000_000_000u64, nodes.ids[l]), (epoch, "mallory")];
    let hellos = forgeries.iter().flat_map(|&(forged_epoch, who)| {
        let (store, token) = (hf3fs_meta::core::Dialect::Vllm, secret.clone());
        [
            Msg::Hello { version: MIN_VERSION, store, token: token.clone(), epoch: forged_epoch, leader: who.into() },
            Msg::HelloRange {
                range: Range::THIS,
                store,
                token,
                epoch: forged_epoch,
                release: hf3fs_meta::release::VERSION.into(),
                leader: who.into(),
                tenant: None,
            },
        ]
    });
    for hello in hellos.collect::<Vec<_>>() {
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let sock = TcpStream::connect(&repl).unwrap();
        sock.set_read_timeout(Some(FAILSAFE)).unwrap();
        let mut s = rustls::StreamOwned::new(rustls::ClientConnection::new(cfg.clone(), name).unwrap(), sock);
        hello.write_to(&mut s).unwrap();
        s.flush().unwrap();
        match Msg::read_from(&mut s).expect("an answer to the hello") {
            Msg::Reject(why) => assert!(why.contains("etcd names"), "{hello:?}: {why}"),
            m => panic!("a forged hello was answered {m:?}"),
        }
        // Nothing follows a refusal.
        assert!(Msg::read_from(&mut s).is_err());
    }
    let after = as_standby(standby);
    assert_eq!(after["refused"]["not_leader"], before["refused"]["not_leader"].as_u64().unwrap() + 4, "{after}");
    assert_eq!(after["epoch"], before["epoch"], "{after}");
    assert_eq!(after["caught_up"], true, "{after}");
    // The real leader's stream goes on: a change is still acknowledged.
    let more = super::writes::save(&relay.addr, &super::writes::keys(100, 4));
    super::writes::assert_kept(&relay.addr, &more);
    super::writes::assert_kept(&relay.addr, &saved);
}

#[test]
fn certificates_rotate_under_load_without_a_restart_or_a_failed_request() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let certs = Certs::new();
    let first = certs.pki.leaf_valid("rotating", &["127.0.0.1"], -1, 100);
    let mut args = first.flags("tls");
    let plain = testkit::free_addr_for_child().to_string();
    args.extend(["--tls-client-ca".to_string(), certs.pki.ca().display().to_string()]);
    args.extend(["--plain-listen".to_string(), plain.clone()]);
    let mut p = ServerProcess::serve(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // The loopback plain listener answers plain HTTP, and refuses a TLS
    // client (counted) before reading anything.
    let a = super::http::request_within(&plain, "POST", PROBE.0, PROBE.1, Duration::from_secs(5)).expect("plain");
    assert_eq!(a.status, 200, "{a:?}");
    let e = tls_request(&plain, &certs.pki.ca(), Some(&certs.operator), "127.0.0.1", "POST", PROBE.0, PROBE.1);
    assert!(e.is_err(), "TLS on the plain listener was answered: {e:?}");
    let tls = |p: &ServerProcess| certs.get(p, "/health").map(|a| a.json()["tls"]["server"].clone());
    let e1 = tls(&p).expect("health")["expires"].as_i64().expect("an expiry");

    // A light load: one client, a new TLS connection per request.
    let (stop, ok, failed) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = {
        let (stop, ok, failed, failures) = (stop.clone(), ok.clone(), failed.clone(), failures.clone());
        let (addr, ca, leaf) = (p.addr.to_string(), certs.pki.ca(), certs.operator.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match tls_request(&addr, &ca, Some(&leaf), "127.0.0.1", "POST", PROBE.0, PROBE.1) {
                    Ok(a) if a.status == 200 => drop(ok.fetch_add(1, Ordering::Relaxed)),
                    other => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.lock().unwrap().push(format!("{other:?}"));
                    }
                }
            }
        })
    };
    let more = |n: u64| {
        let at = ok.load(Ordering::Relaxed);
        wait_for("requests answered", || (ok.load(Ordering::Relaxed) >= at + n).then_some(()));
    };
    more(5);

    // New files (renamed into place), SIGHUP: new connections get them.
    certs.pki.leaf_valid("rotating", &["127.0.0.1"], -1, 200);
    p.signal("HUP");
    let e2 = wait_for("the new certificate in use", || tls(&p)?["expires"].as_i64().filter(|&e| e > e1));
    assert!(e2 - e1 >= 99 * 86_400, "{e1} -> {e2}");
    more(5);

    // A certificate that cannot be used: the previous one stays, and
    // /health and the log say why.
    std::fs::write(&first.cert, "not a certificate\n").unwrap();
    p.signal("HUP");
    let why = wait_for("the load error in /health", || tls(&p)?["error"].as_str().map(str::to_string));
    assert!(why.contains("--tls-cert") && why.contains("no PEM certificate"), "{why}");
    assert_eq!(tls(&p).unwrap()["expires"].as_i64(), Some(e2));
    more(5);
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "failed requests: {:?}", failures.lock().unwrap());
    let m = certs.get(&p, "/metrics").unwrap().body;
    // At least: the periodic check may have seen the files change first.
    assert!(metric(&m, "hf3fs_meta_tls_reloads_total{role=\"server\",result=\"ok\"}") >= 1, "{m}");
    assert!(metric(&m, "hf3fs_meta_tls_reloads_total{role=\"server\",result=\"failed\"}") >= 1, "{m}");
    assert_eq!(metric(&m, "hf3fs_meta_tls_certificate_load_error{role=\"server\"}"), 1, "{m}");
    assert!(p.saw_line(|l| l.contains("keeping the previous ones")));
    assert!(metric(&m, "hf3fs_meta_tls_handshake_failures_total{reason=\"tls_on_plain_port\"}") >= 1, "{m}");
}

/// Certificates rotate in a whole TLS cluster under the load of a saver and
/// a reader through the relay: new files for the three nodes (their port,
/// the replication listener, the stream's client certificate) and for the
/// relay, SIGHUP, and every process uses them for new connections. No
/// process restarts, not one request fails, nothing acknowledged is lost.
#[test]
fn certificates_rotate_in_a_cluster_under_load_without_a_restart_or_a_failed_request() {
    use super::under_load::Load;
    let _s = super::serial();
    if !etcd::available() {
        return;
    }
    let certs = Certs::new();
    let cluster = Cluster::on(Etcd::start_tls(1, &certs.etcd())).with_https();
    let flags = certs.node_flags();
    let nodes =
        cluster.replicated_nodes(&["a", "b", "c"], "strict", &flags.iter().map(String::as_str).collect::<Vec<_>>());
    let (l, _, _) = certs.leader_and_standby(&nodes);
    let mut relay_flags = vec!["--tls-ca".to_string(), certs.pki.ca().display().to_string()];
    relay_flags.extend(certs.relay.flags("tls"));
    let relay = cluster.relay(None, &relay_flags.iter().map(String::as_str).collect::<Vec<_>>());
    let init = serde_json::json!({"num_pages": 1 << 16, "role": "worker"});
    assert_eq!(super::writes::call(&relay.addr, "/rank/0/initialize", &init).map(|r| r.0), Some(200));

    let tls = |i: usize| certs.get(nodes.get(i), "/health").map(|a| a.json()["tls"].clone());
    let old = tls(l).expect("the leader's health")["server"]["expires"].as_i64().expect("an expiry");
    // Every role of a node but its etcd client uses the node certificate.
    let rotated = |t: &Value, newer_than: i64| {
        let roles = t.as_object()?;
        let node_roles: Vec<_> = roles.iter().filter(|(role, _)| role.as_str() != "etcd").collect();
        let all = node_roles.iter().all(|(_, r)| r["expires"].as_i64().is_some_and(|e| e > newer_than));
        (node_roles.len() >= 3 && all).then_some(())
    };
    assert!(rotated(&tls(l).unwrap(), old - 1).is_some(), "the leader's roles: {}", tls(l).unwrap());

    let load = Load::start(&relay.addr);
    let log = load.log.clone();
    let acked = |n: usize| {
        let at = log.lock().unwrap().acked.len();
        wait_for("confirms acknowledged", || (log.lock().unwrap().acked.len() >= at + n).then_some(()));
    };
    acked(160);

    // New files, renamed into place (valid 400 days instead of 365), and
    // SIGHUP to every process; the periodic check also sees the change.
    certs.pki.leaf_valid("node", &["127.0.0.1", "localhost"], -1, 400);
    certs.pki.leaf_valid("relay", &["relay"], -1, 400);
    for i in 0..3 {
        nodes.get(i).signal("HUP");
    }
    relay.signal("HUP");
    for i in 0..3 {
        wait_for(&format!("node {} on the new certificate", nodes.ids[i]), || rotated(&tls(i)?, old + 30 * 86_400));
    }
    let line = relay
        .wait_line(|l| l.contains("certificates loaded again") && l.contains("relay"))
        .expect("the relay loads its new certificate");
    let expires: i64 = line
        .split("expires=Some(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no expiry in {line}"));
    assert!(expires > old + 30 * 86_400, "{line}");
    // New connections through the relay (one a request) shake hands with
    // the new certificates on both sides; the stream goes on acknowledging.
    acked(320);
    load.stop();

    let log = log.lock().unwrap();
    assert!(log.refused.is_empty(), "failed requests: {:?}", log.refused);
    assert!(log.wrong_reads.is_empty(), "wrong reads: {:?}", &log.wrong_reads[..log.wrong_reads.len().min(5)]);
    let acked: Vec<(String, i64)> = log.acked.iter().map(|(k, (p, _))| (k.clone(), *p)).collect();
    super::writes::assert_kept(&relay.addr, &acked);
    for i in 0..3 {
        let p = nodes.get(i);
        assert!(std::path::Path::new(&format!("/proc/{}", p.child.id())).exists(), "{} restarted", nodes.ids[i]);
        let m = certs.get(p, "/metrics").expect("metrics").body;
        assert!(metric(&m, "hf3fs_meta_tls_reloads_total{role=\"server\",result=\"ok\"}") >= 1, "{m}");
    }
    let l2 = certs.leader_and_standby(&nodes).0;
    assert_eq!(l2, l, "the leader did not change");
}
