//! The etcd JSON-gateway client (`hf3fs_meta::ha::etcd`) against real etcd:
//! leases, transactions on create revisions, watches, endpoint failover.

use super::etcd::{available, Etcd};
use hf3fs_meta::ha::etcd::{Compare, Error, EtcdClient, EtcdOptions, Txn, TxnOp, WatchEvent};
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
}

fn client(endpoints: &str) -> EtcdClient {
    let eps: Vec<String> = endpoints.split(',').map(str::to_string).collect();
    EtcdClient::new(&eps, EtcdOptions { timeout: Duration::from_secs(2), ..EtcdOptions::default() }).expect("a client")
}

#[test]
fn leases_transactions_and_watches() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let c = client(&etcd.endpoints());
    runtime().block_on(async {
        let lease = c.grant(Duration::from_secs(5)).await.unwrap();
        assert!(c.keepalive(lease).await.unwrap().is_some_and(|ttl| ttl > 0 && ttl <= 5));
        let key = b"/t/leader".to_vec();
        let mut watch = c.watch(&key, false, 0).await.unwrap();
        // Create-if-absent: the first wins and reads its create revision back.
        let take = |value: &[u8]| Txn {
            compare: vec![Compare::Created { key: key.clone(), revision: 0 }],
            success: vec![
                TxnOp::Put { key: key.clone(), value: value.to_vec(), lease: Some(lease) },
                TxnOp::Get(key.clone()),
            ],
            failure: vec![TxnOp::Get(key.clone())],
        };
        let won = c.txn(&take(b"a")).await.unwrap();
        assert!(won.succeeded);
        let kv = won.gets[0].clone().expect("the key read back");
        assert_eq!((kv.value.as_slice(), kv.lease, kv.create_revision), (&b"a"[..], lease, won.revision));
        let lost = c.txn(&take(b"b")).await.unwrap();
        assert!(!lost.succeeded);
        assert_eq!(lost.gets[0].as_ref().map(|k| k.value.clone()), Some(b"a".to_vec()), "the failure branch ran");
        // A write guarded by the create revision (the epoch).
        let guarded = |rev| Txn {
            compare: vec![Compare::Created { key: key.clone(), revision: rev }],
            success: vec![TxnOp::Put { key: b"/t/sync".to_vec(), value: b"b".to_vec(), lease: None }],
            failure: vec![],
        };
        assert!(c.txn(&guarded(kv.create_revision)).await.unwrap().succeeded);
        assert!(!c.txn(&guarded(kv.create_revision - 1)).await.unwrap().succeeded);
        let value_is = |v: &[u8]| Txn {
            compare: vec![Compare::Value { key: b"/t/sync".to_vec(), value: v.to_vec() }],
            ..Txn::default()
        };
        assert!(c.txn(&value_is(b"b")).await.unwrap().succeeded);
        assert!(!c.txn(&value_is(b"c")).await.unwrap().succeeded);
        // The watch saw the creation; revoking the lease deletes the key.
        let (_, events) = watch.next().await.unwrap().unwrap();
        assert!(matches!(&events[0], WatchEvent::Put(k) if k.value == b"a"));
        c.revoke(lease).await.unwrap();
        let (_, events) = watch.next().await.unwrap().unwrap();
        assert!(matches!(&events[0], WatchEvent::Delete { key: k, .. } if *k == key));
        assert_eq!(c.get(&key).await.unwrap(), None);
        assert_eq!(c.keepalive(lease).await.unwrap(), None, "a revoked lease is gone");
        c.revoke(lease).await.unwrap();
        // Prefix reads and puts.
        c.put(b"/t/members/x", b"u1", None).await.unwrap();
        c.put(b"/t/members/y", b"u2", None).await.unwrap();
        let m = c.get_prefix(b"/t/members/").await.unwrap();
        assert_eq!(m.iter().map(|k| k.value.clone()).collect::<Vec<_>>(), vec![b"u1".to_vec(), b"u2".to_vec()]);
        assert!(c.delete(b"/t/members/x").await.unwrap());
        // etcd's refusal is an error of its own, not a failover.
        let e = c.put(b"/t/k", b"v", Some(12345)).await.unwrap_err();
        assert!(matches!(e, Error::Refused { code: 5, .. }), "{e:?}");
    });
}

#[test]
fn calls_fail_over_to_the_next_endpoint() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    // A first endpoint where nothing listens.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let c = client(&format!("http://{dead},{}", etcd.endpoints()));
    runtime().block_on(async {
        c.put(b"/f/k", b"v", None).await.unwrap();
        assert_eq!(c.get(b"/f/k").await.unwrap().map(|kv| kv.value), Some(b"v".to_vec()));
        let _w = c.watch(b"/f/", true, 0).await.unwrap();
    });
    let nobody = client(&format!("http://{dead}"));
    let e = runtime().block_on(nobody.get(b"/f/k")).unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
}

#[test]
fn authenticates_with_etcd_credentials() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let eps = etcd.endpoints();
    // etcd-client's etcdctl turns etcd's authentication on.
    let etcdctl = |args: &[&str]| {
        let out = std::process::Command::new("etcdctl").arg(format!("--endpoints={eps}")).args(args).output();
        let out = out.expect("etcdctl (Debian's etcd-client) runs");
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    };
    etcdctl(&["user", "add", "root:root-password"]);
    etcdctl(&["auth", "enable"]);
    let with = |user: Option<&str>, password: &str| {
        let opts = EtcdOptions {
            timeout: Duration::from_secs(2),
            user: user.map(str::to_string),
            password: Some(password.to_string()),
            tls: None,
        };
        EtcdClient::new(std::slice::from_ref(&eps), opts).unwrap()
    };
    let rt = runtime();
    let good = with(Some("root"), "root-password");
    rt.block_on(good.put(b"/auth/k", b"v", None)).unwrap();
    assert_eq!(rt.block_on(good.get(b"/auth/k")).unwrap().map(|kv| kv.value), Some(b"v".to_vec()));
    let lease = rt.block_on(good.grant(Duration::from_secs(5))).unwrap();
    assert!(rt.block_on(good.keepalive(lease)).unwrap().is_some());
    let _w = rt.block_on(good.watch(b"/auth/", true, 0)).unwrap();
    let e = rt.block_on(with(None, "").put(b"/auth/k", b"w", None)).unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e:?}");
    let e = rt.block_on(with(Some("root"), "wrong").put(b"/auth/k", b"w", None)).unwrap_err();
    assert!(matches!(&e, Error::Refused { message, .. } if message.contains("authentication failed")), "{e:?}");
    assert_eq!(rt.block_on(good.get(b"/auth/k")).unwrap().map(|kv| kv.value), Some(b"v".to_vec()), "nothing changed");
}
